"""Fixtures shared by the WAL tests."""
from __future__ import annotations

import subprocess
import uuid

import pytest


@pytest.fixture
def small_fs(tmp_path):
    """A real 2 MiB tmpfs (disk-full tests); skips where mounting is not permitted."""
    mnt = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
