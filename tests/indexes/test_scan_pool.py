"""The scan pool (indexes/scanpool.py): a rebuild hands a partition file's whole scan
to a long-lived worker process. Same index as a rebuild in one process; the process
serves one rebuild after another; a failed, cancelled or killed worker is replaced;
closing the pool leaves no process."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from checkpoint import pagefile
from indexes import IndexStore, PartitionFileSource, RebuildCancelled, ScanPool, scanworker
from indexes import scan as rb
from pagegen import write_partition_file

from idx_helpers import dump
from test_parallel_scan import DEFS, _children, _data, children_before_the_test  # noqa: F401 (autouse)


@pytest.fixture
def part_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(scanworker, "MIN_RANGE", 4)      # many ranges of a small file
    d = tmp_path / "data"
    d.mkdir()
    write_partition_file(str(d / "part-4.bin"), 4, _data(6000))
    write_partition_file(str(d / "part-5.bin"), 5, _data(3000))
    return str(d)


def _no_scan_here(monkeypatch) -> None:
    """Fail the test if the rebuild's own process decodes the file."""
    def refuse(*a, **k):
        raise AssertionError("the rebuild scanned in its own process")
    monkeypatch.setattr(rb, "scan_batches", refuse)
    monkeypatch.setattr(rb, "_ranges_batches", refuse)


def test_pool_rebuild_equals_a_single_process_one_and_reuses_its_process(
        tmp_path, part_dir, monkeypatch) -> None:
    src = PartitionFileSource(part_dir)
    with IndexStore.open(str(tmp_path / "one"), DEFS) as one:
        want = {p: (one.rebuild(p, src, workers=1), dump(one, p)) for p in (4, 5)}
    with ScanPool(1, min_bytes=0, when="always") as pool, IndexStore.open(str(tmp_path / "pool"), DEFS) as s:
        pids = set()
        for p in (4, 5, 4):
            seen = []
            with monkeypatch.context() as m:
                _no_scan_here(m)
                got = s.rebuild(p, src, pool=pool, memory_limit=100_000, progress=seen.append)
            a, entries = want[p]
            assert (got.scanned, got.entries, got.bad) == (a.scanned, a.entries, a.bad)
            assert a.bad > 0 and len(got.bad_samples) == len(a.bad_samples)
            assert dump(s, p) == entries and s.ready(p) and s.verify(p, src).ok
            assert any(pr.stage == "scan" and pr.done == a.scanned for pr in seen)
            pids |= {proc.pid for proc in pool._idle}
        assert pool.started == 1 and len(pids) == 1          # one process served all three
        assert not os.path.exists(os.path.join(str(tmp_path / "pool"), "scratch", "4"))
    assert not _children()


def test_rebuilds_at_once_share_the_pool_and_agree(tmp_path, part_dir, monkeypatch) -> None:
    src = PartitionFileSource(part_dir)
    with IndexStore.open(str(tmp_path / "one"), DEFS) as one:
        for p in (4, 5):
            one.rebuild(p, src, workers=1)
        want = {p: dump(one, p) for p in (4, 5)}
    errors: list[BaseException] = []
    with ScanPool(1, min_bytes=0, when="always") as pool, IndexStore.open(str(tmp_path / "pool"), DEFS) as s:
        def run(p: int) -> None:
            try:
                s.rebuild(p, src, pool=pool)
            except BaseException as e:      # noqa: BLE001 - reported below
                errors.append(e)
        threads = [threading.Thread(target=run, args=(p,)) for p in (4, 5)]
        with monkeypatch.context() as m:
            _no_scan_here(m)
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        assert not errors
        assert {p: dump(s, p) for p in (4, 5)} == want and s.ready(4) and s.ready(5)
        assert pool.started == 1                             # the second one waited its turn
    assert not _children()


def test_a_failing_worker_is_an_error_and_is_replaced(tmp_path, part_dir, monkeypatch) -> None:
    real = scanworker.task
    src = PartitionFileSource(part_dir)
    with ScanPool(1, min_bytes=0, when="always") as pool, IndexStore.open(str(tmp_path / "idx"), DEFS) as s:
        monkeypatch.setattr(scanworker, "task", lambda c, sc, i: dict(real(c, sc, i), codec="nope"))
        with pytest.raises(Exception, match="scan worker.*failed.*nope"):
            s.rebuild(4, src, pool=pool)
        assert not s.ready(4) and not pool._idle and not pool._busy
        monkeypatch.setattr(scanworker, "task", real)
        s.rebuild(4, src, pool=pool)
        assert s.ready(4) and pool.started == 2
    assert not _children()


def test_a_killed_idle_worker_is_replaced(tmp_path, part_dir) -> None:
    src = PartitionFileSource(part_dir)
    with ScanPool(1, min_bytes=0, when="always") as pool, IndexStore.open(str(tmp_path / "idx"), DEFS) as s:
        s.rebuild(4, src, pool=pool)
        os.kill(pool._idle[0].pid, signal.SIGKILL)
        pool._idle[0].wait()
        s.rebuild(5, src, pool=pool)
        assert s.ready(5) and s.verify(5, src).ok and pool.started == 2
    assert not _children()


def test_cancel_while_waiting_for_a_worker_and_while_scanning(tmp_path, part_dir) -> None:
    src = PartitionFileSource(part_dir)
    stop = threading.Event()
    with ScanPool(1, min_bytes=0, when="always") as pool, IndexStore.open(str(tmp_path / "idx"), DEFS) as s:
        busy = pool.checkout()                               # the only process is taken
        stop.set()
        with pytest.raises(RebuildCancelled, match="waiting for a scan worker"):
            s.rebuild(4, src, pool=pool, cancel=stop)
        pool.checkin(busy, healthy=True)
        go = threading.Event()

        def on(pr) -> None:
            if pr.stage == "scan":
                go.set()
        with pytest.raises(RebuildCancelled):
            s.rebuild(4, src, pool=pool, cancel=go, progress=on)
        assert not s.ready(4) and not pool._idle             # the cancelled worker is gone
    assert not _children()


def test_small_files_and_a_corrupt_page(tmp_path, part_dir) -> None:
    src = PartitionFileSource(part_dir)
    with ScanPool(1) as pool, IndexStore.open(str(tmp_path / "idx"), DEFS) as s:
        s.rebuild(4, src, pool=pool)                         # < min_bytes: in-process
        assert pool.started == 0 and s.ready(4)
    path = os.path.join(part_dir, "part-4.bin")
    meta = pagefile.read_meta(path)
    with open(path, "r+b") as f:
        f.seek((meta.page_count - 2) * meta.page_size + 100)
        f.write(b"\xff\xfe")                                 # CRC mismatch
    with ScanPool(1, min_bytes=0, when="always") as pool, IndexStore.open(str(tmp_path / "idx2"), DEFS) as s:
        with pytest.raises(pagefile.CorruptPageError, match=f"page {meta.page_count - 2}"):
            s.rebuild(4, src, pool=pool)
        assert not s.ready(4)
    assert not _children()


def test_closed_pool_and_warm(tmp_path, part_dir) -> None:
    pool = ScanPool(2, min_bytes=0, when="always")
    pool.warm()
    with pytest.raises(ValueError):
        ScanPool(0)
    with IndexStore.open(str(tmp_path / "idx"), DEFS) as s:
        s.rebuild(4, PartitionFileSource(part_dir), pool=pool)
        pool.close()
        with pytest.raises(RebuildCancelled, match="closed"):
            s.rebuild(5, PartitionFileSource(part_dir), pool=pool)
    assert pool.started <= 2
    for t in threading.enumerate():
        if t.name == "scan-pool-warm":
            t.join(10)
    assert not _children()


_KILLED_PARENT = r"""
import os, signal, sys, threading, time
from indexes import IndexStore, PartitionFileSource, ScanPool
from test_parallel_scan import DEFS
pool = ScanPool(1, min_bytes=0, when="always")
def killer():
    # The node dies mid-rebuild: as soon as a worker is checked out. Watched every
    # millisecond, not from the rebuild's progress reports: those come every 0.2 s, and
    # a fast machine finishes this scan between two of them (the rebuild then ends
    # without a kill and the test saw exit 0).
    while True:
        procs = list(pool._busy)
        if procs:
            print(procs[0].pid, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.001)
threading.Thread(target=killer, daemon=True).start()
with IndexStore.open(sys.argv[2], DEFS) as s:
    s.rebuild(4, PartitionFileSource(sys.argv[1]), pool=pool)
print("rebuild ended without the kill", file=sys.stderr)
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_worker_stops_when_its_parent_is_killed(tmp_path, part_dir, py_env, python) -> None:
    """SIGKILL of the process that owns the pool (the node) once a rebuild has checked
    a worker out: whether the worker was still waiting for its task or already asking
    for ranges, it sees its stdin close and exits; nothing is left running."""
    import subprocess
    import time
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(py_env, PYTHONPATH=here + os.pathsep + py_env.get("PYTHONPATH", ""))
    big = tmp_path / "big"
    big.mkdir()
    write_partition_file(str(big / "part-4.bin"), 4, _data(40_000))   # many ranges to go
    r = subprocess.run([python, "-c", _KILLED_PARENT, str(big), str(tmp_path / "idx")],
                       env=env, capture_output=True, timeout=120)
    assert r.returncode == -9, r.stderr.decode()[-2000:]
    pid = int(r.stdout.split()[0])
    deadline = time.monotonic() + 30
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(pid), f"scan worker {pid} outlived its killed parent"


def test_when_idle_the_pool_is_used_only_while_a_cpu_is_idle(tmp_path, part_dir, monkeypatch) -> None:
    src = PartitionFileSource(part_dir)
    with pytest.raises(ValueError, match="idle"):
        ScanPool(1, when="sometimes")
    with ScanPool(1, min_bytes=0) as pool, IndexStore.open(str(tmp_path / "idx"), DEFS) as s:
        monkeypatch.setattr(scanworker, "idle_cpu", lambda: False)     # a saturated machine
        assert not pool.wants(1 << 30)
        s.rebuild(4, src, pool=pool)
        assert s.ready(4) and pool.started == 0                       # scanned in-process
        monkeypatch.setattr(scanworker, "idle_cpu", lambda: True)
        assert pool.wants(0)
        s.rebuild(5, src, pool=pool)
        assert s.ready(5) and s.verify(5, src).ok and pool.started == 1
    assert not _children()
