"""Fixtures shared by the WAL tests."""
from __future__ import annotations

import uuid

import pytest

from tests.tmpfs import mounted


@pytest.fixture
def small_fs(tmp_path):
    """A real 2 MiB tmpfs (disk-full tests); skips where mounting is not permitted."""
    with mounted(tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}", 2) as mnt:
        yield mnt
