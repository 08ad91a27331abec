"""Undo images logged at a page's first change after a checkpoint cut (checkpoint/undo.py).

The torn-page mechanism: a checkpoint overwrites pages in place only after every one of
them has its undo image (its bytes at the previous cut) durable in the node WAL; those
images are logged by the writer that first changes the page after a cut.  Recovery
rolls back every IMAGES record after the last complete marker's ``images_from``
(earliest image per page), so each test checks, on a copy of the crashed store, that
the rollback alone gives the files of the last complete checkpoint byte for byte, and
then that the reopened store holds exactly the model of acknowledged updates."""
from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from checkpoint import PartitionStore, checkpointer, read_meta, verify
from checkpoint.records import decode_images
from checkpoint.recovery import pending_undo, rollback

sys.path.insert(0, os.path.dirname(__file__))
import first_change_child as child  # noqa: E402
from test_crash import _acked  # noqa: E402  (the SIGKILL tests' acknowledged-count file)

CHILD = os.path.join(os.path.dirname(__file__), "first_change_child.py")
PS = 1024


class _PowerCut(Exception):
    pass


def _open(path: str) -> PartitionStore:
    return PartitionStore.open(path, page_size=PS, memory_budget=32 << 20,
                               checkpoint_interval=None, wal_sync="none")


def _files(path: str) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(path)):
        if name.startswith("part-") and name.endswith(".bin"):
            with open(os.path.join(path, name), "rb") as f:
                out[name] = f.read()
    return out


def _pending(path: str):
    return [(lsn, decode_images(p)) for lsn, p in pending_undo(os.path.join(path, "wal"))]


def _assert_rollback_restores(store: str, ref: dict[str, bytes], scratch: str) -> None:
    """On a copy of ``store``: the pending undo images alone turn every partition file
    back into ``ref`` (the last complete checkpoint), byte for byte up to its page count."""
    shutil.copytree(store, scratch)
    rollback(scratch, pending_undo(os.path.join(scratch, "wal")), {})
    got = _files(scratch)
    assert set(ref) <= set(got)
    for name, data in ref.items():
        count = read_meta(os.path.join(scratch, name)).page_count
        assert count * PS == len(data), name
        assert got[name][:len(data)] == data, f"{name} differs from the last checkpoint"
    shutil.rmtree(scratch)


def _tear(path: str, index: int, rnd: random.Random) -> None:
    with open(path, "r+b") as f:
        f.seek(index * PS + PS // 2)
        f.write(rnd.randbytes(PS // 2))


def _tear_everything(store: str, ref: dict[str, bytes], pending, seed: int) -> int:
    """Tear every page a torn checkpoint may have touched: each page with a pending image
    or listed FREE, and each page past the last checkpoint's page count."""
    rnd = random.Random(seed)
    torn = 0
    for name, data in ref.items():
        pid = int(name[5:-4])
        path = os.path.join(store, name)
        pages = {i for _l, im in pending if im.partition == pid for i, _b in im.pages}
        pages |= {i for _l, im in pending if im.partition == pid for i in im.free}
        pages |= set(range(len(data) // PS, os.path.getsize(path) // PS))
        for index in sorted(pages):
            _tear(path, index, rnd)
        torn += len(pages)
    return torn


class _Model:
    def __init__(self, s: PartitionStore) -> None:
        self.s, self.state = s, {}

    def put(self, p: int, k: bytes, v: bytes | None) -> None:
        if v is None:
            self.s.remove(p, k)
            self.state.pop((p, k), None)
        else:
            self.s.put(p, k, v)
            self.state[(p, k)] = v

    def check(self, path: str) -> None:
        s = _open(path)
        try:
            got = {(p, k): v for p in s.partitions() for k, v in s.scan(p)}
            assert got == self.state
            for (p, k), v in list(self.state.items())[::7]:
                assert s.get(p, k) == v
        finally:
            s.close()
        for name in _files(path):
            assert verify(os.path.join(path, name)) == []


def _build(m: _Model) -> None:
    for i in range(90):
        m.put(i % 2, b"k%03d" % i, bytes([i]) * (2800 if i % 3 == 0 else 60 + i))
    m.s.checkpoint()
    for i in range(0, 90, 6):
        m.put(i % 2, b"k%03d" % i, b"small-%d" % i)        # frees chains: FREE pages
    m.s.checkpoint()


def _changes(m: _Model, tag: bytes, rnd: random.Random, n: int = 40) -> None:
    """Overwrites in place, removes, values moving to overflow chains (FREE pages
    reused, pages appended) and back (chains freed)."""
    for _ in range(n):
        i = rnd.randrange(100)
        r = rnd.random()
        v = None if r < 0.15 else tag * (2500 if r < 0.4 else rnd.randrange(5, 80))
        m.put(i % 2, b"k%03d" % i, v)


def test_sigkill_after_first_change_images_before_any_checkpoint(tmp_path, py_env) -> None:
    """Images logged by first changes, no checkpoint started: the rollback is a no-op
    on the bytes (every image equals the file) and recovery replays the updates."""
    store, ref_dir, ack = str(tmp_path / "s"), str(tmp_path / "ref"), str(tmp_path / "ack")
    for seed, acks in ((1, 40), (2, 400)):
        for d in (store, ref_dir):
            shutil.rmtree(d, ignore_errors=True)
        if os.path.exists(ack):
            os.unlink(ack)
        proc = subprocess.Popen([sys.executable, CHILD, store, ref_dir, ack, str(seed)],
                                env=py_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        t0 = time.monotonic()
        while _acked(ack) < acks and proc.poll() is None and time.monotonic() - t0 < 60:
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()
        acked = _acked(ack)
        pending = _pending(store)
        assert pending and all(i != 0 for _l, im in pending for i, _b in im.pages), \
            "first-change images (no meta image: no checkpoint started)"
        ref = _files(ref_dir)
        _assert_rollback_restores(store, ref, str(tmp_path / "copy"))
        s = _open(store)
        try:
            n = sum(s.counter(p) for p in s.partitions()) - child.LOAD
            assert acked <= n <= acked + 1, f"{n} ops in the store, {acked} acknowledged"
            assert {(p, k): v for p in s.partitions() for k, v in s.scan(p)} == \
                child.model(seed, n)
        finally:
            s.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_torn_checkpoint_while_updates_log_images(tmp_path, monkeypatch, seed) -> None:
    """Updates keep arriving while the checkpoint writes (first changes of pages in its
    cut - copied - and of pages outside it, FREE pages reused, appends), then the power
    fails mid-write and every page it may have touched is torn."""
    path = str(tmp_path / "s")
    rnd = random.Random(seed)
    m = _Model(_open(path))
    _build(m)
    ref = _files(path)
    _changes(m, b"a", rnd)

    def mid_write(name: str) -> None:
        if name == "checkpoint.mid_write":
            _changes(m, b"b", rnd)
            raise _PowerCut(name)
    monkeypatch.setattr(checkpointer, "crashpoint", mid_write)
    lsn_before = m.s.wal.last_lsn
    with pytest.raises(_PowerCut):
        m.s.checkpoint()
    m.s.close(checkpoint=False)
    monkeypatch.undo()
    pending = _pending(path)
    meta_lsns = [lsn for lsn, im in pending if any(i == 0 for i, _b in im.pages)]
    assert meta_lsns and min(meta_lsns) > lsn_before
    assert any(lsn > max(meta_lsns) for lsn, _im in pending), "images logged during the write"
    assert any(im.free for _l, im in pending), "a FREE page was reused (listed, not imaged)"
    _assert_rollback_restores(path, ref, str(tmp_path / "copy"))
    assert _tear_everything(path, ref, pending, seed) > 0
    m.check(path)


@pytest.mark.parametrize("seed", [4, 5])
def test_two_checkpoints_in_a_row_second_torn(tmp_path, monkeypatch, seed) -> None:
    """Checkpoint B completes while updates change pages during its write: their images
    lie between B's mark and B's marker.  Checkpoint C overwrites those pages and is
    torn: recovery must take those images too (not only the ones after B's marker)."""
    path = str(tmp_path / "s")
    rnd = random.Random(seed)
    m = _Model(_open(path))
    _build(m)
    _changes(m, b"a", rnd)

    def during_b(name: str) -> None:
        if name == "checkpoint.mid_write":
            _changes(m, b"b", rnd, 60)
    monkeypatch.setattr(checkpointer, "crashpoint", during_b)
    stats_b = m.s.checkpoint()
    marker_b = m.s.wal.last_lsn              # B's marker is its last record
    ref = _files(path)
    _changes(m, b"c", rnd, 10)

    def tear_c(name: str) -> None:
        if name == "checkpoint.mid_write":
            raise _PowerCut(name)
    monkeypatch.setattr(checkpointer, "crashpoint", tear_c)
    with pytest.raises(_PowerCut):
        m.s.checkpoint()
    m.s.close(checkpoint=False)
    monkeypatch.undo()
    pending = _pending(path)
    between = {(im.partition, i) for lsn, im in pending if stats_b.images_from < lsn < marker_b
               for i, _b in im.pages}
    after = {(im.partition, i) for lsn, im in pending if lsn > marker_b for i, _b in im.pages}
    assert between - after, "pages whose only undo image was logged during B's write"
    _assert_rollback_restores(path, ref, str(tmp_path / "copy"))
    _tear_everything(path, ref, pending, seed)
    m.check(path)


@pytest.mark.parametrize("keep,cut_at", [(0.0, 2), (0.5, 3), (1.0, 4)])
def test_power_loss_mid_checkpoint_with_updates_during_writes(tmp_path, py_env, keep,
                                                              cut_at) -> None:
    """A real child process on the power-loss file layer: every fsync is tracked, and at
    the cut the files keep only their durable bytes plus a random subset of unsynced
    writes (torn checkpoints at write granularity, WAL tail lost)."""
    store, ack = str(tmp_path / "s"), str(tmp_path / "ack")
    seed = int(keep * 10) + cut_at
    proc = subprocess.run([sys.executable, CHILD, store, str(tmp_path / "ref"), ack, str(seed),
                           "powerloss", str(keep), str(cut_at)],
                          env=py_env, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    acked = _acked(ack)
    assert acked > 0
    s = _open(store)
    try:
        n = sum(s.counter(p) for p in s.partitions()) - child.LOAD
        assert acked <= n <= acked + 1, f"{n} ops in the store, {acked} acknowledged"
        assert {(p, k): v for p in s.partitions() for k, v in s.scan(p)} == child.model(seed, n)
    finally:
        s.close()
    for name in _files(store):
        assert verify(os.path.join(store, name)) == []


def test_crash_in_a_checkpoint_that_recovery_takes_while_replaying(tmp_path, monkeypatch) -> None:
    """Recovery replays a long WAL tail into a small page memory and checkpoints as it
    goes; such a checkpoint's mark is the last REPLAYED record while the undo images it
    relies on were appended at the WAL's end (images_from > mark).  The second one is
    torn: the next open must roll back to the first one exactly and replay from its mark."""
    path = str(tmp_path / "s")
    rnd = random.Random(9)
    m = _Model(_open(path))
    _build(m)
    for tag in b"defghi":
        _changes(m, bytes([tag]), rnd, 60)
    m.s.close(checkpoint=False)               # everything after the last checkpoint: WAL only
    done: list[tuple[object, dict[str, bytes]]] = []
    real_run = checkpointer.run

    def run(store, checkpoint_id):
        stats = real_run(store, checkpoint_id)
        if stats is not None:
            done.append((stats, _files(path)))
        return stats
    hits = [0]

    def mid_write(name: str) -> None:
        if name == "checkpoint.mid_write":
            hits[0] += 1
            if hits[0] == 3:
                raise _PowerCut(name)
    monkeypatch.setattr(checkpointer, "run", run)
    monkeypatch.setattr(checkpointer, "crashpoint", mid_write)
    with pytest.raises(_PowerCut):
        PartitionStore.open(path, page_size=PS, memory_budget=40 * PS,
                            checkpoint_interval=None, wal_sync="none")
    monkeypatch.undo()
    assert len(done) == 2
    stats, ref = done[-1]
    assert stats.images_from > stats.mark_lsn, "a replay checkpoint (mark = replayed record)"
    _assert_rollback_restores(path, ref, str(tmp_path / "copy"))
    _tear_everything(path, ref, _pending(path), 9)
    m.check(path)
