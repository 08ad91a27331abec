"""Opening after a crash, verifying, and repairing with a backup.

* :func:`recover` (every writer open): check every segment header, scan the last
  segment, cut off a torn tail (fsynced), raise :class:`CorruptRecordError` for
  anything else. Only the last segment can be torn: a segment gets a successor only
  after it was fsynced whole.
* :func:`verify` (``ferry wal verify``): scan everything, report the first problem.
* :func:`repair` (``ferry wal repair --backup``): copy the directory, then cut the log
  at the first corruption, dropping everything after it. Never done implicitly.
"""
from __future__ import annotations

import contextlib
import logging
import mmap
import os
import shutil
from dataclasses import dataclass, field
from typing import Iterator, cast

import faults
from faults.fileio import FileLayer

from .decoder import Stop, scan
from .errors import CorruptRecordError, WalError
from .format import HEADER_SIZE, VERSION, SegmentHeader, looks_like_segment, parse_segment_name
from .position import Position
from .segments import (LOCK_NAME, DirLock, SegmentFile, create_segment, list_segments,
                       read_header)
from .tail import classify_tail

log = logging.getLogger("ferry.wal")


@dataclass
class Tail:
    segments: list[SegmentFile]
    size: int          # valid bytes of the last segment
    crc: int           # chain CRC after its last frame
    next_lsn: int
    version: int = VERSION   # frame format of the last segment


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@contextlib.contextmanager
def _mapped(path: str) -> Iterator[mmap.mmap]:
    """The file's bytes, mapped read-only: the scan reads them straight from the page
    cache instead of copying a whole segment (up to 64 MiB at every writer open) into
    fresh memory first, which took 4x as long as the scan itself (docs/formats.md,
    "Torn tail vs corruption"). Only for a segment whose header was read (never
    empty), while the directory's lock is held, so nothing truncates it meanwhile."""
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            yield mm
        finally:
            mm.close()


def recover(directory: str, io: FileLayer, start: Position | None = None) -> Tail | None:
    """Validate the log in ``directory`` and cut a torn tail; None when it is empty.

    ``start``: a frame boundary known good (``Wal.open(..., start=)``, the store's
    ``wal.start``). When it lies in the last segment and its frame continues its chain
    value and LSN, the last segment is checked from there, not from its start (what
    lies before it is not read at open, as the older segments are not); otherwise, or
    when nothing after it checks out, from its start."""
    segs = list_segments(directory)
    if not segs:
        return None
    for seg in segs:
        fd = os.open(seg.path, os.O_RDONLY)
        try:
            read_header(fd, seg)
        finally:
            os.close(fd)
    last = segs[-1]
    with _mapped(last.path) as data:
        hdr = SegmentHeader.decode(data[:HEADER_SIZE])
        assert isinstance(hdr, SegmentHeader)   # read_header passed above
        # the scan reads its buffer only by slices and memoryviews, which a map serves
        state = None
        if start is not None and (start.seq, start.first_lsn) == (last.seq, last.first_lsn) \
                and HEADER_SIZE <= start.offset <= len(data):
            state = scan(cast(bytes, data), start.offset, start.prev_crc, start.lsn, hdr.version)
            if state.stop is not Stop.END and state.off == start.offset:
                state = None        # not a boundary of this log (or torn right there)
        if state is None:
            state = scan(cast(bytes, data), HEADER_SIZE, hdr.prev_crc, hdr.first_lsn, hdr.version)
        # a torn or damaged tail (rare) is classified on a copy: that looks at the bytes
        # with every method of bytes
        why = None if state.stop is Stop.END else classify_tail(bytes(data), 0, state, hdr.version)
        size = len(data)
    if state.stop is not Stop.END:
        if why is not None:
            raise CorruptRecordError(last.path, state.off, why)
        log.warning("write-ahead log %s: cutting a torn tail of %d bytes at offset %d "
                    "(an append a crash interrupted; it was never acknowledged)",
                    last.path, size - state.off, state.off)
        fd = io.open(last.path, os.O_WRONLY)
        try:
            io.ftruncate(fd, state.off)
            io.fsync(fd)
        finally:
            io.close(fd)
    return Tail(segs, state.off, state.crc, state.lsn, hdr.version)


@dataclass
class Report:
    """What :func:`verify` found. ``corruption`` is (path, offset, reason) of the first
    damage; ``torn`` is (path, offset, bytes) of a torn tail a writer's open will cut."""

    directory: str
    segments: int = 0
    records: int = 0
    first_lsn: int | None = None
    last_lsn: int | None = None
    torn: tuple[str, int, int] | None = None
    corruption: tuple[str, int, str] | None = None
    files: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.corruption is None

    def as_dict(self) -> dict[str, object]:
        return {
            "directory": self.directory, "ok": self.ok, "segments": self.segments,
            "records": self.records, "first_lsn": self.first_lsn, "last_lsn": self.last_lsn,
            "torn_tail": None if self.torn is None else
            {"file": self.torn[0], "offset": self.torn[1], "bytes": self.torn[2]},
            "corruption": None if self.corruption is None else
            {"file": self.corruption[0], "offset": self.corruption[1],
             "reason": self.corruption[2]},
        }


def verify(directory: str) -> Report:
    """Check every segment and frame of the log (read-only)."""
    rep = Report(os.path.abspath(directory))
    try:
        segs = list_segments(directory)
    except CorruptRecordError as e:
        rep.corruption = (e.path, e.offset, e.reason)
        return rep
    rep.segments = len(segs)
    rep.files = [s.path for s in segs]
    crc = lsn = None
    for i, seg in enumerate(segs):
        data = _read_file(seg.path)
        hdr = SegmentHeader.decode(data)
        if isinstance(hdr, str) or hdr.seq != seg.seq or hdr.first_lsn != seg.first_lsn:
            rep.corruption = (seg.path, 0, hdr if isinstance(hdr, str)
                              else "header does not match the file name")
            return rep
        if lsn is not None and (hdr.first_lsn != lsn or hdr.prev_crc != crc):
            rep.corruption = (seg.path, 0, "segment does not continue the previous one "
                              f"(expected first LSN {lsn}, chain CRC {crc:#010x})")
            return rep
        if rep.first_lsn is None:
            rep.first_lsn = hdr.first_lsn
        state = scan(data, HEADER_SIZE, hdr.prev_crc, hdr.first_lsn, hdr.version)
        rep.records += state.lsn - hdr.first_lsn
        crc, lsn = state.crc, state.lsn
        if state.stop is not Stop.END:
            last = i == len(segs) - 1
            why = classify_tail(data, 0, state, hdr.version) if last else \
                "damaged frame in a segment that is not the last (it was fsynced whole)"
            if why is not None:
                rep.corruption = (seg.path, state.off, why)
                return rep
            rep.torn = (seg.path, state.off, len(data) - state.off)
    if lsn is not None:
        rep.last_lsn = lsn - 1
    return rep


def repair(directory: str, backup: str) -> list[str]:
    """Copy the log to ``backup``, then cut it at its first corruption: truncate the
    damaged segment there and delete every later segment (their chain hangs off the
    lost records). Returns what was done, one line per action."""
    directory = os.path.abspath(directory)
    lock = DirLock(directory)      # no writer may run while we cut
    try:
        return _repair_locked(directory, backup)
    finally:
        lock.release()


def _repair_locked(directory: str, backup: str) -> list[str]:
    if os.path.exists(backup) and os.listdir(backup):
        raise WalError(f"backup directory {backup} exists and is not empty; give a new one")
    shutil.copytree(directory, backup, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns(LOCK_NAME))
    done = [f"copied {directory} to {os.path.abspath(backup)}"]
    for _ in range(10_000):
        rep = verify(directory)
        if rep.corruption is None:
            break
        done += _cut_at(directory, *rep.corruption)
    else:
        raise WalError(f"repair of {directory} did not converge")
    return done


def _cut_at(directory: str, path: str, offset: int, reason: str) -> list[str]:
    io = faults.fileio.layer()
    names = sorted(os.listdir(directory))
    bad_names = [n for n in names if looks_like_segment(n) and parse_segment_name(n) is None]
    if bad_names:
        for n in bad_names:
            io.unlink(os.path.join(directory, n))
        io.fsync_dir(directory)
        return [f"removed {n} (not a segment name)" for n in bad_names]
    segs = sorted((SegmentFile(*p, os.path.join(directory, n))
                   for n in names if (p := parse_segment_name(n)) is not None),
                  key=lambda s: s.seq)
    cut = next(i for i, s in enumerate(segs) if s.path == path)
    actions = []
    # Later segments first, each removal durable, so a crash during repair never
    # leaves a gap in the sequence.
    for s in reversed(segs[cut + 1:]):
        io.unlink(s.path)
        io.fsync_dir(directory)
        actions.append(f"removed {s.path} (after the corruption)")
    if offset < HEADER_SIZE:
        bad = segs[cut]
        io.unlink(path)
        io.fsync_dir(directory)
        actions.append(f"removed {path} (damaged header: {reason})")
        if cut == 0:
            # Keep the LSNs going: an empty first segment where the name said it began.
            create_segment(directory, bad.seq, bad.first_lsn, 0, io)
            actions.append(f"created an empty segment starting at LSN {bad.first_lsn}")
    else:
        fd = io.open(path, os.O_WRONLY)
        try:
            io.ftruncate(fd, offset)
            io.fsync(fd)
        finally:
            io.close(fd)
        actions.append(f"truncated {path} at offset {offset} ({reason})")
    return actions


__all__ = ["Tail", "Report", "recover", "verify", "repair"]
