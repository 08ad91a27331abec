"""Delta catch-up: a demander that still holds an older copy of a page file fetches
only the pages that differ (docs/protocol.md, "Delta fetch").

- Demander: :func:`copy_base` copies its installed copy (the *base*) into the temp file
  while it takes each page's digest (xxh3-128 of the page's bytes, 16 bytes a page);
  the digests go to the supplier in BASE frames after the DEMAND. Where the file system
  shares extents (``FICLONE``: XFS with reflink, btrfs) the temp file is a clone of
  the base instead: no byte of it is written, so the temp file's fsync writes only the
  pages received, and the digests are read from the clone.
- Supplier: :func:`snapshot_digests` takes the same digest of each page as of the
  snapshot's counter C (the live file overlaid with the pre-images saved after the
  read, like a chunk's checksum at C); :func:`diff_ranges` lists the pages that differ
  (or lie beyond the base), coalesced into ranges that are then sent with sendfile.
- Both sides: :func:`root` digests the list of page digests; the MANIFEST carries the
  supplier's root at C and the demander installs nothing unless the file it built
  (base pages, received ranges, pre-images) has that root.

A page that differs but has the same 128-bit digest as the base's would be kept
stale: the digest is xxh3-128, so that takes about 2**64 differing pages (about
2**76 bytes) to expect once. Pages are compared by content, not by a page counter:
two copies of a partition are written by two checkpointers and need not lay out their
pages the same way, so a page moved elsewhere on one copy simply differs.
"""
from __future__ import annotations

import errno
import fcntl
import os
import sys
from typing import Callable, Iterator

import xxhash

from faults import crashpoint, fileio

from .errors import TransferError

DIGEST = 16                      # bytes of one page digest (xxh3-128)
DIGEST_ALGO = "xxh3_128"
BLOCK = 4 << 20                  # bytes read (and compared) at a time
RANGE_PAGES_MAX = 1024           # a range is cut after this many pages (acks, progress)
# Two ranges closer than this many equal pages are sent as one: a frame and a sendfile
# call cost more than a few pages of loopback bytes.
COALESCE_GAP = 2


def page_digests(data: bytes | bytearray | memoryview, page_size: int) -> bytes:
    """The digests of the whole pages of ``data``, in order."""
    view = memoryview(data)
    d = xxhash.xxh3_128_digest
    return b"".join(d(view[i:i + page_size]) for i in range(0, len(view) - page_size + 1, page_size))


def root(digests: bytes | bytearray | memoryview) -> bytes:
    """One digest over a file's page digests (what the MANIFEST carries)."""
    return xxhash.xxh3_128_digest(digests)


FICLONE = 0x40049409             # <linux/fs.h>: _IOW(0x94, 9, int)
# what a file system, a kernel or a pair of files without shared extents answers: the
# copy then goes byte by byte, as everywhere else
NO_CLONE = frozenset({errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL,
                      errno.ENOSYS, errno.EPERM, errno.EBADF, errno.ETXTBSY})


def clone_file(src_fd: int, dst_fd: int) -> bool:
    """Make ``dst_fd`` a clone of ``src_fd`` (``ioctl(FICLONE)``: the same extents,
    copy-on-write, nothing written; atomic against writes to the source). False where
    the file system or platform cannot (ext4, tmpfs, two file systems, not Linux): the
    caller copies instead. Other errors (EIO, ENOSPC, ...) are raised."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fcntl.ioctl(dst_fd, FICLONE, src_fd)
    except OSError as e:
        if e.errno in NO_CLONE:
            return False
        raise
    return True


def copy_base(src_fd: int, dst_fd: int, page_size: int, *, io: fileio.FileLayer | None = None,
              progress: Callable[[int], None] | None = None) -> bytes:
    """Copy the whole pages of ``src_fd`` into ``dst_fd`` (from offset 0; ``dst_fd`` is
    cut to that length first) and return their digests. Each digest is taken of the
    bytes in ``dst_fd``, so it describes the temp file whatever happens to the source
    meanwhile (the host's checkpointer may still write its pages). For a storage that
    cannot hand its file over (:func:`base_digests` is the path of one that can).

    With the real file layer, ``dst_fd`` is first made a clone of the source
    (:func:`clone_file`); where that works the pages are only read back from the clone
    for their digests. A swapped-in layer (fault injection, the power-loss layer) sees
    every write, so it always gets the byte copy."""
    io = io or fileio.layer()
    size = os.fstat(src_fd).st_size // page_size * page_size
    io.ftruncate(dst_fd, 0)
    if type(io) is fileio.FileLayer and size > 0 and clone_file(src_fd, dst_fd):
        # the clone holds the source as it was at the ioctl: whole pages up to ``size``
        # (fewer if the source shrank before it; a longer clone is cut back), and the
        # digests are read from it, not from the source
        io.ftruncate(dst_fd, min(size, os.fstat(dst_fd).st_size // page_size * page_size))
        return base_digests(dst_fd, page_size, io=io, progress=progress)
    off, out = 0, []
    for n, view in _blocks(src_fd, size, page_size):
        out.append(page_digests(view[:n], page_size))
        done = 0
        while done < n:             # in page-cache-friendly pieces (fileio.WRITE_SLICE)
            done += io.pwrite(dst_fd, view[done:min(n, done + fileio.WRITE_SLICE)], off + done)
        off += n
        if progress is not None:
            progress(off)
        crashpoint("demander.mid_base_copy")
    if off and type(io) is fileio.FileLayer:
        # The copy is in the page cache; the install's fsync would write all of it. Hand
        # it to the device now, so that it goes out while the supplier answers and the
        # pages arrive, and that fsync waits only for what is left (a hint: durability
        # still comes from the fsync alone; checkpoint/writeback.py).
        from checkpoint.writeback import start_writeback
        start_writeback(dst_fd, 0, off)
    return b"".join(out)


def base_digests(fd: int, page_size: int, *, io: fileio.FileLayer | None = None,
                 progress: Callable[[int], None] | None = None) -> bytes:
    """The digests of the whole pages of the temp file ``fd``, which already holds the
    base: this side's older copy handed over by its store (``adopt_base``), or what an
    earlier fetch of the partition left there. A partial last page is cut off. Nothing
    is written: the fetch then writes the received pages over the base in place."""
    io = io or fileio.layer()
    length = os.fstat(fd).st_size
    size = length // page_size * page_size
    if size != length:
        io.ftruncate(fd, size)
    off, out = 0, []
    for n, view in _blocks(fd, size, page_size):
        out.append(page_digests(view[:n], page_size))
        off += n
        if progress is not None:
            progress(off)
        crashpoint("demander.mid_base_copy")
    if off != size:
        raise OSError(errno.EIO, f"the base ended at {off} of {size} bytes")
    return b"".join(out)


def _blocks(fd: int, size: int, page_size: int) -> Iterator[tuple[int, memoryview]]:
    """(whole-page bytes read, buffer) for ``[0, size)`` of ``fd``, a block at a time
    (one buffer, reused); ends early where the file is shorter."""
    step = max(page_size, BLOCK // page_size * page_size)
    view = memoryview(bytearray(step))
    off = 0
    while off < size:
        n = os.preadv(fd, [view[:min(step, size - off)]], off)
        n -= n % page_size
        if n <= 0:
            return                             # shorter than it was: what is read is the base
        yield n, view
        off += n


def snapshot_digests(fd: int, path: str, page_size: int, page_count: int,
                     preimages: Callable[[], dict[int, bytes]]) -> bytes:
    """The digest of each page ``0 <= i < page_count`` of the file at ``fd`` as of C:
    the bytes read now, with every pre-image known after the read put over its page (a
    page overwritten after C has its pre-image saved before the overwrite, so a read
    that saw post-C bytes is corrected)."""
    size = page_count * page_size
    step = max(page_size, BLOCK // page_size * page_size)
    buf = bytearray(step)
    view = memoryview(buf)
    out: list[bytes] = []
    for off in range(0, size, step):
        n = min(step, size - off)
        if os.preadv(fd, [view[:n]], off) != n:
            raise TransferError(f"{path} is shorter than its snapshot ({size} bytes, at offset {off})")
        pre = preimages()
        if pre:
            first = off // page_size
            for page in range(first, first + n // page_size):
                img = pre.get(page)
                if img is not None:
                    lo = (page - first) * page_size
                    view[lo:lo + page_size] = img[:page_size]
        out.append(page_digests(view[:n], page_size))
    return b"".join(out)


def diff_ranges(base: bytes, mine: bytes, *, gap: int = COALESCE_GAP,
                max_pages: int = RANGE_PAGES_MAX) -> list[tuple[int, int]]:
    """(first page, page count) of the pages of ``mine`` (the supplier's digests) that
    differ from ``base`` or lie beyond it, ascending; ranges closer than ``gap`` equal
    pages are joined, and none is longer than ``max_pages``. Equal stretches are
    skipped a block at a time (one bytes comparison), so an unchanged file costs one
    pass of ``memcmp``."""
    mine_pages = len(mine) // DIGEST
    common = min(len(base), len(mine)) // DIGEST
    diff: list[int] = []
    per = BLOCK // DIGEST // 16 or 1          # pages compared at once
    for lo in range(0, common, per):
        hi = min(common, lo + per)
        if base[lo * DIGEST:hi * DIGEST] == mine[lo * DIGEST:hi * DIGEST]:
            continue
        for i in range(lo, hi):
            a = i * DIGEST
            if base[a:a + DIGEST] != mine[a:a + DIGEST]:
                diff.append(i)
    diff.extend(range(common, mine_pages))
    out: list[tuple[int, int]] = []
    for i in diff:
        if out:
            first, count = out[-1]
            if i - (first + count) <= gap and i - first < max_pages:
                out[-1] = (first, i - first + 1)
                continue
        out.append((i, 1))
    return out


def pages_in(ranges: list[tuple[int, int]]) -> int:
    return sum(n for _, n in ranges)


__all__ = ["DIGEST", "DIGEST_ALGO", "base_digests", "clone_file", "copy_base", "diff_ranges", "page_digests", "pages_in",
           "root", "snapshot_digests"]
