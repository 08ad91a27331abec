"""Bytes a block device has written, for benches that count a file system's writes.

``/proc/<pid>/io`` write_bytes is counted when a page is dirtied, a whole page-cache
folio at a time: on a kernel with large folios (ext4 since Linux 6.16) a 4 KiB write
into a file read with big reads counts up to the folio's size (measured here on
6.18: 50 scattered 4 KiB writes into an 11 MB file counted 11.5 MB, while the device
wrote 0.21 MB). The device's own count (``/sys/dev/block/<major>:<minor>/stat``,
sectors written, counted as each request completes) is what reached the disk; it
includes every process writing to that device.
"""
from __future__ import annotations

import os


def device_stat(path: str) -> str | None:
    """The stat file of the block device that holds ``path`` (a partition's own, where
    it is one), or None (tmpfs, overlay and other devices with no stat file)."""
    st = os.stat(path)
    stat = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat"
    return stat if os.path.exists(stat) else None


def device_written(stat: str | None) -> int:
    """Bytes written to the device so far (sectors written x 512), or -1."""
    if stat is None:
        return -1
    try:
        with open(stat) as f:
            return int(f.read().split()[6]) * 512
    except (OSError, IndexError, ValueError):
        return -1
