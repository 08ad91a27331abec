"""A transfer snapshot flushes only its own partition (``checkpointer.run(..., only=p)``):
the other partitions' dirty pages stay for the next checkpoint, the file then holds the
partition at the snapshot's counter, a crash at any point of it (pages torn) loses
nothing acknowledged, and it does not count as a checkpoint for what waits on one."""
from __future__ import annotations

import os
import random
import shutil

from checkpoint import PartitionStore, iter_entries, verify

PAGE = 4096


def _fill(s: PartitionStore, model: dict[tuple[int, bytes], bytes], rnd: random.Random,
          n: int, parts: range = range(4)) -> None:
    for i in range(n):
        p = parts[i % len(parts)]
        key = b"k%05d" % rnd.randrange(600)
        value = bytes([65 + i % 26]) * rnd.randrange(20, 300)
        s.put(p, key, value)
        model[(p, key)] = value


def _dirty(s: PartitionStore) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for k in s.mem.dirty:
        out.setdefault(k >> 32, set()).add(k & 0xFFFFFFFF)
    return out


def test_a_snapshot_flushes_its_partition_alone(tmp_path) -> None:
    rnd = random.Random(5)
    model: dict[tuple[int, bytes], bytes] = {}
    s = PartitionStore.open(str(tmp_path / "store"), page_size=PAGE, checkpoint_interval=None)
    try:
        _fill(s, model, rnd, 2000)
        s.checkpoint()
        _fill(s, model, rnd, 800)
        before = _dirty(s)
        assert all(before.get(p) for p in range(4))
        snap = s.open_transfer_snapshot(1)
        try:
            after = _dirty(s)
            assert 1 not in after                                # its pages are written
            assert {p: after.get(p) for p in (0, 2, 3)} == {p: before[p] for p in (0, 2, 3)}
            assert snap.counter == s.counter(1)
            # not a checkpoint: a crash now still rolls the file back to the last one
            assert s.last_checkpoint_counter(1) < s.counter(1)
            path = s.partition_path(1)
            assert verify(path) == []
            got = {e.key: e.value for e in iter_entries(path, include_tombstones=False)}
            assert got == {k: v for (p, k), v in model.items() if p == 1}
        finally:
            snap.close()
        stats = s.checkpoint()               # the next checkpoint includes it again
        assert stats is not None and 1 in stats.counters
        assert s.last_checkpoint_counter(1) == s.counter(1)
    finally:
        s.close()


def _pages(path: str) -> list[bytes]:
    with open(path, "rb") as f:
        data = f.read()
    return [data[i:i + PAGE] for i in range(0, len(data), PAGE)]


def test_a_crash_after_a_torn_flush_loses_nothing(tmp_path) -> None:
    """A power cut during the flush may tear every page it wrote (its partition's
    dirty pages, appended ones and the meta page): the undo images it made durable
    first roll them back, and the WAL's replay brings back every acknowledged put."""
    rnd = random.Random(9)
    model: dict[tuple[int, bytes], bytes] = {}
    live = str(tmp_path / "live")
    s = PartitionStore.open(live, page_size=PAGE, checkpoint_interval=None, wal_sync="group")
    try:
        _fill(s, model, rnd, 1500)
        s.checkpoint()
        _fill(s, model, rnd, 1500)               # p1 grows: appended pages too
        path = s.partition_path(1)
        old = _pages(path)
        snap = s.open_transfer_snapshot(1)
        new = _pages(path)
        written = [i for i, page in enumerate(new) if i >= len(old) or page != old[i]]
        assert 0 in written and len(written) > 3
        _fill(s, model, rnd, 400)                # after the flush: in the WAL only
        s.wal.sync()
        crashed = str(tmp_path / "crashed")
        shutil.copytree(live, crashed)
        snap.close()
    finally:
        s.close(checkpoint=False)
    torn = os.path.join(crashed, os.path.basename(path))
    with open(torn, "r+b") as f:
        for i in written:
            f.seek(i * PAGE + PAGE // 2)
            f.write(rnd.randbytes(PAGE // 2))    # the second half never reached the disk
    r = PartitionStore.open(crashed, page_size=PAGE, checkpoint_interval=None)
    try:
        got = {(p, k): v for p in r.partitions() for k, v in r.scan(p)}
        assert got == model
    finally:
        r.close()
