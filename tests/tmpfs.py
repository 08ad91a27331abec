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


@contextmanager
def xfs_mounted(mnt: Path, image: Path, size_mib: int = 320) -> Iterator[Path]:
    """``mnt`` (created) with an XFS (reflink on: ``FICLONE`` works) made in the file
    ``image`` and loop-mounted until the block ends; skips where that is not permitted
    (not root, no mkfs.xfs or no loop device)."""
    mnt.mkdir(parents=True, exist_ok=True)
    with open(image, "wb") as f:
        f.truncate(size_mib << 20)
    mkfs = "/usr/sbin/mkfs.xfs" if Path("/usr/sbin/mkfs.xfs").exists() else "mkfs.xfs"
    try:
        r = subprocess.run([mkfs, "-q", "-f", "-m", "reflink=1", str(image)],
                           capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("mkfs.xfs is not installed (Debian: xfsprogs; scripts/system-deps test)")
    if r.returncode != 0:
        pytest.skip(f"mkfs.xfs failed: {r.stderr.strip()}")
    r = subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot loop-mount an XFS here (needs root and a loop device): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
