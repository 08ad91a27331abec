"""Write-behind for checkpoint writes: start the kernel's writeback of pages already
written while the checkpoint is still sealing and writing later ones.

Without it, a checkpoint is CPU work (seal + copy into the page cache) followed by
the device work of one big fsync, strictly in series.  ``sync_file_range(...,
SYNC_FILE_RANGE_WRITE)`` after every few MiB hands the written range to the device at
once, so the two overlap and the final fsync waits only for the tail (RocksDB's
``bytes_per_sync`` does the same).

Crash safety is unchanged, and that is the whole point of using only this flag: it
starts writeback of data that is already in the page cache and that the kernel may
write back at any moment anyway (memory pressure, the flusher threads' 30 s timer).
It promises no durability and no ordering, the design never relied on a dirty page
staying in memory (the power-loss layer treats every unsynced write as possibly
persisted or torn), and the checkpointer issues a write - and so its write-behind -
only when that write is already allowed to reach the disk (in-place pages after the
WAL fsync).  Durability still comes only from the fsync of each file.

Why a gate: on ext4 (data=ordered, delayed allocation) writeback allocates the
file's new blocks, which puts the file's data into the running journal transaction;
a WAL fsync committing that transaction then waits for that data too.  The
checkpointer's WAL fsync (the one the in-place pages wait for) runs while the
appended pages are written, so their write-behind waits until it is done
(``gate``): without the gate that fsync took 14-24 ms in 3 of 8 bench trials, with
it 0.4-8.8 ms.

Linux only (through ctypes, which releases the GIL for the call); elsewhere, or when
the call fails, it does nothing and the fsync does all the work as before.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Callable

SYNC_FILE_RANGE_WRITE = 2          # <linux/fs.h>: start writeback, do not wait
WRITE_BEHIND_BYTES = 2 << 20       # issue once this much has been written to a file

# sync_file_range(fd, offset, nbytes, flags) -> 0 or -1 (errno set)
SyncFileRange = Callable[[int, int, int, int], int]


def _load() -> SyncFileRange | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    sync: SyncFileRange = fn
    return sync


_sync_file_range = _load()


def available() -> bool:
    return _sync_file_range is not None


def start_writeback(fd: int, offset: int, nbytes: int) -> bool:
    """Ask the kernel to start writing ``[offset, offset + nbytes)`` of ``fd`` to the
    device; False when unsupported or refused (a hint only: errors surface at fsync)."""
    global _sync_file_range
    fn = _sync_file_range
    if fn is None or nbytes <= 0:
        return False
    if fn(fd, offset, nbytes, SYNC_FILE_RANGE_WRITE) != 0:
        if ctypes.get_errno() in (38, 95):    # ENOSYS, EOPNOTSUPP: stop trying
            _sync_file_range = None
        return False
    return True


class WriteBehind:
    """Tracks what a checkpoint wrote to one file and starts its writeback every
    ``threshold`` bytes, as one range spanning the writes since the last start
    (pages in the range that were not written are clean: the kernel skips them)."""

    def __init__(self, fd: int, threshold: int | None = None,
                 gate: Callable[[], bool] | None = None) -> None:
        self.fd = fd
        self.threshold = WRITE_BEHIND_BYTES if threshold is None else threshold
        self.gate = gate                   # while it returns False, only accumulate
        self.lo = self.hi = 0
        self.pending = 0
        self.started = 0                   # ranges handed to the kernel (stats/tests)

    def wrote(self, offset: int, nbytes: int) -> None:
        if self.pending == 0:
            self.lo, self.hi = offset, offset + nbytes
        else:
            self.lo, self.hi = min(self.lo, offset), max(self.hi, offset + nbytes)
        self.pending += nbytes
        if self.pending >= self.threshold:
            self.flush()

    def flush(self, force: bool = False) -> None:
        """Start what is pending (unless the gate is closed and not ``force``)."""
        if not self.pending or (not force and self.gate is not None and not self.gate()):
            return
        if start_writeback(self.fd, self.lo, self.hi - self.lo):
            self.started += 1
        self.pending = 0
