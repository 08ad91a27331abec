"""A delta fetch's base as a clone (transfer.delta.clone_file, ``ioctl(FICLONE)``):
on a file system that shares extents (XFS with reflink and btrfs, loop-mounted here) the temp
file is a clone of the installed copy, so nothing of the base is written; elsewhere,
and under a swapped-in file layer, the base is copied byte by byte as before. Either
way the digests describe the temp file and the fetch installs exactly the supplier's
partition at C."""
from __future__ import annotations

import errno
import os

import pytest

from checkpoint import pagefile
from checkpoint.store import PartitionStore
from faults import fileio
from tests.tmpfs import cow_mounted
from transfer import Demander, PartitionStoreStorage, SupplierServer, delta
from transfer_helpers import SECRET, WriteSizes, peer_of

PS = 4096


@pytest.fixture(scope="module", params=["xfs", "btrfs"])
def cow(request, tmp_path_factory):
    """A loop-mounted file system that shares extents."""
    base = tmp_path_factory.mktemp(request.param)
    with cow_mounted(request.param, base / "mnt", base / f"{request.param}.img") as mnt:
        yield mnt


def _free(path) -> int:
    st = os.statvfs(path)
    return st.f_bfree * st.f_frsize


def _files(d, body: bytes):
    (d / "src").write_bytes(body)
    src = os.open(d / "src", os.O_RDONLY)
    dst = os.open(d / "dst", os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    return src, dst


def test_where_extents_are_shared_the_base_is_a_clone_nothing_written(cow) -> None:
    body = os.urandom(24 << 20) + b"tail"              # whole pages, then a partial one
    d = cow / "clone"
    d.mkdir()
    src, dst = _files(d, body)
    try:
        os.fsync(src)
        os.sync()
        free = _free(cow)
        seen: list[int] = []
        digests = delta.copy_base(src, dst, PS, progress=seen.append)
        os.fsync(dst)
        os.sync()
        used = free - _free(cow)
    finally:
        os.close(src)
        os.close(dst)
    with open(d / "src", "r+b") as f:                   # the source changes afterwards
        f.write(b"\xff" * PS)
    whole = body[:len(body) // PS * PS]
    assert (d / "dst").read_bytes() == whole            # the partial page is cut off
    assert digests == delta.page_digests(whole, PS)
    assert seen and seen[-1] == len(whole)              # progress (and the crash point) per block
    # a copy would take 24 MiB of the file system; the clone shares the source's extents
    assert used < (4 << 20), f"{used} bytes of free space went to the base"


def test_a_delta_fetch_with_a_cloned_base_is_exact_and_takes_little_space(cow) -> None:
    a = PartitionStore.open(str(cow / "a"), wal_sync="none", checkpoint_interval=None)
    b = PartitionStore.open(str(cow / "b"), wal_sync="none", checkpoint_interval=None)
    try:
        for i in range(12000):
            a.put(3, b"key-%06d" % i, b"v0-%d-" % i + b"x" * 1000)
        a.checkpoint()
        srv = SupplierServer(PartitionStoreStorage(a), SECRET).start()
        try:
            def fetch():
                return Demander(PartitionStoreStorage(b), peer_of(srv), SECRET).fetch(3)
            assert fetch().mode == "full"
            for i in range(0, 12000, 400):              # 30 keys spread over the file
                a.put(3, b"key-%06d" % i, b"NEW-%d-" % i + b"y" * 900)
            a.checkpoint()
            size = os.path.getsize(a.partition_path(3))
            os.sync()
            free = _free(cow)
            res = fetch()
            os.sync()
            used = free - _free(cow)
        finally:
            srv.stop()
        assert res.mode == "delta" and 1 <= res.pages_sent <= 61, res
        assert dict(b.scan(3)) == dict(a.scan(3))
        assert b.counter(3) == a.counter(3)
        assert pagefile.verify(b.partition_path(3)) == []
        assert open(b.partition_path(3), "rb").read() == open(a.partition_path(3), "rb").read()
        # the old copy's blocks stay with the new file: only the pages received (and the
        # store's own WAL record) take new space, not a second copy of the file
        assert used < size // 4, f"{used} bytes used for a {size}-byte partition"
    finally:
        a.close()
        b.close()


def test_a_swapped_in_file_layer_always_gets_the_byte_copy(tmp_path, monkeypatch) -> None:
    def no_clone(src_fd: int, dst_fd: int) -> bool:
        raise AssertionError("a swapped-in layer must see every write: no clone")
    monkeypatch.setattr(delta, "clone_file", no_clone)
    body = os.urandom(300 * PS)
    src, dst = _files(tmp_path, body)
    layer = WriteSizes()
    try:
        digests = delta.copy_base(src, dst, PS, io=layer)
    finally:
        os.close(src)
        os.close(dst)
    assert (tmp_path / "dst").read_bytes() == body and digests == delta.page_digests(body, PS)
    assert sum(layer.sizes) == len(body)


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY])
def test_a_file_system_without_clones_gets_the_byte_copy(tmp_path, monkeypatch, code) -> None:
    calls: list[int] = []

    def ioctl(fd: int, request: int, arg: int) -> int:
        calls.append(request)
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(delta.fcntl, "ioctl", ioctl)
    body = os.urandom(200 * PS)
    src, dst = _files(tmp_path, body)
    try:
        digests = delta.copy_base(src, dst, PS, io=fileio.FileLayer())
    finally:
        os.close(src)
        os.close(dst)
    assert calls == [delta.FICLONE]
    assert (tmp_path / "dst").read_bytes() == body and digests == delta.page_digests(body, PS)


def test_an_io_error_of_the_clone_is_raised_not_taken_for_no_clone(tmp_path, monkeypatch) -> None:
    def ioctl(fd: int, request: int, arg: int) -> int:
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(delta.fcntl, "ioctl", ioctl)
    src, dst = _files(tmp_path, os.urandom(10 * PS))
    try:
        with pytest.raises(OSError) as e:
            delta.copy_base(src, dst, PS, io=fileio.FileLayer())
    finally:
        os.close(src)
        os.close(dst)
    assert e.value.errno == errno.EIO
