"""The parallel scan of a partition file (indexes/scanworker.py): worker processes
with page ranges give the same index as one process; a corrupt page in a worker's
range, a cancel and a failing worker leave the partition not ready and no process."""
from __future__ import annotations

import json
import os
import resource
import threading

import pytest

from checkpoint import pagefile
from indexes import (IndexDefinition, IndexStore, PartitionFileSource, RebuildCancelled,
                     scanworker)
from pagegen import write_partition_file

from idx_helpers import dump

DEFS = [IndexDefinition("age", "age", type="int"),
        IndexDefinition("city", "addr.city"),
        IndexDefinition("email", "email", unique=True)]


def _data(n: int) -> list[tuple[bytes, bytes | None]]:
    out: list[tuple[bytes, bytes | None]] = []
    for i in range(n):
        d: dict = {"age": i % 90, "email": f"u{i}@example.com",
                   "addr": {"city": ["Oslo", "Lima", "Zürich"][i % 3]}}
        if i % 101 == 0:
            d["age"] = "not an int"              # bad for one index, counted
        out.append((b"user:%08d" % i, json.dumps(d).encode() if i % 211 else b"{oops"))
    out.append((b"gone", None))                  # a tombstone is not indexed
    return out


@pytest.fixture
def part_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(scanworker, "MIN_RANGE", 4)      # many ranges of a small file
    d = tmp_path / "data"
    d.mkdir()
    write_partition_file(str(d / "part-4.bin"), 4, _data(6000))
    return str(d)


def _all_children() -> set[int]:
    me = os.getpid()
    out = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        out.add(int(pid))
            except OSError:
                pass
    return out


_before: set[int] = set()


@pytest.fixture(autouse=True)
def children_before_the_test():
    """Children this process had before the test started (under xdist an earlier test in
    the same worker may have left one on purpose, e.g. the Spark gateway JVM) are not
    the test's to clean up; _children() counts only the ones started since."""
    global _before
    _before = _all_children()
    yield


def _children() -> set[int]:
    """Child processes started since the test began and still alive."""
    return _all_children() - _before


def test_page_ranges_of_the_decoder_cover_the_file_once(part_dir) -> None:
    path = os.path.join(part_dir, "part-4.bin")
    whole = [kv for b in pagefile.iter_live_batches(path) for kv in b]
    n = pagefile.read_meta(path).page_count
    for cuts in ([1, n], [1, 2, n], [1, n // 3, n // 2, n], [0, 5, n + 10]):
        got = [kv for a, b in zip(cuts, cuts[1:])
               for batch in pagefile.iter_live_batches(path, pages=(a, b)) for kv in batch]
        assert got == whole


@pytest.mark.parametrize("workers", [2, 3])
def test_parallel_rebuild_equals_a_single_process_one(tmp_path, part_dir, workers) -> None:
    src = PartitionFileSource(part_dir)
    assert scanworker.plan(src, 4, workers) is not None
    assert len(scanworker.Ranges(pagefile.read_meta(src.file_for(4)).page_count).left) > 3
    with IndexStore.open(str(tmp_path / "one"), DEFS) as one, \
            IndexStore.open(str(tmp_path / "par"), DEFS) as par:
        a = one.rebuild(4, src, workers=1)
        seen = []
        b = par.rebuild(4, src, workers=workers, memory_limit=100_000, progress=seen.append)
        assert (b.scanned, b.entries, b.bad) == (a.scanned, a.entries, a.bad) == (6000, a.entries, a.bad)
        assert b.runs >= workers                 # each worker hands over its runs
        assert a.bad > 0 and len(b.bad_samples) == len(a.bad_samples)
        assert dump(par, 4) == dump(one, 4)
        assert par.ready(4) and par.verify(4, src).ok
        assert seen[-1].stage == "load" or any(p.stage == "scan" and p.done == 6000 for p in seen)
    assert not os.path.exists(os.path.join(str(tmp_path / "par"), "scratch", "4")) or \
        not os.listdir(os.path.join(str(tmp_path / "par"), "scratch", "4"))
    assert not _children()


def test_parallel_rebuild_with_pipes_numbered_above_fd_setsize(tmp_path, part_dir) -> None:
    """A node holding many partitions has more than 1,024 files open, so the pipes to
    the scan workers get numbers select(2) refuses ("filedescriptor out of range in
    select()"): the rebuild waits on them with poll(2)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1600:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard}: cannot open fds above 1,024 here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1600 if hard == resource.RLIM_INFINITY
                                                 else min(hard, 4096), hard))
    held: list[int] = []
    try:
        while not held or held[-1] <= 1030:
            held.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
        src = PartitionFileSource(part_dir)
        with IndexStore.open(str(tmp_path / "par"), DEFS) as par:
            b = par.rebuild(4, src, workers=2, memory_limit=100_000)
            assert b.scanned == 6000 and par.ready(4) and b.runs >= 2
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert not _children()


def test_corrupt_page_in_a_workers_range_raises_and_leaves_not_ready(tmp_path, part_dir) -> None:
    path = os.path.join(part_dir, "part-4.bin")
    meta = pagefile.read_meta(path)
    last = meta.page_count - 2                   # in the last range
    with open(path, "r+b") as f:
        f.seek(last * meta.page_size + 100)
        f.write(b"\xff\xfe")                     # CRC mismatch
    with IndexStore.open(str(tmp_path / "idx"), DEFS) as s:
        with pytest.raises(pagefile.CorruptPageError, match=f"page {last}"):
            s.rebuild(4, PartitionFileSource(part_dir), workers=2)
        assert not s.ready(4)
    assert not _children()


def test_cancel_kills_the_workers(tmp_path, part_dir) -> None:
    stop = threading.Event()

    def on(p) -> None:
        if p.stage == "scan":
            stop.set()
    with IndexStore.open(str(tmp_path / "idx"), DEFS) as s:
        with pytest.raises(RebuildCancelled):
            s.rebuild(4, PartitionFileSource(part_dir), workers=2, progress=on, cancel=stop)
        assert not s.ready(4)
    assert not _children()


def test_a_worker_that_fails_is_an_error_not_a_hang(tmp_path, part_dir, monkeypatch) -> None:
    real = scanworker.ScanWorker.__init__

    def broken(self, task, ranges) -> None:
        real(self, dict(task, codec="nope"), ranges)          # fails before its first range
    monkeypatch.setattr(scanworker.ScanWorker, "__init__", broken)
    with IndexStore.open(str(tmp_path / "idx"), DEFS) as s:
        with pytest.raises(Exception, match="scan worker.*failed.*nope"):
            s.rebuild(4, PartitionFileSource(part_dir), workers=2)
        assert not s.ready(4)
    assert not _children()


def test_workers_alone_give_the_same_index(tmp_path, part_dir, monkeypatch) -> None:
    """The rebuild takes no range itself: every entry comes through the workers."""
    from indexes import scan as rb
    src = PartitionFileSource(part_dir)
    with IndexStore.open(str(tmp_path / "one"), DEFS) as one:
        a = one.rebuild(4, src, workers=1)
        want = dump(one, 4)
    monkeypatch.setattr(rb, "_ranges_batches", lambda path, ranges, verified: iter(()))
    with IndexStore.open(str(tmp_path / "par"), DEFS) as par:
        b = par.rebuild(4, src, workers=3)
        assert (b.scanned, b.entries, b.bad) == (a.scanned, a.entries, a.bad)
        assert dump(par, 4) == want and par.ready(4)
    assert not _children()


def test_small_files_and_other_sources_are_scanned_in_one_process(part_dir) -> None:
    src = PartitionFileSource(part_dir)
    assert scanworker.plan(src, 4, None) is None            # below PARALLEL_MIN_BYTES
    assert scanworker.plan(src, 4, 1) is None
    assert scanworker.plan(src, 99, 2) is None              # no file: the scan says so


def test_a_workers_error_crosses_the_pipe_as_its_kind() -> None:
    """The worker names the error's kind in its message; the parent raises that class
    again (a CorruptPageError stays one), anything else is an IndexStoreError."""
    from checkpoint import CorruptPageError
    from indexes import IndexStoreError
    err = CorruptPageError("/d/part-4.bin", 7, 7 * 4096, "bad crc")
    msg = json.loads(json.dumps(scanworker._error_message(err)))
    back = scanworker._error_of(msg, "/d/part-4.bin")
    assert isinstance(back, CorruptPageError) and str(back) == str(err)
    other = scanworker._error_of(scanworker._error_message(ValueError("boom")), "/d/x")
    assert type(other) is IndexStoreError and "ValueError: boom" in str(other)
