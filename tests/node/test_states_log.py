"""The partition state table on disk: a snapshot (states.json) plus a change log
(states.log). A change is one appended frame; torn tails are ignored and cut, damage
before the end is refused by name; the log is compacted into a new snapshot; an old
states.json (rewritten whole on every change) is read as a snapshot; a full disk
leaves the table as it was; a power cut keeps every acknowledged change."""
from __future__ import annotations

import errno
import json
import os
import random
import threading
import time
from typing import Callable

import pytest

from faults import fileio
from faults.fileio import OutOfDiskError
from faults.powerloss import PowerLossLayer
from node import State, StateTable
from node.errors import DataDirError
from node.statelog import HEADER, encode
from node.states import LOG, MIN_COMPACT, SNAPSHOT, read_states


class _Counting(fileio.FileLayer):
    """Real I/O without the fsyncs (the test measures the work, not the disk), counting
    bytes written, data syncs and snapshot renames."""

    def __init__(self) -> None:
        self.bytes = self.syncs = self.renames = 0

    def write(self, fd: int, data: bytes | memoryview) -> int:
        n = os.write(fd, data)
        self.bytes += n
        return n

    def fsync(self, fd: int) -> None:
        self.syncs += 1

    def fdatasync(self, fd: int) -> None:
        self.syncs += 1

    def fsync_dir(self, path: str) -> None:
        pass

    def replace(self, src: str, dst: str) -> None:
        self.renames += 1
        os.replace(src, dst)


def _log(d) -> str:
    return os.path.join(str(d), LOG)


def _five_changes(d) -> StateTable:
    """A table whose log holds frames after the first snapshot: p0..p4 OWNING, one
    frame each (the last frame: partition 4)."""
    t = StateTable(str(d))
    for p in range(5):
        t.set("c", p, State.OWNING)
    assert os.path.getsize(_log(d)) > 0
    return t


# -- migration -------------------------------------------------------------------------
def test_a_states_json_rewritten_whole_is_read_as_a_snapshot(tmp_path) -> None:
    old = {"caches": {"c": {"1": "OWNING", "2": "RENTING"}, "d": {"7": "MOVING"}}}
    (tmp_path / SNAPSHOT).write_text(json.dumps(old, sort_keys=True))
    t = StateTable(str(tmp_path))
    assert dict(t.items()) == {("c", 1): State.OWNING, ("c", 2): State.RENTING,
                               ("d", 7): State.MOVING}
    t.set("c", 2, State.EVICTED)
    assert json.loads((tmp_path / SNAPSHOT).read_text()) == old     # the change went to the log
    again = StateTable(str(tmp_path))
    assert again.get("c", 2) == State.EVICTED and again.get("d", 7) == State.MOVING
    assert read_states(str(tmp_path)) == {"c": {"1": "OWNING", "2": "EVICTED"},
                                          "d": {"7": "MOVING"}}


def test_the_first_change_of_a_new_table_writes_the_snapshot(tmp_path) -> None:
    t = StateTable(str(tmp_path))
    assert not os.path.exists(tmp_path / SNAPSHOT)        # opening writes nothing
    t.set("c", 3, State.MOVING)
    assert json.loads((tmp_path / SNAPSHOT).read_text()) == {"caches": {"c": {"3": "MOVING"}}}


# -- torn tails and damage ---------------------------------------------------------------
def _cut(n: int) -> Callable[[bytes], bytes]:
    return lambda b: b[:-n]


def _flip_last_body_byte(b: bytes) -> bytes:
    return b[:-1] + bytes([b[-1] ^ 0x01])


TORN = [
    ("header cut short", lambda b: b[:_last_frame(b) + 3]),
    ("body cut short", _cut(1)),
    ("body half there", lambda b: b[:(_last_frame(b) + len(b)) // 2 + HEADER.size // 2]),
    ("last frame's body damaged", _flip_last_body_byte),
    ("zeros where the last frame was", lambda b: b[:_last_frame(b)] + bytes(len(b) - _last_frame(b))),
    ("zeros after the last frame", lambda b: b + bytes(4096)),
    ("a zero header after the last frame", lambda b: b + bytes(HEADER.size)),
]


def _last_frame(b: bytes) -> int:
    off = 0
    while True:
        n = HEADER.unpack_from(b, off)[0]
        if off + HEADER.size + n >= len(b):
            return off
        off += HEADER.size + n


@pytest.mark.parametrize("name,corrupt", TORN, ids=[t[0] for t in TORN])
def test_a_torn_tail_is_ignored_then_cut_by_the_next_append(tmp_path, name, corrupt) -> None:
    _five_changes(tmp_path)
    raw = open(_log(tmp_path), "rb").read()
    lost_last = name != "zeros after the last frame" and name != "a zero header after the last frame"
    with open(_log(tmp_path), "wb") as f:
        f.write(corrupt(raw))
    assert read_states(str(tmp_path))["c"].get("4") == (None if lost_last else "OWNING")
    t = StateTable(str(tmp_path))
    assert t.get("c", 3) == State.OWNING
    assert t.get("c", 4) == (None if lost_last else State.OWNING)
    t.set("c", 9, State.MOVING)                # lands after the last whole frame
    again = StateTable(str(tmp_path))
    assert again.get("c", 9) == State.MOVING and again.get("c", 3) == State.OWNING
    assert again.get("c", 4) == (None if lost_last else State.OWNING)
    # nothing of the torn tail is left: the log is whole frames only
    assert read_states(str(tmp_path)) == {"c": {k: v for k, v in
                                                {**{str(p): "OWNING" for p in range(5)},
                                                 "9": "MOVING"}.items()
                                                if k != "4" or not lost_last}}


DAMAGED = [
    ("checksum of the first frame", lambda b: b[:HEADER.size] + bytes([b[HEADER.size] ^ 0x20])
     + b[HEADER.size + 1:], 0),
    ("length of the first frame zeroed", lambda b: bytes(4) + b[4:], 0),
    ("a frame that checks but is not a change list",
     lambda b: _frame(b'{"x": 1}') + b, 0),
    ("a frame naming an unknown state", lambda b: b + _frame(b'[["c",1,"BOGUS"]]') + b, None),
]


def _frame(body: bytes) -> bytes:
    import zlib
    return HEADER.pack(len(body), zlib.crc32(body)) + body


@pytest.mark.parametrize("name,corrupt,offset", DAMAGED, ids=[d[0] for d in DAMAGED])
def test_damage_before_the_end_is_refused_naming_file_and_offset(tmp_path, name, corrupt,
                                                                 offset) -> None:
    _five_changes(tmp_path)
    raw = open(_log(tmp_path), "rb").read()
    with open(_log(tmp_path), "wb") as f:
        f.write(corrupt(raw))
    want = len(raw) if offset is None else offset
    with pytest.raises(DataDirError, match=rf"{LOG}: offset {want}: .*restore it or wipe"):
        StateTable(str(tmp_path))
    with pytest.raises(DataDirError):
        read_states(str(tmp_path))


def test_a_fifo_in_place_of_the_log_is_refused(tmp_path) -> None:
    os.mkfifo(_log(tmp_path))
    with pytest.raises(DataDirError, match="not a regular file"):
        StateTable(str(tmp_path))


# -- compaction ---------------------------------------------------------------------------
def test_the_log_is_compacted_once_past_the_snapshot_and_a_crash_in_between_is_harmless(
        tmp_path) -> None:
    n = 6000                                    # a snapshot of about 100 KiB > MIN_COMPACT
    t = StateTable(str(tmp_path))
    t.set_many([("c", p, State.OWNING) for p in range(n)])
    snap = os.path.getsize(tmp_path / SNAPSHOT)
    assert snap > MIN_COMPACT and os.path.getsize(_log(tmp_path)) == 0
    layer = _Counting()
    with fileio.use(layer):
        for p in range(n):
            t.set("c", p, State.RENTING)
            if layer.renames:
                break
        else:
            pytest.fail("never compacted")
    # compacted at the change that took the log past the snapshot's size, not before
    assert p * len(encode([("c", 5000, "RENTING")])) >= snap * 0.9
    assert os.path.getsize(_log(tmp_path)) == 0
    assert read_states(str(tmp_path)) == json.loads((tmp_path / SNAPSHOT).read_text())["caches"]

    class _NoTruncate(_Counting):
        """The crash between the new snapshot's rename and the log's truncation."""
        def ftruncate(self, fd: int, size: int) -> None:
            raise OSError(errno.EIO, "Input/output error")

    t.set("c", 0, State.EVICTED)                # in the log, and changed again below
    t.set("c", 0, State.MOVING)
    layer = _NoTruncate()
    with fileio.use(layer):
        for q in range(1, n):
            t.set("c", q, State.EVICTED if t.get("c", q) == State.RENTING else State.RENTING)
            if layer.renames:
                break
        else:
            pytest.fail("never compacted")
    snapshot = json.loads((tmp_path / SNAPSHOT).read_text())["caches"]["c"]
    assert snapshot["0"] == "MOVING" and os.path.getsize(_log(tmp_path)) > 0
    # the log still holds frames the snapshot has: replaying them changes nothing
    again = StateTable(str(tmp_path))
    assert dict(again.items()) == dict(t.items())
    assert again.get("c", 0) == State.MOVING


def test_set_many_is_one_durable_write(tmp_path) -> None:
    t = StateTable(str(tmp_path))
    t.set("c", 0, State.OWNING)                 # the snapshot exists from here
    layer = _Counting()
    with fileio.use(layer):
        t.set_many([("c", p, State.MOVING) for p in range(1, 500)])
    assert layer.syncs == 1 and layer.renames == 0
    assert StateTable(str(tmp_path)).of_cache("c") == {0: State.OWNING,
                                                      **{p: State.MOVING for p in range(1, 500)}}


def test_100k_partitions_set_one_by_one_cost_o1_per_change(tmp_path) -> None:
    """Rewriting the whole table per change made this ~2 MB and ~100 ms per change at
    100,000 partitions (bench/states_bench.py); a frame and a share of compaction now."""
    n = 100_000
    t = StateTable(str(tmp_path))
    layer = _Counting()
    t0 = time.process_time()
    with fileio.use(layer):
        for p in range(n):
            t.set("c", p, State.OWNING)
    cpu = time.process_time() - t0
    per_change = layer.bytes / n
    assert per_change < 200, per_change          # about 40 bytes of frame + compactions
    assert cpu < 60, cpu                         # ~10 us per change here; generous
    assert layer.renames < 40
    again = StateTable(str(tmp_path))
    assert len(again.of_cache("c")) == n and again.get("c", n - 1) == State.OWNING


# -- full disk --------------------------------------------------------------------------
class _DiskFills(fileio.FileLayer):
    """Writes succeed until ``room`` bytes are used up: the write that crosses it
    writes what fits and the next call fails with ENOSPC, as a real file system does."""

    def __init__(self, room: int) -> None:
        self.room = room

    def write(self, fd: int, data: bytes | memoryview) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = os.write(fd, bytes(data[:self.room]))
        self.room -= n
        return n


def test_a_frame_cut_by_a_full_disk_is_taken_back(tmp_path) -> None:
    t = _five_changes(tmp_path)
    size = os.path.getsize(_log(tmp_path))
    with fileio.use(_DiskFills(10)), pytest.raises(OutOfDiskError, match=LOG):
        t.set_many([("c", p, State.RENTING) for p in range(5)])
    assert os.path.getsize(_log(tmp_path)) == size           # half a frame: gone
    assert all(t.get("c", p) == State.OWNING for p in range(5))
    assert all(s == "OWNING" for s in read_states(str(tmp_path))["c"].values())
    t.set("c", 1, State.RENTING)                              # room again
    assert StateTable(str(tmp_path)).get("c", 1) == State.RENTING


def test_a_full_disk_during_compaction_loses_no_change(tmp_path) -> None:
    n = 6000
    t = StateTable(str(tmp_path))
    t.set_many([("c", p, State.OWNING) for p in range(n)])
    snap = (tmp_path / SNAPSHOT).read_bytes()

    class _NoRoomForSnapshots(fileio.FileLayer):
        def write(self, fd: int, data: bytes | memoryview) -> int:
            if len(data) > 1000:               # a snapshot, not a frame
                raise OSError(errno.ENOSPC, "No space left on device")
            return os.write(fd, data)
    with fileio.use(_NoRoomForSnapshots()):
        for p in range(n):                      # past the point of compaction
            t.set("c", p, State.RENTING)
    assert (tmp_path / SNAPSHOT).read_bytes() == snap        # the old one, whole
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    assert all(s == "RENTING" for s in read_states(str(tmp_path))["c"].values())
    t.set("c", 0, State.EVICTED)                # room again: compacted at the next try
    assert StateTable(str(tmp_path)).get("c", 0) == State.EVICTED


# -- power loss ---------------------------------------------------------------------------
class _Died(Exception):
    pass


class _DiesAtSync(PowerLossLayer):
    """The machine loses power at the ``at``-th data sync: that sync never happens, and
    nothing after it reaches the disk either (every later call fails)."""

    def __init__(self, at: int, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.at, self.dead = at, False

    def _alive(self) -> None:
        if self.dead:
            raise OSError(errno.EIO, "power is off")

    def fdatasync(self, fd: int) -> None:
        self._alive()
        self.at -= 1
        if self.at == 0:
            self.dead = True
            raise _Died()
        super().fdatasync(fd)

    fsync = fdatasync

    def write(self, fd: int, data) -> int:
        self._alive()
        return super().write(fd, data)

    def ftruncate(self, fd: int, size: int) -> None:
        self._alive()
        super().ftruncate(fd, size)

    def replace(self, src: str, dst: str) -> None:
        self._alive()
        super().replace(src, dst)


@pytest.mark.parametrize("seed", range(8))
def test_a_power_cut_keeps_every_acknowledged_change(tmp_path, seed: int) -> None:
    """Changes (and compactions) until the power goes at a random sync, some unsynced
    writes kept or not, from an empty data dir or from a states.json written before
    the log: the table read back holds every acknowledged change, and the one in
    flight either whole or not at all."""
    rng = random.Random(seed)
    d = str(tmp_path)
    n = 3000                                    # a snapshot of ~50 KiB: a few compactions
    layer = _DiesAtSync(rng.randrange(1, 4000), keep_unsynced=rng.random(), seed=seed)
    acked: dict = {}
    inflight = None
    cycle = [State.RENTING, State.OWNING]
    if seed % 2:                                # a states.json from before the log
        doc = {"caches": {"c": {str(p): "OWNING" for p in range(n)}}}
        (tmp_path / SNAPSHOT).write_text(json.dumps(doc))
        acked = {("c", p): State.OWNING for p in range(n)}
    with fileio.use(layer):
        try:
            t = StateTable(d)
            if not acked:
                inflight = {("c", p): State.OWNING for p in range(n)}
                t.set_many([("c", p, State.OWNING) for p in range(n)])
                acked, inflight = inflight, None
            while True:
                p = rng.randrange(n)
                new = cycle[(cycle.index(acked[("c", p)]) + 1) % 2]
                inflight = {("c", p): new}
                t.set("c", p, new)
                acked[("c", p)] = new
                inflight = None
        except _Died:
            pass
        layer.cut()
    got = dict(StateTable(d).items())
    assert got == acked or (inflight is not None and got == {**acked, **inflight})


# -- group commit -------------------------------------------------------------------------
class _SlowSync(fileio.FileLayer):
    """Real I/O whose data syncs take 5 ms, counted: concurrent changes can share one."""

    def __init__(self) -> None:
        self.syncs = 0

    def fdatasync(self, fd: int) -> None:
        self.syncs += 1
        time.sleep(0.005)
        super().fdatasync(fd)


def test_concurrent_changes_share_fsyncs_and_each_is_durable_on_return(tmp_path) -> None:
    """8 threads changing their own partitions at once: each change is on disk (read
    back by a fresh reader) when its ``set`` returns, the changes of one partition
    stay in their order, and the threads share data syncs instead of one per change."""
    d = str(tmp_path)
    t = StateTable(d)
    t.set_many([("c", p, State.OWNING) for p in range(8)])
    layer = _SlowSync()
    missing: list[str] = []
    cycle = [State.RENTING, State.OWNING]
    rounds = 12

    def worker(p: int) -> None:
        for i in range(rounds):
            new = cycle[i % 2]
            t.set("c", p, new)
            if read_states(d)["c"][str(p)] != new.value:
                missing.append(f"{p}: {new.value} not on disk at return")
    with fileio.use(layer):
        threads = [threading.Thread(target=worker, args=(p,)) for p in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert missing == []
    assert layer.syncs < 8 * rounds * 3 // 4, layer.syncs      # shared: well under one each
    again = StateTable(d)
    assert all(again.get("c", p) == cycle[(rounds - 1) % 2] for p in range(8))


def test_a_failed_group_sync_refuses_every_change_it_covered(tmp_path) -> None:
    """The sync that fails takes back its frames: none of the changes it covered is in
    the table or on disk, each caller raises, and the next change works."""
    t = _five_changes(tmp_path)
    size = os.path.getsize(_log(tmp_path))

    class _SyncFails(fileio.FileLayer):
        def fdatasync(self, fd: int) -> None:
            raise OSError(errno.EIO, "I/O error")
    with fileio.use(_SyncFails()), pytest.raises(OSError, match="I/O error"):
        t.set("c", 2, State.RENTING)
    assert t.get("c", 2) == State.OWNING and os.path.getsize(_log(tmp_path)) == size
    assert read_states(str(tmp_path))["c"]["2"] == "OWNING"
    t.set("c", 2, State.RENTING)
    assert StateTable(str(tmp_path)).get("c", 2) == State.RENTING
