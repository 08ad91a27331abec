"""A real tmpfs for the disk-full tests of every package (skips where mounting is not
permitted): the one mount/unmount the fixtures share."""
from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def mounted(mnt: Path, size_mib: int) -> Iterator[Path]:
    """``mnt`` (created) with a tmpfs of ``size_mib`` MiB on it until the block ends."""
    mnt.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
