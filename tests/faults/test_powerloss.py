from __future__ import annotations

import os

from faults import fileio
from faults.powerloss import PowerLossLayer


def _atomic_write_without_dir_fsync(path: str, data: bytes) -> None:
    """fileio.atomic_write with its directory fsync removed: the bug the layer must catch."""
    io = fileio.layer()
    tmp = path + ".tmp"
    fd = io.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    fileio.write_all(fd, data, tmp, io=io)
    io.fsync(fd)
    io.close(fd)
    io.replace(tmp, path)


def test_complete_atomic_write_survives_power_cut(tmp_path) -> None:
    target = str(tmp_path / "meta")
    with open(target, "wb") as f:
        f.write(b"old")
    with fileio.use(PowerLossLayer()) as pl:
        fileio.atomic_write(target, b"new")
        pl.cut()
    assert open(target, "rb").read() == b"new"
    assert sorted(os.listdir(tmp_path)) == ["meta"]


def test_missing_directory_fsync_is_caught(tmp_path) -> None:
    target = str(tmp_path / "meta")
    with open(target, "wb") as f:
        f.write(b"old")
    with fileio.use(PowerLossLayer()) as pl:
        _atomic_write_without_dir_fsync(target, b"new")
        pl.cut()
    # The rename was never made durable: after the cut the old file is back and the
    # new bytes are gone, although the function returned. A durability check fails.
    assert open(target, "rb").read() == b"old"


def test_missing_file_fsync_loses_unsynced_bytes(tmp_path) -> None:
    path = str(tmp_path / "log")
    with fileio.use(PowerLossLayer()) as pl:
        io = fileio.layer()
        fd = io.open(path, os.O_WRONLY | os.O_CREAT)
        io.fsync_dir(str(tmp_path))
        io.write(fd, b"durable-")
        io.fsync(fd)
        io.write(fd, b"lost")
        io.close(fd)
        pl.cut()
    assert open(path, "rb").read() == b"durable-"


def test_new_file_without_dir_fsync_disappears(tmp_path) -> None:
    path = str(tmp_path / "segment")
    with fileio.use(PowerLossLayer()) as pl:
        io = fileio.layer()
        fd = io.open(path, os.O_WRONLY | os.O_CREAT)
        io.write(fd, b"data")
        io.fsync(fd)
        io.close(fd)
        pl.cut()
    assert not os.path.exists(path)


def test_keep_unsynced_keeps_a_seeded_subset(tmp_path) -> None:
    results = []
    for _ in range(2):
        path = str(tmp_path / "f")
        if os.path.exists(path):
            os.unlink(path)
        with fileio.use(PowerLossLayer(keep_unsynced=0.5, seed=3)) as pl:
            io = fileio.layer()
            fd = io.open(path, os.O_WRONLY | os.O_CREAT)
            io.fsync_dir(str(tmp_path))
            for i in range(20):
                io.pwrite(fd, bytes([65 + i]), i)
            io.close(fd)
            pl.cut()
        results.append(open(path, "rb").read())
    assert results[0] == results[1]                      # seeded, repeatable
    assert 0 < len(results[0].strip(b"\0")) <= 20
    assert results[0] != bytes(range(65, 85))            # not everything survived
