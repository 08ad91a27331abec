"""Partition files open on demand within a budget of descriptors (checkpoint/files.py).

A store of thousands of partitions keeps at most ``open_files`` descriptors of them
open; a file in use (pinned by a read or by an open transfer snapshot) or written
since its last fsync is never closed; a reopened file must be the inode first opened;
checkpoints fsync through the descriptor that wrote, in groups of half the budget;
recovery's rollback stays within the budget too; crashes recover as before.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import sys
import threading
import time

import pytest

from checkpoint import CheckpointError, PartitionStore, verify
from checkpoint.files import MIN_BUDGET, FileCache, default_budget
from checkpoint.records import encode_images
from checkpoint.recovery import rollback
from faults import fileio
from faults.powerloss import PowerLossLayer

sys.path.insert(0, os.path.dirname(__file__))
import crash_child  # noqa: E402
from test_crash import _acked, _kill_after, _pending, _start  # noqa: E402

# Descriptors of the store beside its partition files: the WAL's segment and LOCK, and
# transient ones (a new partition's temp file, the open-time scan, the sampler's
# listdir).
SLACK = 8


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class _NoSync(fileio.FileLayer):
    """fsync as a no-op: the tests that count descriptors do not wait for the disk."""

    def fsync(self, fd: int) -> None:
        pass

    def fdatasync(self, fd: int) -> None:
        pass

    def fsync_dir(self, path: str) -> None:
        pass


class _Sampler:
    """The process's open descriptors, sampled every millisecond in a thread."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _fds())
            time.sleep(0.001)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _fds())


def _value(p: int, i: int) -> bytes:
    return b"%d/%d:" % (p, i) * (1 + (p * 7 + i) % 40)


def test_5000_partitions_stay_within_the_budget(tmp_path) -> None:
    """Every partition written and read back, through pressure checkpoints, a close
    and a recovery, with the process's descriptors under budget + a small constant
    all along (a store keeping its files open would hold 5,000 or more)."""
    budget, n = 64, 5000
    base = _fds()
    with fileio.use(_NoSync()), _Sampler() as sampler:
        s = PartitionStore.open(str(tmp_path / "s"), page_size=1024, memory_budget=256 << 10,
                                checkpoint_interval=None, wal_sync="none", open_files=budget)
        for i in range(2):
            for p in range(n):
                s.put(p, b"k%d" % i, _value(p, i))
        s.checkpoint()
        for p in range(n):
            s.put(p, b"k0", _value(p, 2))                 # overwrites: in-place pages
        for p in range(0, n, 7):
            assert s.get(p, b"k0") == _value(p, 2) and s.get(p, b"k1") == _value(p, 1)
        st = s.stats()
        assert st["open_files_peak"] <= budget, st
        assert st["file_closes"] > n                       # files were closed and reopened
        s.close(checkpoint=False)                # the last overwrites are replayed
        s = PartitionStore.open(str(tmp_path / "s"), page_size=1024, memory_budget=256 << 10,
                                checkpoint_interval=None, wal_sync="none", open_files=budget)
        for p in range(n):
            assert dict(s.scan(p)) == {b"k0": _value(p, 2), b"k1": _value(p, 1)}, p
        assert s.stats()["open_files_peak"] <= budget
        s.close()
    assert sampler.peak - base <= budget + SLACK, (sampler.peak, base)
    assert _fds() <= base + 1


def test_default_budget_is_a_share_of_the_descriptor_limit(tmp_path) -> None:
    import resource
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    b = default_budget()
    assert MIN_BUDGET <= b <= 1024
    if soft != resource.RLIM_INFINITY:
        assert b <= max(MIN_BUDGET, soft // 4)
    with pytest.raises(CheckpointError, match="open files budget"):
        FileCache(2)
    with pytest.raises(CheckpointError, match="open files budget"):
        PartitionStore.open(str(tmp_path / "s"), open_files=True)  # type: ignore[arg-type]


def _store(tmp_path, n: int, budget: int = MIN_BUDGET, **kw) -> PartitionStore:
    kw.setdefault("memory_budget", 32 * 1024)
    s = PartitionStore.open(str(tmp_path / "s"), page_size=1024, checkpoint_interval=None,
                            wal_sync="none", open_files=budget, **kw)
    for p in range(n):
        for i in range(6):
            s.put(p, b"k%d" % i, _value(p, i) * 3)
    s.checkpoint()
    return s


def _churn(s: PartitionStore, skip: int = -1) -> None:
    """Read every other partition's file (a scan reads its pages from the file)."""
    for p in s.partitions():
        if p != skip:
            assert len(list(s.scan(p))) == 6


def test_a_file_pinned_by_an_open_snapshot_is_not_closed(tmp_path) -> None:
    """While a snapshot is open its file stays open in the store through any churn;
    the transfer storage sends from a duplicate of that descriptor (the very inode),
    and the snapshot's close releases the pin to the cache."""
    from transfer import PartitionStoreStorage
    s = _store(tmp_path, 30)
    try:
        path = s.partition_path(0)
        snap = PartitionStoreStorage(s).open_snapshot("default", 0)
        file = s.parts[0].file
        pinned = file.rfd
        assert file.pins == 1 and pinned >= 0 and snap.fd not in (pinned, -1)
        for _ in range(3):
            _churn(s, skip=0)
            s.put(0, b"k0", b"changed")                   # a pre-image, a write fd
            s.checkpoint()
            assert file.rfd == pinned and file.pins == 1
            assert os.fstat(pinned).st_ino == os.fstat(snap.fd).st_ino == os.stat(path).st_ino
        st = s.stats()
        assert st["open_files"] <= MIN_BUDGET + 1 and st["file_closes"] > 60, st
        at_c = os.pread(snap.fd, snap.size, 0)             # what sendfile would send
        assert len(at_c) >= snap.size
        snap.close()
        assert snap.fd == -1 and file.pins == 0
        _churn(s, skip=0)
        assert file.rfd == -1 and s.stats()["open_files"] <= MIN_BUDGET
    finally:
        s.close()


def test_a_send_keeps_its_file_when_the_store_closes_under_it(tmp_path) -> None:
    """The store's close ends its snapshots and closes every file; a send still under
    way reads the same file through its own descriptor (never a number the store
    closed and something else may have reopened)."""
    from transfer import PartitionStoreStorage
    s = _store(tmp_path, 8)
    path = s.partition_path(2)
    snap = PartitionStoreStorage(s).open_snapshot("default", 2)
    try:
        s.close()
        others = [os.open(s.partition_path(p), os.O_RDONLY) for p in range(8) if p != 2]
        try:
            assert os.fstat(snap.fd).st_ino == os.stat(path).st_ino
            assert os.pread(snap.fd, 1024, 0) == open(path, "rb").read(1024)
        finally:
            for fd in others:
                os.close(fd)
    finally:
        snap.close()


def test_snapshot_fileno_is_the_pinned_file_until_close(tmp_path) -> None:
    s = _store(tmp_path, 12)
    try:
        with s.open_transfer_snapshot(3) as snap:
            fd = snap.fileno()
            _churn(s, skip=3)
            assert snap.fileno() == fd == s.parts[3].file.rfd
            assert os.pread(fd, 1024, 0) == open(s.partition_path(3), "rb").read(1024)
        assert snap.fileno() == -1 and s.parts[3].file.pins == 0
        s.drop_partition(3)                                # not busy any more
    finally:
        s.close()


def test_a_written_file_stays_open_until_its_fsync(tmp_path) -> None:
    s = _store(tmp_path, 20)
    try:
        part = s.parts[5]
        wfd = part.write_fd()                              # written from now on
        _churn(s)
        assert part.file.wfd == wfd and part.file.unsynced
        os.fstat(wfd)
        part.fsync()
        assert not part.file.unsynced
        _churn(s, skip=5)
        assert part.file.wfd == -1                         # closed once synced and unused
    finally:
        s.close()


class _Recorder(fileio.FileLayer):
    """Records, per partition-file descriptor opened through the seam, every write,
    fsync and close; fails the test at a close with writes since the last fsync."""

    def __init__(self) -> None:
        self.paths: dict[int, str] = {}
        self.dirty: set[int] = set()
        self.bad: list[str] = []
        self.open_now = self.open_peak = self.fsyncs = self.closes = 0
        self.lock = threading.Lock()

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        fd = super().open(path, flags, mode)
        if os.path.basename(path).startswith("part-") and path.endswith(".bin"):
            with self.lock:
                self.paths[fd] = path
                self.open_now += 1
                self.open_peak = max(self.open_peak, self.open_now)
        return fd

    def pwrite(self, fd: int, data, offset: int) -> int:    # the copy path: every write
        with self.lock:
            if fd in self.paths:
                self.dirty.add(fd)
        return super().pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        super().fsync(fd)
        with self.lock:
            if fd in self.paths:
                self.fsyncs += 1
                self.dirty.discard(fd)

    def close(self, fd: int) -> None:
        with self.lock:
            if fd in self.paths:
                if fd in self.dirty:
                    self.bad.append(self.paths[fd])
                self.dirty.discard(fd)
                del self.paths[fd]
                self.open_now -= 1
                self.closes += 1
        super().close(fd)


def test_checkpoints_close_no_file_before_its_fsync(tmp_path) -> None:
    """200 partitions, a budget of 8: checkpoints fsync in groups of 4 through the
    descriptor that wrote, and no descriptor is closed with a write not yet fsynced,
    while readers churn the cache between and during checkpoints."""
    rec = _Recorder()
    rnd = random.Random(5)
    with fileio.use(rec):
        s = PartitionStore.open(str(tmp_path / "s"), page_size=1024, memory_budget=64 * 1024,
                                checkpoint_interval=0.01, wal_sync="none", open_files=8)
        try:
            model: dict[tuple[int, bytes], bytes] = {}
            for i in range(3000):
                p, k = rnd.randrange(200), b"k%d" % rnd.randrange(20)
                v = rnd.randbytes(rnd.choice([10, 200, 1500]))
                s.put(p, k, v)
                model[(p, k)] = v
                if i % 50 == 0:
                    q = rnd.randrange(200)
                    list(s.scan(q))
            st = s.checkpoint()
            assert st is None or st.files >= 1
            assert s.stats()["open_files_peak"] <= 8 + 2, s.stats()
            for (p, k), v in model.items():
                assert s.get(p, k) == v
        finally:
            s.close()
    assert rec.bad == [], rec.bad[:5]
    assert rec.closes > 200 and rec.fsyncs >= 200
    assert rec.open_peak <= 8
    for p in range(200):
        path = os.path.join(str(tmp_path / "s"), f"part-{p}.bin")
        if os.path.exists(path):
            assert verify(path) == []


def test_a_checkpoint_of_more_files_than_the_budget_fsyncs_them_in_groups(tmp_path) -> None:
    s = PartitionStore.open(str(tmp_path / "s"), page_size=1024, memory_budget=1 << 20,
                            checkpoint_interval=None, wal_sync="none", open_files=8)
    try:
        s.checkpoint()
        for p in range(100):
            s.put(p, b"k", b"v%d" % p)
        st = s.checkpoint()
        assert st.files == 100 and st.early_fsyncs >= 96, st
        assert s.stats()["open_files_peak"] <= 8
        for p in range(100):
            s.put(p, b"k", b"w%d" % p)
        st = s.checkpoint()                                # in place this time
        assert st.files == 100 and st.overwritten >= 200
        s.close()
        s = PartitionStore.open(str(tmp_path / "s"), page_size=1024, checkpoint_interval=None,
                                wal_sync="none", open_files=8)
        assert s.replayed == 0 and all(s.get(p, b"k") == b"w%d" % p for p in range(100))
    finally:
        s.close()


def test_power_cut_after_checkpoints_through_reopened_files(tmp_path) -> None:
    """On the power-loss layer, with nothing unsynced kept: what the checkpoints wrote
    through descriptors that were closed and reopened is durable (each was fsynced by
    the descriptor that wrote it), and recovery gives back every acknowledged write."""
    layer = PowerLossLayer(keep_unsynced=0.0, seed=3)
    rnd = random.Random(9)
    model: dict[tuple[int, bytes], bytes] = {}
    with fileio.use(layer):
        s = PartitionStore.open(str(tmp_path / "s"), page_size=1024, memory_budget=48 * 1024,
                                checkpoint_interval=None, wal_sync="always", open_files=4)
        for round_ in range(3):
            for i in range(400):
                p, k = rnd.randrange(40), b"k%d" % rnd.randrange(15)
                v = rnd.randbytes(rnd.choice([10, 300, 2500]))
                s.put(p, k, v)
                model[(p, k)] = v
            s.checkpoint()
            _ = [list(s.scan(p)) for p in s.partitions()]
        assert s.stats()["file_closes"] > 40
        s.close(checkpoint=False)
        layer.cut()
    s = PartitionStore.open(str(tmp_path / "s"), page_size=1024, checkpoint_interval=None,
                            wal_sync="none", open_files=4)
    try:
        got = {(p, k): v for p in s.partitions() for k, v in s.scan(p)}
        assert got == model
    finally:
        s.close()


def test_a_file_replaced_behind_the_store_is_refused(tmp_path) -> None:
    s = _store(tmp_path, 10)
    try:
        path = s.partition_path(3)
        shutil.copyfile(path, path + ".copy")
        os.replace(path + ".copy", path)                   # same bytes, another inode
        _churn(s, skip=3)                                  # its descriptor closed
        assert s.parts[3].file.rfd == -1
        with pytest.raises(CheckpointError, match="replaced behind the store"):
            list(s.scan(3))
        assert len(list(s.scan(4))) == 6                   # the others are served
    finally:
        s.close(checkpoint=False)


def test_install_renames_the_file_and_keeps_it_known(tmp_path) -> None:
    """An installed file keeps its inode under the partition's name: reopened after
    eviction it is accepted and read."""
    s = _store(tmp_path, 10)
    try:
        src = str(tmp_path / "incoming.bin")
        shutil.copyfile(s.partition_path(2), src)
        s.drop_partition(2)
        s.install_partition(2, src)
        _churn(s, skip=2)
        assert s.parts[2].file.rfd == -1 and s.parts[2].path == s.partition_path(2)
        assert len(list(s.scan(2))) == 6
    finally:
        s.close()


class _Counter(fileio.FileLayer):
    def __init__(self) -> None:
        self.open_now = self.peak = 0
        self.dirty: set[int] = set()
        self.bad = 0

    def open(self, path, flags, mode=0o644):
        fd = super().open(path, flags, mode)
        self.open_now += 1
        self.peak = max(self.peak, self.open_now)
        return fd

    def pwrite(self, fd, data, offset):
        self.dirty.add(fd)
        return super().pwrite(fd, data, offset)

    def fsync(self, fd):
        super().fsync(fd)
        self.dirty.discard(fd)

    def close(self, fd):
        self.open_now -= 1
        if fd in self.dirty:
            self.bad += 1
            self.dirty.discard(fd)
        super().close(fd)


def test_rollback_keeps_within_max_open_and_fsyncs_before_closing(tmp_path) -> None:
    """Undo images of 20 partitions, twice over in WAL order: with max_open=3 the files
    are fsynced, closed and reopened; the earliest image of each page still wins."""
    ps = 1024
    s = _store(tmp_path, 20)
    s.close()
    d = str(tmp_path / "s")
    undo, lsn = [], 0
    for rnd in range(2):
        for p in range(20):
            lsn += 1
            page = bytearray(ps)
            page[100:109] = b"%02d-round%d" % (p, rnd)
            undo.append((lsn, encode_images(p, ps, [(1, bytes(page))], [])))
    layer = _Counter()
    with fileio.use(layer):
        assert rollback(d, undo, {}, max_open=3) == 20
    assert layer.peak <= 3 and layer.bad == 0 and layer.open_now == 0
    for p in range(20):
        with open(os.path.join(d, f"part-{p}.bin"), "rb") as f:
            f.seek(ps + 100)
            assert f.read(9) == b"%02d-round0" % p


@pytest.mark.parametrize("nth", [3, 7])
def test_sigkill_mid_checkpoint_with_a_small_budget(tmp_path, py_env, nth) -> None:
    """The SIGKILL crash child over 40 partitions with a budget of 4 (checkpoints write
    file by file, fsynced two at a time), killed in the middle of its nth checkpoint;
    recovery, with the same budget, gives back the model of acknowledged updates."""
    store, ack = str(tmp_path / "store"), str(tmp_path / "ack")
    env = dict(py_env, FERRY_TEST_PARTITIONS="40", FERRY_TEST_OPEN_FILES="4")
    proc = _start(env, store, 17, 5000, ack, crash=f"checkpoint.mid_write:{nth}")
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()
    assert _pending(store)
    _check(store, 17, _acked(ack))


def test_sigkill_during_updates_with_a_small_budget(tmp_path, py_env) -> None:
    store, ack = str(tmp_path / "store"), str(tmp_path / "ack")
    env = dict(py_env, FERRY_TEST_PARTITIONS="40", FERRY_TEST_OPEN_FILES="4")
    rnd = random.Random(4)
    for _round in range(2):
        proc = _start(env, store, 21, 100_000, ack)
        _kill_after(proc, ack, _acked(ack) + rnd.randrange(200, 600))
        assert proc.returncode == -signal.SIGKILL
        _check(store, 21, _acked(ack))


def _check(store: str, seed: int, acked: int) -> None:
    s = PartitionStore.open(store, page_size=crash_child.PAGE_SIZE, checkpoint_interval=None,
                            wal_sync="none", open_files=4)
    try:
        n = sum(s.counter(p) for p in s.partitions())
        assert acked <= n <= acked + 1, f"store holds {n} updates, {acked} were acknowledged"
        got = {(p, k): v for p in s.partitions() for k, v in s.scan(p)}
        assert got == crash_child.model(seed, n, 40)
        assert s.stats()["open_files_peak"] <= 4 + 1
    finally:
        s.close()
    for name in os.listdir(store):
        if name.startswith("part-") and name.endswith(".bin"):
            assert verify(os.path.join(store, name)) == []


def test_a_partition_file_reached_through_a_link_is_not_sent(tmp_path) -> None:
    """The supplier sends the store's own descriptor, but never a file the store
    reached through a symlink in its directory (as when it opened the file itself)."""
    from transfer import PartitionStoreStorage, TransferError
    _store(tmp_path, 3).close()
    d = str(tmp_path / "s")
    outside = str(tmp_path / "outside.bin")
    os.replace(os.path.join(d, "part-1.bin"), outside)
    os.symlink(outside, os.path.join(d, "part-1.bin"))
    s = PartitionStore.open(d, page_size=1024, checkpoint_interval=None, wal_sync="none",
                            open_files=MIN_BUDGET)
    try:
        storage = PartitionStoreStorage(s)
        with pytest.raises(TransferError, match="symlink"):
            storage.open_snapshot("default", 1)
        assert s.parts[1].file.pins == 0
        s.open_transfer_snapshot(1).close()               # nothing left open or busy
        snap = storage.open_snapshot("default", 2)        # the others are sent
        snap.close()
    finally:
        s.close()
