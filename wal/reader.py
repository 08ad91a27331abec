"""Reading the log: ``read_from`` (to the current end) and ``follow`` (waits for more).

One cursor serves two kinds of source:

* :class:`WriterSource`, readers inside the writer's process: the writer publishes, per
  segment, the end of its last whole frame after each write, so a reader never reads
  past it and anything bad before it is corruption.
* :class:`DirSource`, readers in another process (``Wal.reader(path)``): the end is the
  file size, which may cut a frame that the writer is still copying in, or a torn tail a
  crashed writer left. A frame that does not check out at the live end is treated as
  "not there yet" when it looks torn (see :func:`tail.classify_tail`) and re-read on
  the next poll, and as corruption when it does not; a segment is complete (its end
  final) once a segment with the next sequence exists.

Readers take no lock of the writer and use their own file descriptors (``pread``), so
writes beat reads: a reader can fall behind, never hold an append up. Blocks are read
128 KiB at a time (one syscall per ~1000 small records; bigger blocks measured slower:
the block and its thousands of records fall out of the CPU caches), and decoded one
block at a time into a list: iterating a :class:`Follower` chains those lists in C
(``itertools.chain``), and :meth:`Follower.batches` hands them out as they are.
"""
from __future__ import annotations

import itertools
import os
import threading
import time
from typing import TYPE_CHECKING, Generator, Iterator, Protocol, Sequence, cast

from .decoder import BlockState, RawRecord, Record, Stop, as_record, decode_block
from .errors import CorruptRecordError, PositionMismatch, WalError
from .format import HEADER_SIZE
from .position import Position
from .segments import OpenSegment, SegmentFile, list_segments, read_header
from .tail import classify_tail

if TYPE_CHECKING:
    from .writer import SegmentWriter    # the log (log.Wal), which imports this module

BLOCK = 128 << 10
_BAD = (Stop.BAD_CRC, Stop.BAD_LSN, Stop.BAD_BODY)   # a whole frame that is not acceptable


class _Seg(Protocol):
    # read-only: SegmentFile is a frozen dataclass
    @property
    def seq(self) -> int: ...
    @property
    def first_lsn(self) -> int: ...
    @property
    def path(self) -> str: ...


class Source(Protocol):
    trusted: bool      # True: the end offsets are whole-frame boundaries

    def segments(self) -> Sequence[_Seg]: ...

    def end(self, seg: _Seg, fd: int) -> int: ...

    def complete(self, seg: _Seg) -> bool: ...

    def progressed(self) -> None:
        """A record was read: a polling source polls soon again."""

    def wait(self, next_lsn: int, timeout: float) -> bool:
        """Wait up to ``timeout`` s for news; False when the source is closed."""


class DirSource:
    """A log directory as seen by a reader in any process."""

    trusted = False
    POLL_MIN = 0.0002
    POLL_MAX = 0.02

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._poll = self.POLL_MIN

    def segments(self) -> list[SegmentFile]:
        return list_segments(self.directory)

    def end(self, seg: _Seg, fd: int) -> int:
        return os.fstat(fd).st_size

    def complete(self, seg: _Seg) -> bool:
        return any(s.seq > seg.seq for s in self.segments())

    def progressed(self) -> None:
        self._poll = self.POLL_MIN

    def wait(self, next_lsn: int, timeout: float) -> bool:
        # Polling with back-off: cheap (one fstat per poll) and needs nothing from the
        # writer, which may be another process, or none at all for a while.
        time.sleep(min(self._poll, timeout))
        self._poll = min(self._poll * 2, self.POLL_MAX)
        return True


class WriterSource:
    """The writer's own view, for readers in its process (see ``Wal``)."""

    trusted = True

    def __init__(self, wal: SegmentWriter) -> None:
        self.wal = wal

    def segments(self) -> Sequence[_Seg]:
        return list(self.wal._segs)

    # The segments handed back are the log's own, as listed by segments().
    def end(self, seg: _Seg, fd: int) -> int:
        return cast(OpenSegment, seg).size

    def complete(self, seg: _Seg) -> bool:
        return cast(OpenSegment, seg).complete

    def progressed(self) -> None:
        pass

    def wait(self, next_lsn: int, timeout: float) -> bool:
        return self.wal._wait_appended(next_lsn, timeout)


class Follower:
    """Iterator over records from ``lsn`` on that waits for new ones.

    Ends when ``close()`` is called (from any thread), when the writer closes (same
    process), or after ``timeout`` seconds without a new record when one was given.
    Iterate it for :class:`Record` objects, or call :meth:`batches` for lists of plain
    ``(lsn, type, payload)`` tuples (one list per block read; the fastest replay) -- one
    or the other, not both."""

    def __init__(self, source: Source, lsn: int | None, *, follow: bool = True,
                 timeout: float | None = None, at: Position | None = None) -> None:
        self._stop = threading.Event()
        self._gen = _batches(source, lsn, follow, timeout, self._stop, at)
        # Per record, chaining lists and mapping as_record cost C calls only, where a
        # generator would resume a Python frame (or two, through ``yield from``).
        self._it = map(as_record, itertools.chain.from_iterable(self._gen))

    def __iter__(self) -> Iterator[Record]:
        return self._it

    def __next__(self) -> Record:
        return next(self._it)

    def batches(self) -> Generator[list[RawRecord], None, None]:
        """The records as non-empty lists of ``(lsn, type, payload)`` tuples, in order,
        as they are decoded (a tuple compares equal to the :class:`Record` it stands for)."""
        return self._gen

    def close(self) -> None:
        self._stop.set()

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        self._gen.close()


def _open_segment(source: Source, seg: _Seg) -> tuple[int, int, int]:
    """Open a segment for reading; (fd, prev_crc, frame version) after checking its
    header."""
    try:
        fd = os.open(seg.path, os.O_RDONLY)
    except FileNotFoundError:
        raise WalError(f"segment {seg.path} was removed while being read (truncate_before "
                       f"dropped the records below LSN {seg.first_lsn} or later)") from None
    try:
        hdr = read_header(fd, SegmentFile(seg.seq, seg.first_lsn, seg.path))
    except BaseException:
        os.close(fd)
        raise
    return fd, hdr.prev_crc, hdr.version


def _locate(source: Source, start: int | None) -> tuple[_Seg, int] | None:
    segs = source.segments()
    if not segs:
        return None
    if start is None:
        start = segs[0].first_lsn
    if start < segs[0].first_lsn:
        raise WalError(f"records below LSN {segs[0].first_lsn} were truncated; cannot read "
                       f"from LSN {start}")
    seg = segs[0]
    for s in segs:
        if s.first_lsn <= start:
            seg = s
    return seg, start


def _enter(source: Source, at: Position, start: int | None) -> tuple[_Seg, int, int, int, int]:
    """(segment, fd, offset, chain value, version) to read from ``at`` on."""
    if start is not None and start < at.lsn:
        raise ValueError(f"position at LSN {at.lsn} is past the first LSN wanted ({start})")
    seg = next((s for s in source.segments() if s.seq == at.seq), None)
    if seg is None or seg.first_lsn != at.first_lsn or at.lsn < at.first_lsn:
        raise PositionMismatch(f"no segment {at.seq} starting at LSN {at.first_lsn} holds "
                               f"LSN {at.lsn}")
    fd, _crc, version = _open_segment(source, seg)
    if not HEADER_SIZE <= at.offset <= source.end(seg, fd):
        os.close(fd)
        raise PositionMismatch(f"offset {at.offset} is outside segment {seg.path}")
    return seg, fd, at.offset, at.prev_crc, version


def _batches(source: Source, start: int | None, follow: bool, timeout: float | None,
             stop: threading.Event, at: Position | None = None) -> Generator[list[RawRecord], None, None]:
    last_progress = time.monotonic()

    def keep_waiting(next_lsn: int) -> bool:
        if not follow or stop.is_set():
            return False
        left = None if timeout is None else timeout - (time.monotonic() - last_progress)
        if left is not None and left <= 0:
            return False
        return source.wait(next_lsn, 0.1 if left is None else min(left, 0.1)) \
            and not stop.is_set()

    if at is not None:
        seg, fd, off, crc, version = _enter(source, at, start)
        lsn, entered = at.lsn, True
        start = at.lsn if start is None else start
    else:
        found = _locate(source, start)
        while found is None:
            if not keep_waiting(start or 1):
                return
            found = _locate(source, start)
        seg, start = found
        fd, crc, version = _open_segment(source, seg)
        off, lsn, entered = HEADER_SIZE, seg.first_lsn, False
    try:
        pending = b""
        state = BlockState()
        confirm = -1            # offset of a corruption found once, being read again
        while True:
            end = source.end(seg, fd)
            pos = off + len(pending)
            bad = False
            if end > pos:
                want = min(end - pos, max(BLOCK, state.frame_end - state.off - len(pending)))
                data = os.pread(fd, want, pos)
                buf = pending + data if pending else data
                before = lsn
                recs = decode_block(buf, 0, crc, lsn, state, start, version)
                if entered and state.lsn != lsn:
                    entered = False     # the position's frame continued the chain
                if recs:
                    yield recs
                off += state.off
                crc, lsn = state.crc, state.lsn
                pending = buf[state.off:]
                if lsn != before:
                    last_progress = time.monotonic()
                    source.progressed()
                bad = state.stop in _BAD
                if not bad and off + len(pending) < end:
                    continue        # more bytes already there
            if pending or bad:
                if bad and not source.trusted:
                    # Torn or not depends on everything after the bad frame (tail.py):
                    # read the rest of the file as it is now, in one go. (A frame that is
                    # merely short is not "bad": the loop above read up to the end.)
                    have = off + len(pending)
                    now = source.end(seg, fd)
                    if now > have:
                        pending += os.pread(fd, now - have, have)
                if source.trusted or source.complete(seg):
                    if not source.trusted and source.end(seg, fd) > off + len(pending):
                        continue    # completed while we looked: read the rest first
                    why = "segment ends inside a frame" if not bad else \
                        classify_tail(pending, off, _rebased(state), version) or "CRC mismatch"
                    if entered:
                        # no frame at the position continued its chain value and LSN:
                        # a position of another log (or none), not a damaged log
                        raise PositionMismatch(f"the frame at offset {off} of {seg.path} does "
                                               f"not continue the given position ({why})")
                    raise CorruptRecordError(seg.path, off, why)
                corrupt = classify_tail(pending, off, _rebased(state), version)
                if corrupt is not None:
                    if confirm != off:
                        # Read in two parts: a crashed writer's torn tail may have been
                        # cut and written over in between. Read it again from here, in
                        # one piece, before calling it corrupt.
                        confirm = off
                        pending, state = b"", BlockState()
                        continue
                    raise CorruptRecordError(seg.path, off, corrupt)
                pending = b""       # torn or still being written: re-read next time
                state = BlockState()
                if not keep_waiting(lsn):
                    return
                continue
            if source.complete(seg):
                if source.end(seg, fd) > off:
                    continue        # it grew before it was completed
                try:
                    seg, fd, crc, version = _next_segment(source, seg, fd, lsn, crc)
                except CorruptRecordError as e:
                    if entered:         # a position at a segment's end, of another chain
                        raise PositionMismatch(f"the segment after {seg.path} does not "
                                               f"continue the given position: {e.reason}") from None
                    raise
                off, pending = HEADER_SIZE, b""
                continue
            if not keep_waiting(lsn):
                return
    finally:
        os.close(fd)


def _rebased(state: BlockState) -> BlockState:
    """``state`` with offsets relative to the unconsumed bytes (``pending``)."""
    s = BlockState()
    s.off, s.crc, s.lsn, s.stop = 0, state.crc, state.lsn, state.stop
    s.frame_end = state.frame_end - state.off
    return s


def _next_segment(source: Source, seg: _Seg, fd: int, lsn: int,
                  crc: int) -> tuple[_Seg, int, int, int]:
    """Step from a complete segment to its successor, checking that the chain (LSN and
    CRC) runs on across the file boundary."""
    nxt = next((s for s in source.segments() if s.seq == seg.seq + 1), None)
    if nxt is None:
        raise CorruptRecordError(seg.path, 0, f"segment {seg.seq + 1} after this one is missing")
    if nxt.first_lsn != lsn:
        raise CorruptRecordError(nxt.path, 0, f"first LSN {nxt.first_lsn}, but the previous "
                                 f"segment ends at LSN {lsn - 1}")
    nfd, prev_crc, version = _open_segment(source, nxt)
    if prev_crc != crc:
        os.close(nfd)
        raise CorruptRecordError(nxt.path, 0, f"header continues the CRC chain from "
                                 f"{prev_crc:#010x}, the previous segment ends at {crc:#010x}")
    os.close(fd)
    return nxt, nfd, crc, version
