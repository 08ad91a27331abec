from __future__ import annotations

import os
from typing import Iterator

import pytest

from transfer import DirectoryStorage, Limits, SupplierServer
from transfer_helpers import SECRET


@pytest.fixture
def secret() -> bytes:
    return SECRET


@pytest.fixture
def secret_file(tmp_path) -> str:
    path = tmp_path / "secret"
    path.write_bytes(SECRET + b"\n")
    path.chmod(0o600)
    return str(path)


@pytest.fixture
def src(tmp_path) -> str:
    d = tmp_path / "src"
    d.mkdir()
    return str(d)


@pytest.fixture
def dst(tmp_path) -> str:
    d = tmp_path / "dst"
    d.mkdir()
    return str(d)


@pytest.fixture
def server(src) -> Iterator[SupplierServer]:
    srv = SupplierServer(DirectoryStorage(src), SECRET, limits=Limits(4), timeout=10).start()
    yield srv
    srv.stop()


@pytest.fixture
def tmpfs(tmp_path) -> Iterator[str]:
    """A 6 MiB file system of its own, to fill up for real (root and mount(2) only)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or os.system(f"mount -t tmpfs -o size=6m tmpfs {mnt} 2>/dev/null") != 0:
        pytest.skip("needs root and mount(2) to make a small tmpfs")
    yield str(mnt)
    os.system(f"umount {mnt}")
