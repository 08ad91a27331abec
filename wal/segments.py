"""The log directory: listing segments, checking their headers, cutting new ones,
and the one-writer lock.

A new segment is written as ``<name>.tmp`` (header only), fsynced, renamed into place
and the directory fsynced, so a segment file that exists always has a whole header;
a ``.tmp`` left by a crash is removed by the next writer. Segments are only ever
removed from the front (:meth:`Wal.truncate_before`), one directory fsync per
removal, so the surviving segments are always a gap-free run of sequence numbers.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from dataclasses import dataclass

import faults
from faults.fileio import FileLayer

from .errors import CorruptRecordError, OutOfDiskError, SegmentNotAFileError, WalLockedError
from .format import (HEADER_SIZE, TMP_SUFFIX, SegmentHeader, looks_like_segment,
                     parse_segment_name, segment_name)

LOCK_NAME = "LOCK"


@dataclass(frozen=True)
class SegmentFile:
    seq: int
    first_lsn: int
    path: str


class OpenSegment:
    """A segment as the writer (and its in-process readers) know it."""

    __slots__ = ("seq", "first_lsn", "path", "size", "complete", "fd", "pins", "retired")

    def __init__(self, seq: int, first_lsn: int, path: str, size: int, fd: int) -> None:
        self.seq = seq
        self.first_lsn = first_lsn
        self.path = path
        self.size = size           # end of the last whole frame written: readers' limit
        self.complete = False      # set (after the final size) when the next segment exists
        self.fd = fd
        self.pins = 0              # 1 while the group-commit thread fsyncs this fd
        self.retired = False       # the writer is done with it; close fd once unpinned


def list_segments(directory: str) -> list[SegmentFile]:
    """The segments of ``directory`` in sequence order; raises on a name that claims
    to be a segment but does not parse, and on a gap in the sequence."""
    try:
        # scandir: the entry's type comes with the listing (no stat per segment; readers
        # in other processes list the directory at every poll)
        with os.scandir(directory) as it:
            entries = [(e.name, e.is_file()) for e in it]
    except FileNotFoundError:
        from .errors import WalError
        raise WalError(f"write-ahead log directory {directory} does not exist") from None
    segs: list[SegmentFile] = []
    for name, is_file in entries:
        parsed = parse_segment_name(name)
        if not is_file and (parsed is not None or looks_like_segment(name)):
            _check_regular(os.path.join(directory, name))
        if parsed is None:
            if looks_like_segment(name):
                raise CorruptRecordError(
                    os.path.join(directory, name), 0,
                    "file name ends in .wal but is not <seq:016x>-<first_lsn:016x>.wal; "
                    "rename or move it out of the log directory")
            continue   # LOCK, *.tmp, files that are not ours
        segs.append(SegmentFile(parsed[0], parsed[1], os.path.join(directory, name)))
    segs.sort(key=lambda s: s.seq)
    for a, b in zip(segs, segs[1:]):
        if b.seq != a.seq + 1:
            raise CorruptRecordError(
                b.path, 0, f"segment(s) with sequence {a.seq + 1}..{b.seq - 1} are missing "
                f"between {os.path.basename(a.path)} and this one")
        if b.first_lsn < a.first_lsn:
            raise CorruptRecordError(
                b.path, 0, f"first LSN {b.first_lsn} is below the previous segment's "
                f"first LSN {a.first_lsn}")
    return segs


def _check_regular(path: str) -> None:
    """Raise :class:`SegmentNotAFileError` unless ``path`` is a regular file (or a link
    to one): opening a directory or a FIFO would fail, or block, deep inside a read."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            raise SegmentNotAFileError(path, "a symbolic link to nothing") from None
        return                      # removed meanwhile (truncate_before): not ours to judge
    if stat.S_ISREG(mode):
        return
    kind = "a directory" if stat.S_ISDIR(mode) else \
        "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
    raise SegmentNotAFileError(path, kind)


def read_header(fd: int, seg: SegmentFile) -> SegmentHeader:
    """Read and check the header of an open segment against its name."""
    data = os.pread(fd, HEADER_SIZE, 0)
    hdr = SegmentHeader.decode(data)
    if isinstance(hdr, str):
        raise CorruptRecordError(seg.path, 0, hdr)
    if hdr.seq != seg.seq or hdr.first_lsn != seg.first_lsn:
        raise CorruptRecordError(
            seg.path, 0, f"header says sequence {hdr.seq}, first LSN {hdr.first_lsn}; "
            f"the file name says {seg.seq}, {seg.first_lsn}")
    return hdr


def create_segment(directory: str, seq: int, first_lsn: int, prev_crc: int,
                   io: FileLayer) -> SegmentFile:
    """Cut a new segment atomically (temp file, fsync, rename, directory fsync)."""
    path = os.path.join(directory, segment_name(seq, first_lsn))
    tmp = path + TMP_SUFFIX
    data = SegmentHeader(seq, first_lsn, prev_crc).encode()
    try:
        fd = io.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            faults.fileio.write_all(fd, data, tmp, error=OutOfDiskError, io=io)
            io.fsync(fd)
        finally:
            io.close(fd)
        io.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            io.unlink(tmp)
        raise
    try:
        io.fsync_dir(directory)
    except BaseException:
        # The cut is refused (no descriptor left to open the directory ...) and the
        # writer goes on in the old segment: a new one left behind, empty, would claim
        # the LSNs the old one is about to get.
        with contextlib.suppress(OSError):
            io.unlink(path)
        raise
    return SegmentFile(seq, first_lsn, path)


def remove_temp_files(directory: str, io: FileLayer) -> None:
    """Segments a crash left half-cut (never renamed, so never part of the log)."""
    for name in os.listdir(directory):
        if name.endswith(TMP_SUFFIX):
            io.unlink(os.path.join(directory, name))


class DirLock:
    """``flock`` on ``DIR/LOCK``: one writer per directory, across processes and
    within one (flock conflicts between separate opens of the file). The lock dies
    with the process, so a crashed writer never leaves a stale lock behind."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, LOCK_NAME)
        # The lock file holds no durable state, so it does not go through the seam.
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = ""
            with contextlib.suppress(OSError):
                holder = os.pread(self.fd, 64, 0).decode("ascii", "replace").strip()
            os.close(self.fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise WalLockedError(directory, holder) from None
            raise
        with contextlib.suppress(OSError):   # only informative; a full disk must not stop us
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, f"pid {os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1
