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
    with _mount(["-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs"], mnt,
                "cannot mount a tmpfs here (needs root)"):
        yield mnt


@contextmanager
def _mount(args: list[str], mnt: Path, refused: str) -> Iterator[None]:
    """``mount <args> <mnt>`` until the block ends (``umount -l`` then); skips with
    ``refused`` and mount's message when it fails."""
    r = subprocess.run(["mount", *args, str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"{refused}: {r.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


MKFS = {"xfs": ["mkfs.xfs", "-q", "-f", "-m", "reflink=1"], "btrfs": ["mkfs.btrfs", "-q", "-f"]}
MKFS_PACKAGE = {"xfs": "xfsprogs", "btrfs": "btrfs-progs"}


@contextmanager
def cow_mounted(kind: str, mnt: Path, image: Path, size_mib: int = 320) -> Iterator[Path]:
    """``mnt`` (created) with a file system that shares extents (``FICLONE`` works):
    ``kind`` "xfs" (reflink on) or "btrfs", made in the file ``image`` and loop-mounted
    until the block ends; skips where that is not permitted (not root, no mkfs for
    it, no loop device)."""
    mnt.mkdir(parents=True, exist_ok=True)
    with open(image, "wb") as f:
        f.truncate(size_mib << 20)
    tool, *flags = MKFS[kind]
    exe = f"/usr/sbin/{tool}" if Path(f"/usr/sbin/{tool}").exists() else tool
    try:
        r = subprocess.run([exe, *flags, str(image)], capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip(f"{tool} is not installed (Debian: {MKFS_PACKAGE[kind]}; scripts/system-deps test)")
    if r.returncode != 0:
        pytest.skip(f"{tool} failed: {r.stderr.strip()}")
    with _mount(["-o", "loop", str(image)], mnt,
                f"cannot loop-mount a {kind} here (needs root and a loop device)"):
        yield mnt
