"""Failures the store outlives: a full disk, a read-only file system, no file
descriptors left. Writes are refused while the cause lasts (nothing acknowledged is
lost), the checkpointer retries once the cause may be gone, and the store serves
again by itself; each cause is said in one WARNING, not a traceback per write.

Real parts: a tmpfs filled to the last page, ext4 on a loop device that the kernel
turns read-only (it stays read-only until remounted, so the test checks what survives
a remount), a child process under a low RLIMIT_NOFILE. The read-only file system that
becomes writable again is a file layer: no real one does that while files are open
for writing (a remount to read-only is refused with EBUSY then).
"""
from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import textwrap
import time

import pytest

from checkpoint import CheckpointError, PartitionStore
from faults import fileio, latch
from faults.latch import Cause, cause_of
from wal import WalError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    """Warnings are rate-limited per process: each test starts with none given."""
    monkeypatch.setattr(latch, "WARNINGS", latch._Warnings())


def _fill(path) -> None:
    with open(os.path.join(path, "filler"), "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC


def _until(pred, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s")


def _try_put(s: PartitionStore, acked: dict[bytes, bytes], key: bytes, value: bytes):
    try:
        s.put(0, key, value)
    except (CheckpointError, WalError) as e:
        return e
    acked[key] = value
    return None


def _storage_lines(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "ferry.storage" and r.levelno == level]


def test_disk_full_refuses_then_serves_again_by_itself(small_fs, caplog) -> None:
    caplog.set_level(logging.INFO, logger="ferry.storage")
    s = PartitionStore.open(str(small_fs / "store"), wal_sync="group", checkpoint_interval=0.2,
                            memory_budget=4 << 20)
    acked: dict[bytes, bytes] = {}
    for i in range(50):
        assert _try_put(s, acked, b"a%d" % i, b"v" * 1000) is None
    _fill(small_fs)
    refusals = [e for i in range(300) if (e := _try_put(s, acked, b"b%d" % i, b"w" * 1000))]
    assert refusals and all(cause_of(e) is Cause.DISK_FULL for e in refusals)
    _until(lambda: s.failure is not None)            # the periodic checkpoint failed
    with pytest.raises(CheckpointError, match="refuses writes: its last checkpoint failed: "
                                              "disk full on .*bytes needed"):
        s.put(0, b"refused", b"x")
    assert all(s.get(0, k) == v for k, v in acked.items())   # reads go on meanwhile
    time.sleep(0.5)                                  # retries meanwhile say nothing more
    os.unlink(small_fs / "filler")
    _until(lambda: _try_put(s, acked, b"after", b"x") is None)
    assert s.failure is None
    for i in range(20):
        assert _try_put(s, acked, b"c%d" % i, b"y" * 1000) is None
    s.close()
    warnings = _storage_lines(caplog, logging.WARNING)
    assert len(warnings) == 1 and "disk full on" in warnings[0], warnings
    assert any("recovered" in m for m in _storage_lines(caplog, logging.INFO))
    with PartitionStore.open(str(small_fs / "store"), checkpoint_interval=None) as s:
        assert {k: s.get(0, k) for k in acked} == acked


class _ReadOnlyLayer(fileio.FileLayer):
    """The file system of a remount to read-only: every change fails with EROFS while
    ``ro`` is set (nothing dirty is left, so fsync has nothing to fail on)."""

    def __init__(self) -> None:
        self.ro = False

    def _check(self, path: str = "") -> None:
        if self.ro:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path or None)

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            self._check(path)
        return super().open(path, flags, mode)

    def write(self, fd, data):
        self._check()
        return super().write(fd, data)

    def pwrite(self, fd, data, offset):
        self._check()
        return super().pwrite(fd, data, offset)

    def ftruncate(self, fd, size):
        self._check()
        return super().ftruncate(fd, size)

    def replace(self, src, dst):
        self._check(dst)
        return super().replace(src, dst)

    def unlink(self, path):
        self._check(path)
        return super().unlink(path)


def test_read_only_refuses_then_serves_again_once_writable(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="ferry.storage")
    layer = _ReadOnlyLayer()
    acked: dict[bytes, bytes] = {}
    with fileio.use(layer):
        s = PartitionStore.open(str(tmp_path / "store"), wal_sync="group", checkpoint_interval=0.2)
        for i in range(50):
            assert _try_put(s, acked, b"a%d" % i, b"v" * 300) is None
        layer.ro = True
        first = _try_put(s, acked, b"refused", b"x")
        assert cause_of(first) is Cause.READ_ONLY and "filesystem read-only" in str(first)
        _until(lambda: s.failure is not None)
        refusals = [e for i in range(100) if (e := _try_put(s, acked, b"b%d" % i, b"w"))]
        assert len(refusals) == 100 and all(cause_of(e) is Cause.READ_ONLY for e in refusals)
        assert s.wal.failure is None                  # refused, not failed: nothing was written
        layer.ro = False
        _until(lambda: _try_put(s, acked, b"after", b"x") is None)
        s.close()
    warnings = _storage_lines(caplog, logging.WARNING)
    assert len(warnings) == 1 and "filesystem read-only" in warnings[0], warnings
    with PartitionStore.open(str(tmp_path / "store"), checkpoint_interval=None) as s:
        assert {k: s.get(0, k) for k in acked} == acked


def test_kernel_read_only_keeps_what_was_acknowledged(tmp_path, caplog) -> None:
    """ext4 turned read-only by the kernel (an error, as after a failing disk): writes
    are refused saying so, and everything acknowledged is there after a remount (such
    a file system stays read-only until then: the retries find it so)."""
    from cluster_sim import loopdisk
    ok, why = loopdisk.permitted()
    if not ok:
        pytest.skip(why)
    caplog.set_level(logging.INFO, logger="ferry.storage")
    disk = loopdisk.LoopDisk(str(tmp_path / "disk"), size_mib=32)
    disk.mount()
    try:
        # what a kernel error does depends on this option (the default only logs it)
        subprocess.run(["mount", "-o", "remount,errors=remount-ro", disk.path], check=True)
        s = PartitionStore.open(os.path.join(disk.path, "store"), wal_sync="group",
                                checkpoint_interval=0.2)
        acked: dict[bytes, bytes] = {}
        for i in range(200):
            assert _try_put(s, acked, b"a%d" % i, b"v" * 500) is None
        dev = os.path.basename(disk.device)
        with open(f"/sys/fs/ext4/{dev}/trigger_fs_error", "w") as f:
            f.write("test: turn read-only\n")
        refusals = []
        for i in range(300):
            e = _try_put(s, acked, b"b%d" % i, b"w" * 500)
            if e is not None:
                refusals.append(e)
        assert refusals and cause_of(refusals[-1]) is Cause.READ_ONLY
        _until(lambda: s.failure is not None)
        # refused saying so; retried (the probe fails) unless the WAL's fsync failed
        # first (then it says restart): which comes first is the kernel's timing
        with pytest.raises(CheckpointError, match="filesystem read-only at"):
            s.put(0, b"x", b"y")
        time.sleep(1.0)                      # retries say nothing more
        try:
            s.close(checkpoint=False)
        except WalError as e:                # its final fsync: read-only too
            assert cause_of(e) is Cause.READ_ONLY
        subprocess.run(["umount", disk.path], check=True)
        subprocess.run(["mount", disk.device, disk.path], check=True)
        with PartitionStore.open(os.path.join(disk.path, "store"), checkpoint_interval=None) as s:
            assert {k: s.get(0, k) for k in acked} == acked
    finally:
        disk.unmount(keep=False)
    lines = _storage_lines(caplog, logging.WARNING) + _storage_lines(caplog, logging.ERROR)
    assert any("read-only" in m for m in lines), lines
    # one for the cause (a WAL whose fsync failed and the checkpointer each say it
    # once), not one per write or retry
    assert len(lines) <= 3, lines


CHILD = textwrap.dedent("""
    import json, os, resource, sys, time
    sys.path.insert(0, sys.argv[2])
    from checkpoint import PartitionStore, CheckpointError
    from faults.latch import cause_of
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    s = PartitionStore.open(sys.argv[1], wal_sync="group", checkpoint_interval=0.2)
    acked = {}
    def put(p, k):
        try:
            s.put(p, k, b"v" * 200)
        except CheckpointError as e:
            return str(cause_of(e))
        acked[k.decode()] = p
    put(0, b"first")
    s.create_partition(1)
    if sys.argv[3] == "trim":
        s.checkpoint()                       # nothing left for the background one
        s.files.trim()                       # no idle partition file the store could close
    hog = []
    while True:                              # every descriptor the process may have
        try:
            hog.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            break
    put(1, b"needs-a-checkpoint")            # its first checkpoint opens part-1.bin
    deadline = time.monotonic() + 10
    while s.failure is None and time.monotonic() < deadline:
        time.sleep(0.05)
    refused = put(1, b"refused")
    for fd in hog:
        os.close(fd)
    t0 = time.monotonic()
    while put(1, b"after") is not None and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    print(json.dumps({"refused": refused, "failure": repr(s.failure), "acked": acked,
                      "recovered_s": time.monotonic() - t0}))
    s.close()
""")


def test_out_of_descriptors_refuses_then_serves_again(tmp_path) -> None:
    store = str(tmp_path / "store")
    r = subprocess.run([sys.executable, "-c", CHILD, store, ROOT, "trim"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["refused"] == "Cause.OUT_OF_FDS"
    assert out["failure"] == "None" and "after" in out["acked"]
    assert "out of file descriptors" in r.stderr and "Traceback" not in r.stderr


def test_out_of_descriptors_closes_an_idle_partition_file_first(tmp_path) -> None:
    """With every descriptor taken, a checkpoint's open of a partition file closes an
    idle one of the store's own and tries again: nothing is refused."""
    store = str(tmp_path / "store")
    r = subprocess.run([sys.executable, "-c", CHILD, store, ROOT, "keep"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["refused"] is None and out["failure"] == "None"
    assert {"first", "needs-a-checkpoint", "refused", "after"} <= set(out["acked"])
    assert "Traceback" not in r.stderr
    with PartitionStore.open(store, checkpoint_interval=None) as s:
        for k, p in out["acked"].items():
            assert s.get(p, k.encode()) == b"v" * 200


def test_latched_failure_is_a_metric_while_it_lasts(small_fs) -> None:
    from node.metrics import Metrics
    m = Metrics()
    s = PartitionStore.open(str(small_fs / "store"), wal_sync="group", checkpoint_interval=0.2)
    acked: dict[bytes, bytes] = {}
    _try_put(s, acked, b"a", b"v" * 1000)
    _fill(small_fs)
    while _try_put(s, acked, b"b%d" % len(acked), b"w" * 1000) is None:
        pass
    _until(lambda: s.failure is not None)
    series = (f'ferry_node_storage_failed{{cause="disk_full",component="checkpointer",'
              f'path="{s.dir}"}} 1.0')
    assert series in m.render()
    os.unlink(small_fs / "filler")
    _until(lambda: s.failure is None)
    assert "ferry_node_storage_failed{" not in m.render()
    s.close()
