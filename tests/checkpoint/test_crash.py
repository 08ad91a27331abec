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

from checkpoint import PartitionStore, dwb, verify

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


@pytest.mark.parametrize("nth", [1, 3, 6])
def test_crash_point_mid_checkpoint_write(tmp_path, py_env, nth) -> None:
    store, ack = str(tmp_path / "store"), str(tmp_path / "ack")
    proc = _start(py_env, store, 7, 5000, ack, crash=f"checkpoint.mid_write:{nth}")
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()
    assert dwb.read(os.path.join(store, dwb.NAME)) is not None   # crashed after the double-write
    n = _check(store, 7, _acked(ack))
    # the recovered store keeps working, and survives another crash of the same kind
    proc = _start(py_env, store, 7, 5000, ack, crash="checkpoint.mid_write:2")
    proc.wait(timeout=120)
    assert _check(store, 7, _acked(ack)) >= n


def test_torn_pages_are_repaired_from_the_double_write_file(tmp_path, py_env) -> None:
    """A power cut mid-checkpoint can tear pages (SIGKILL alone cannot: the page cache
    survives it), so tear every page the interrupted checkpoint was overwriting."""
    store, ack = str(tmp_path / "store"), str(tmp_path / "ack")
    proc = _start(py_env, store, 11, 5000, ack, crash="checkpoint.mid_write:4")
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    found = dwb.read(os.path.join(store, dwb.NAME))
    assert found is not None
    page_size, pages = found
    rnd = random.Random(3)
    for pid, index, _img in pages:
        with open(os.path.join(store, f"part-{pid}.bin"), "r+b") as f:
            f.seek(index * page_size + page_size // 2)
            f.write(rnd.randbytes(page_size // 2))       # second half never reached the disk
    _check(store, 11, _acked(ack))
    assert os.path.getsize(os.path.join(store, dwb.NAME)) == 0


def test_torn_double_write_file_is_ignored(tmp_path) -> None:
    path = str(tmp_path / "x.dwb")
    dwb.write(path, 1024, 1, [(0, 1, bytes(1024)), (0, 2, bytes(1024))])
    assert dwb.read(path) is not None
    os.truncate(path, os.path.getsize(path) - 1)
    assert dwb.read(path) is None
    assert dwb.read(str(tmp_path / "absent")) is None
