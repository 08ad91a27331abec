"""Crash tests: real child processes killed by SIGKILL (by the parent, or by an armed
crash point inside a checkpoint), then recovery checked against the model of
acknowledged updates: the store must hold exactly the state after n updates, where
n is the acknowledged count or one more (the single in-flight update)."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from checkpoint import PartitionStore, dwb, read_meta, verify
from checkpoint.records import decode_images
from checkpoint.recovery import pending_undo

sys.path.insert(0, os.path.dirname(__file__))
import crash_child  # noqa: E402

CHILD = os.path.join(os.path.dirname(__file__), "crash_child.py")


def _acked(path: str) -> int:
    try:
        lines = open(path, "rb").read().split()
    except FileNotFoundError:
        return 0
    return int(lines[-1]) if lines else 0


def _start(py_env, store: str, seed: int, total: int, ack: str, crash: str | None = None):
    env = dict(py_env)
    if crash:
        env["FERRY_CRASH"] = crash
    return subprocess.Popen([sys.executable, CHILD, store, str(seed), str(total), ack],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _check(store: str, seed: int, acked: int) -> int:
    s = PartitionStore.open(store, page_size=crash_child.PAGE_SIZE, checkpoint_interval=None,
                            wal_sync="none")
    try:
        n = sum(s.counter(p) for p in s.partitions())
        assert acked <= n <= acked + 1, f"store holds {n} updates, {acked} were acknowledged"
        want = crash_child.model(seed, n)
        got = {(p, k): v for p in s.partitions() for k, v in s.scan(p)}
        assert got == want
        for (p, k), v in list(want.items())[:50]:
            assert s.get(p, k) == v
    finally:
        s.close()
    for name in os.listdir(store):
        if name.startswith("part-") and name.endswith(".bin"):
            assert verify(os.path.join(store, name)) == []
    return n


def _kill_after(proc, ack: str, n: int, limit: float = 60) -> None:
    t0 = time.monotonic()
    while _acked(ack) < n and proc.poll() is None and time.monotonic() - t0 < limit:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.mark.parametrize("seed", [1, 2])
def test_sigkill_during_updates_loses_nothing_acknowledged(tmp_path, py_env, seed) -> None:
    store, ack = str(tmp_path / "store"), str(tmp_path / "ack")
    rnd = random.Random(seed)
    total = 100_000
    for _round in range(3):
        proc = _start(py_env, store, seed, total, ack)
        _kill_after(proc, ack, _acked(ack) + rnd.randrange(50, 250))
        assert proc.returncode == -signal.SIGKILL
        _check(store, seed, _acked(ack))


def _pending(store: str):
    """Undo images of the interrupted checkpoint, decoded."""
    return [decode_images(p) for _lsn, p in pending_undo(os.path.join(store, "wal"))]


@pytest.mark.parametrize("nth", [1, 3, 6])
def test_crash_point_mid_checkpoint_write(tmp_path, py_env, nth) -> None:
    store, ack = str(tmp_path / "store"), str(tmp_path / "ack")
    proc = _start(py_env, store, 7, 5000, ack, crash=f"checkpoint.mid_write:{nth}")
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()
    assert _pending(store)              # crashed after the undo images, before the marker
    n = _check(store, 7, _acked(ack))
    # the recovered store keeps working, and survives another crash of the same kind
    proc = _start(py_env, store, 7, 5000, ack, crash="checkpoint.mid_write:2")
    proc.wait(timeout=120)
    assert _check(store, 7, _acked(ack)) >= n


def _tear(path: str, index: int, page_size: int, rnd: random.Random) -> None:
    with open(path, "r+b") as f:
        f.seek(index * page_size + page_size // 2)
        f.write(rnd.randbytes(page_size // 2))       # second half never reached the disk


@pytest.mark.parametrize("nth", [4, 9])
def test_torn_pages_are_rolled_back_and_replayed(tmp_path, py_env, nth) -> None:
    """A power cut mid-checkpoint can tear pages (SIGKILL alone cannot: the page cache
    survives it), so tear EVERY page the interrupted checkpoint may have been writing:
    pages with an undo image, pages that were FREE (listed, no image) and pages past
    the durable page count (no image) - the last two skipped the copy entirely."""
    store, ack = str(tmp_path / "store"), str(tmp_path / "ack")
    proc = _start(py_env, store, 11, 5000, ack, crash=f"checkpoint.mid_write:{nth}")
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    pending = _pending(store)
    assert pending
    ps = crash_child.PAGE_SIZE
    rnd = random.Random(3)
    skipped = 0
    for pid in {im.partition for im in pending}:
        path = os.path.join(store, f"part-{pid}.bin")
        durable = [im for im in pending if im.partition == pid]
        meta0 = [b for im in durable for i, b in im.pages if i == 0]
        if meta0:        # the interrupted checkpoint was writing this partition
            with open(str(tmp_path / "meta"), "wb") as f:
                f.write(meta0[0])
            count = read_meta(str(tmp_path / "meta")).page_count
        else:            # only first-change images logged after its cut: not written
            count = read_meta(path).page_count
        beyond = range(count, os.path.getsize(path) // ps)
        for im in durable:
            for index, _b in im.pages:
                _tear(path, index, ps, rnd)
            for index in im.free:
                _tear(path, index, ps, rnd)
            skipped += len(im.free)
        for index in beyond:
            _tear(path, index, ps, rnd)
        skipped += len(beyond)
    _check(store, 11, _acked(ack))
    assert not _pending(store)          # recovery completed a checkpoint


def test_torn_double_write_file_is_ignored(tmp_path) -> None:
    path = str(tmp_path / "x.dwb")
    dwb.write(path, 1024, 1, [(0, 1, bytes(1024)), (0, 2, bytes(1024))])
    assert dwb.read(path) is not None
    os.truncate(path, os.path.getsize(path) - 1)
    assert dwb.read(path) is None
    assert dwb.read(str(tmp_path / "absent")) is None


class _PowerCut(Exception):
    pass


def test_torn_pages_that_skipped_the_undo_copy_are_recovered(tmp_path, monkeypatch) -> None:
    """Deterministic: the interrupted checkpoint writes pages that were FREE in the file
    and pages past its durable page count (neither gets an undo image) as well as
    pages with one; all of them are torn; recovery must give exactly the model."""
    from checkpoint import checkpointer
    path = str(tmp_path / "s")
    s = PartitionStore.open(path, page_size=1024, checkpoint_interval=None, wal_sync="none")
    model: dict[bytes, bytes] = {}

    def put(k: bytes, v: bytes) -> None:
        s.put(0, k, v)
        model[k] = v

    for i in range(60):
        put(b"k%03d" % i, bytes([i]) * 3000)          # overflow chains
    s.checkpoint()
    for i in range(0, 60, 2):
        put(b"k%03d" % i, b"small-%d" % i)            # frees chains: FREE pages
    s.checkpoint()
    durable = s.parts[0].file_pages
    for i in range(60, 100):
        put(b"k%03d" % i, bytes([i]) * 2500)          # reuses FREE pages, then appends
    for i in range(1, 60, 2):
        put(b"k%03d" % i, b"v2-%d" % i)               # changes existing pages in place

    def cut(name: str) -> None:
        if name == "checkpoint.mid_write":
            raise _PowerCut(name)
    monkeypatch.setattr(checkpointer, "crashpoint", cut)
    with pytest.raises(_PowerCut):
        s.checkpoint()
    stats_free = [im for im in _pending(path)]
    s.close(checkpoint=False)
    monkeypatch.undo()                                # power is back

    file = os.path.join(path, "part-0.bin")
    free = [i for im in stats_free for i in im.free]
    imaged = [i for im in stats_free for i, _b in im.pages]
    assert free and imaged and os.path.getsize(file) // 1024 > durable
    rnd = random.Random(5)
    for index in free + imaged + list(range(durable, os.path.getsize(file) // 1024)):
        _tear(file, index, 1024, rnd)
    s = PartitionStore.open(path, page_size=1024, checkpoint_interval=None, wal_sync="none")
    try:
        assert s.rolled_back == len(free) + len(imaged)
        assert dict(s.scan(0)) == model
        assert all(s.get(0, k) == v for k, v in model.items())
    finally:
        s.close()
    assert verify(file) == []
