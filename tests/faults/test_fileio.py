from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from faults import OutOfDiskError, fileio


class _Recording(fileio.FileLayer):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def fsync(self, fd: int) -> None:
        self.calls.append("fsync")
        super().fsync(fd)

    def replace(self, src: str, dst: str) -> None:
        self.calls.append("replace")
        super().replace(src, dst)

    def fsync_dir(self, path: str) -> None:
        self.calls.append("fsync_dir")
        super().fsync_dir(path)


def test_atomic_write_orders_fsync_rename_dirsync(tmp_path) -> None:
    target = tmp_path / "meta"
    target.write_bytes(b"old")
    with fileio.use(_Recording()) as rec:
        fileio.atomic_write(str(target), b"new contents")
    assert rec.calls == ["fsync", "replace", "fsync_dir"]
    assert target.read_bytes() == b"new contents"
    assert not (tmp_path / "meta.tmp").exists()


class _FullDisk(fileio.FileLayer):
    def write(self, fd: int, data) -> int:
        raise OSError(28, "No space left on device")


def test_disk_full_becomes_out_of_disk_error_and_leaves_old_file(tmp_path) -> None:
    target = tmp_path / "meta"
    target.write_bytes(b"old")
    with fileio.use(_FullDisk()):
        with pytest.raises(OutOfDiskError, match="out of disk space") as ei:
            fileio.atomic_write(str(target), b"x" * 100)
    assert ei.value.needed == 100 and ei.value.path.endswith("meta.tmp")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["meta"]


def test_atomic_write_never_follows_a_planted_temp_symlink(tmp_path):
    """A symlink at PATH.tmp (left by an attacker with write access to the folder)
    is replaced, not followed: the victim keeps its contents."""
    from faults import fileio
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    target = tmp_path / "states.json"
    (tmp_path / "states.json.tmp").symlink_to(victim)
    fileio.atomic_write(str(target), b"new")
    assert victim.read_bytes() == b"precious"
    assert target.read_bytes() == b"new" and not target.is_symlink()


@given(st.lists(st.integers(0, 5000), max_size=40), st.integers(1, 4096))
def test_iov_slices_regroup_without_loss_within_the_limits(sizes: list[int], limit: int) -> None:
    parts = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    groups = list(fileio.iov_slices(parts, limit))
    assert b"".join(b"".join(g) for g, _ in groups) == b"".join(parts)
    for g, size in groups:
        assert size == sum(len(v) for v in g) and 0 < size <= limit
        assert len(g) <= fileio.IOV_MAX
    # every group but the last is full, unless it hit IOV_MAX
    assert all(size == limit or len(g) == fileio.IOV_MAX for g, size in groups[:-1])


def test_iov_slices_caps_the_buffers_per_writev() -> None:
    parts = [b"x"] * (fileio.IOV_MAX + 5)
    groups = list(fileio.iov_slices(parts, 1 << 20))
    assert [len(g) for g, _ in groups] == [fileio.IOV_MAX, 5]


def test_write_all_writes_in_slices(tmp_path) -> None:
    sizes: list[int] = []

    class Sizes(fileio.FileLayer):
        def write(self, fd: int, data: bytes | memoryview) -> int:
            sizes.append(len(data))
            return super().write(fd, data)

    data = os.urandom(3 * fileio.WRITE_SLICE + 17)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    try:
        fileio.write_all(fd, data, str(tmp_path / "f"), io=Sizes())
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == data
    assert max(sizes) == fileio.WRITE_SLICE and sum(sizes) == len(data)
