"""The writer: :class:`Wal` (append, durability, segment cuts, truncation).

Concurrency, in one place:

* The writer's state (current segment, LSN, CRC chain, durable LSN, the committer's
  pending batch) changes only under ``_lock``. Under it a record gets its LSN, its frame
  (CRC chained to the previous one) and its ``write`` to the OS, and then the segment's
  published end moves past it. Readers never take it (see ``reader.py``). The lock is
  taken on every append even with one appending thread: a lock-free path for a single
  owner thread (a Dekker handshake on two flags, safe under the GIL) was tried and
  measured no faster -- finding out which thread calls costs what the uncontended
  lock does.
* Durability in mode ``group`` (and ``wait_durable``/``sync`` in any mode) is the sync
  threads of ``groupcommit.py``: ``append`` queues its record there without taking
  ``_lock`` (a sync thread writes it, under ``_lock``, just before its fsync) and waits
  on its own ticket.
  In mode ``always`` the appender fsyncs under the lock, before it returns.
* A segment being fsynced by the sync thread is *pinned*: a cut that retires it
  meanwhile leaves its descriptor open and the sync thread closes it when done (else
  it could fsync a closed, or reused, descriptor number).
* ``append``'s frame (pack, chained CRC, mix, one ``write``) is one call into
  ``wal/_accel.c`` when that optional extension is built and the file layer is the
  real one (``accel.py``); everything around it -- lock, state, cuts, errors -- is this
  module's Python either way, and both paths write the same bytes.
* The first failure of a write (other than a full disk, which is rolled back) or of an
  fsync is latched: every later call raises it. Retrying an fsync after an error can
  report success for data the kernel dropped, so the log refuses instead.
"""
from __future__ import annotations

import os
import struct
from typing import Iterable, Iterator, Sequence

from faults.crc import crc32c

from faults.fileio import WRITE_SLICE

from . import groupcommit
from .decoder import RawRecord
from .format import (CHECK, CHECK_HEAD, FRAME_HEADER_SIZE, HEAD, HEADER_SIZE, MAX_PAYLOAD,
                     MAX_TYPE, check_type, mix)
from .position import Position
from .reader import Follower, WriterSource
from .segments import OpenSegment
from .tickets import Ticket
from .walreader import WalReader as WalReader, follow_dir as follow_dir  # re-exported
from .writer import SegmentWriter

MODES = ("always", "group", "none")
DEFAULT_SEGMENT_SIZE = 64 << 20
_ALWAYS, _GROUP = 1, 2             # SegmentWriter._ack of modes always, group
MAX_SEGMENT_SIZE = MAX_PAYLOAD      # so a too-big payload can only take the slow path


class Wal(SegmentWriter):
    """A segmented write-ahead log in one directory (one writer, any readers).

    Use :meth:`open` for the writer and :meth:`reader` for a read-only view that works
    from any process."""

    def __init__(self, *, _token: object = None) -> None:
        if _token is not _OPEN:
            raise TypeError("use Wal.open(path) or Wal.reader(path)")

    # -- opening -------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str], *, segment_size: int = DEFAULT_SEGMENT_SIZE,
             sync: str = "group", first_lsn: int = 1, start: Position | None = None) -> Wal:
        """Open (creating if needed) the log in ``path`` for writing.

        ``sync``: ``always`` (each acknowledged append fsynced on its own), ``group``
        (acknowledged appends fsynced, concurrent ones share an fsync), ``none``
        (acknowledged once written to the OS; survives a process crash, not a power cut).
        ``first_lsn`` is the LSN of the first record of a *new* log; an existing log keeps
        its LSNs. A torn tail of the last segment is cut off; any other damage raises
        :class:`CorruptRecordError`. ``start``: a frame boundary known good (a
        :meth:`position` taken by an earlier writer); the last segment is then checked
        from there when it describes it, not from its start."""
        if sync not in MODES:
            raise ValueError(f"sync must be one of {', '.join(MODES)}, got {sync!r}")
        if segment_size < HEADER_SIZE + FRAME_HEADER_SIZE:
            raise ValueError(f"segment_size {segment_size} is too small")
        if segment_size > MAX_SEGMENT_SIZE:
            raise ValueError(f"segment_size {segment_size} is above the maximum "
                             f"{MAX_SEGMENT_SIZE} (4 GiB)")
        if first_lsn < 1:
            raise ValueError(f"first_lsn must be >= 1, got {first_lsn}")
        self = cls(_token=_OPEN)
        self._start(path, segment_size, sync, first_lsn, start)
        return self

    @staticmethod
    def reader(path: str | os.PathLike[str]) -> WalReader:
        """A read-only view of the log in ``path``, usable from any process while a
        writer appends (takes no lock, changes nothing)."""
        return WalReader(path)

    # -- properties ----------------------------------------------------------------
    @property
    def first_lsn(self) -> int:
        """LSN of the oldest record kept (``last_lsn + 1`` when the log is empty)."""
        return self._segs[0].first_lsn

    @property
    def last_lsn(self) -> int:
        """LSN of the newest record written (``first_lsn - 1`` when empty)."""
        return self._last_lsn

    @property
    def failure(self) -> BaseException | None:
        """What made the log unusable (a failed fsync ...), None while it works."""
        return self._failed

    @property
    def durable_lsn(self) -> int:
        """Every record up to this LSN is fsynced."""
        return self._durable_lsn

    # -- appending -----------------------------------------------------------------
    def append(self, payload: bytes, type: int = 0, *, wait: bool = True) -> int:
        """Append one record; return its LSN.

        ``wait=False`` returns as soon as the record is written, in order, to the OS
        (not fsynced): release your own lock, then :meth:`wait_durable`. With
        ``wait=True`` it returns once the record is durable as the mode promises."""
        if self._ack == _GROUP and wait:
            return self._append_grouped(payload, type)
        # acquire/release around try/finally: measurably cheaper than ``with`` here.
        lock = self._lock
        lock.acquire()
        try:
            n = len(payload)
            flen = FRAME_HEADER_SIZE + n
            seg = self._seg
            if seg.size + flen > self._limit:
                seg = self._make_room(flen)
            lsn = self._last_lsn + 1
            # Frame format v2 (format.py): check = mix(v), v = CRC of head + payload
            # seeded with the chain; the chain then runs on through the check. The
            # chain is kept as (v, m) of the previous frame (see writer.py): the
            # previous check and this head are packed together and fed to the CRC in
            # the same call as the payload -- one CRC call per record, plus the mix.
            m = self._m
            fw = self._frame_write
            if fw is not None and flen <= WRITE_SLICE:
                # wal/_accel.c: this same frame (pack, chained CRC, mix) and ONE write,
                # in one C call; a bad type raises before anything is written. A short
                # or failed write is finished, or its error translated, by _write as
                # on the Python path. A bigger frame takes the Python path, which
                # writes it in slices (faults.fileio.WRITE_SLICE).
                v, m, written = fw(seg.fd, payload, type, lsn, self._v, m)
                if written == flen:
                    seg.size += flen
                else:
                    self._write(seg, b"".join((_pack_head(n, lsn, type), payload,
                                               _pack_check(m))), written)
            else:
                if payload.__class__ is not bytes:
                    _check_bytes_like(payload, n)
                try:
                    if m >= 0:
                        pre = _pack_check_head(m, n, lsn, type)
                        head = pre[4:]
                    else:
                        pre = head = _pack_head(n, lsn, type)
                except struct.error:
                    # The type is checked here, by the packing, not before (the hot
                    # path): nothing has changed yet.
                    check_type(int(type))
                    raise
                if n <= _COPY_MAX:
                    # Copying a small payload next to the head costs less than a CRC call.
                    try:
                        v = crc32c(pre + payload, self._v)
                    except TypeError:              # another buffer type
                        v = crc32c(b"".join((pre, payload)), self._v)
                    m = mix(v)
                    frame = b"".join((head, payload, _pack_check(m)))
                    try:
                        written = self._os_write(seg.fd, frame)
                    except OSError:
                        written = 0   # _write tries again and turns the error into ours
                    if written == flen:
                        seg.size += flen
                    else:
                        self._write(seg, frame, written)
                else:
                    v = crc32c(payload, crc32c(pre, self._v))
                    m = mix(v)
                    # A big payload goes out by writev, not copied into one frame first
                    # (4 KiB: -0.4 us of ~7 us); 100 B measured faster joined.
                    self._write_parts(seg, (head, payload, _pack_check(m)), flen)
            self._v = v
            self._m = m
            self._last_lsn = lsn
            if self._readers_waiting:
                self._wake_readers()
            if not wait or not self._ack:
                return lsn
            self._fsync(seg)         # mode always
            self._mark_durable(lsn)
            return lsn
        finally:
            lock.release()

    def _append_grouped(self, payload: bytes, type: int) -> int:
        """``append`` in mode group: queue the record for the sync thread, which writes
        everything queued with one ``write`` just before its next fsync, and wait for
        that fsync. Queuing costs the appender no syscall and no GIL hand-off, so the
        appenders woken by one fsync are back with their next record sooner: that
        wake-up time, not the disk, bounded group commit on a busy CPU."""
        if payload.__class__ is not bytes:
            payload = bytes(payload)    # encoded later: a mutable buffer must not change
        if len(payload) > MAX_PAYLOAD:
            raise ValueError(f"payload of {len(payload)} bytes exceeds the maximum "
                             f"{MAX_PAYLOAD}")
        if type.__class__ is not int or not 0 <= type <= MAX_TYPE:
            check_type(int(type))
            type = int(type)
        if self._limit < 0:
            self._check_open()
        # No lock: the committer's queue is a deque (see groupcommit.py).
        lsn = groupcommit.wait(self._committer.join(payload, type))
        if lsn < 0:
            self._raise_unusable()
        return lsn

    def _make_room(self, flen: int) -> OpenSegment:
        """The slow path of an append whose frame passes ``_limit``: the log is
        unusable, the payload too big, the segment full (cut the next one; a record
        bigger than a segment gets a fresh segment to itself), or the write-behind
        mark passed (``writer.WRITE_BEHIND``)."""
        self._check_open()
        if flen - FRAME_HEADER_SIZE > MAX_PAYLOAD:
            raise ValueError(f"payload of {flen - FRAME_HEADER_SIZE} bytes exceeds the "
                             f"maximum {MAX_PAYLOAD}")
        seg = self._seg
        if seg.size + flen > self.segment_size:
            if seg.size > HEADER_SIZE:
                return self._cut()
            return seg
        self._flush_behind()      # only the write-behind mark was passed
        return seg

    def append_many(self, payloads: Sequence[bytes] | Iterable[bytes], type: int = 0, *,
                    wait: bool = True) -> int:
        """Append records in order; return the last LSN (``last_lsn`` unchanged when
        ``payloads`` is empty). Two or more go into one batch frame (format version 3:
        one CRC call and one ``writev`` for the batch), whole in one segment: after a
        crash all of them are there or none, and no reader sees part of them. All are
        acknowledged together; on an error none is."""
        check_type(type)
        if not isinstance(payloads, (list, tuple)):
            payloads = list(payloads)
        if not payloads:
            # The return value promises "durable up to here" like any other append, so
            # an empty batch still waits for records appended earlier with wait=False.
            last = self._last_lsn
            if wait and self._ack and last >= self.first_lsn:
                self.wait_durable(last)
            return last
        batch: Ticket | None = None
        with self._lock:
            self._check_open()
            self.write_records(payloads, type)
            lsn = self._last_lsn
            if wait and self._ack == _ALWAYS:
                self._fsync(self._seg)
                self._mark_durable(lsn)
            elif wait and self._ack:
                batch = self._committer.join()
        if batch is not None:
            self._wait_batch(batch)
        return lsn

    # -- segments ------------------------------------------------------------------
    def truncate_before(self, lsn: int) -> int:
        """Delete the whole segments whose records all have LSN < ``lsn`` (never the
        current one); return how many were deleted. Oldest first, each removal made
        durable before the next, so a crash leaves a gap-free run of segments."""
        removed = 0
        with self._truncating:            # oldest first, also across callers
            while True:
                with self._lock:
                    self._check_open()
                    if len(self._segs) < 2 or self._segs[1].first_lsn > lsn:
                        return removed
                    seg = self._segs.pop(0)
                # Outside the writer's lock: an unlink plus a directory fsync is a
                # journal commit (30-40 ms on this disk), and appends must not stall
                # behind it. Readers already tolerate a segment vanishing under them;
                # a crash before the unlink leaves an old segment that the next open
                # lists again, which is harmless (it only holds records below lsn).
                self._io.unlink(seg.path)
                self._io.fsync_dir(self.path)
                removed += 1

    # -- durability ----------------------------------------------------------------
    def wait_durable(self, lsn: int) -> None:
        """Return once every record up to ``lsn`` is fsynced (in any mode), sharing an
        fsync with concurrent callers."""
        if lsn <= self._durable_lsn:
            return
        if lsn > self._last_lsn:
            raise ValueError(f"LSN {lsn} was not appended yet (last is {self._last_lsn})")
        with self._lock:
            if lsn <= self._durable_lsn:
                return
            self._check_open()
            batch = self._committer.join()
        self._wait_batch(batch)

    def sync(self) -> None:
        """Make everything appended so far durable."""
        if self._last_lsn >= self.first_lsn:
            self.wait_durable(self._last_lsn)

    def _wait_batch(self, ticket: Ticket) -> None:
        if groupcommit.wait(ticket) < 0:
            self._raise_unusable()

    # -- reading -------------------------------------------------------------------
    def read_from(self, lsn: int | None = None, *, at: Position | None = None) -> Follower:
        """Records from ``lsn`` (default: the first kept) to the end as of now; iterate
        it, or call ``.batches()`` for lists of records (faster). ``at``: a frame
        boundary at or before ``lsn`` (:meth:`position`, taken earlier) where the read
        starts instead of its segment's start; one that does not describe this log
        raises :class:`PositionMismatch` when the read begins."""
        return Follower(WriterSource(self), lsn, follow=False, at=at)

    def position(self) -> Position:
        """The end of the log now: where the next record's frame will start."""
        with self._lock:
            seg = self._seg
            return Position(seg.seq, seg.first_lsn, seg.size, self._crc, self._last_lsn + 1)

    def read_batches(self, lsn: int | None = None) -> Iterator[list[RawRecord]]:
        """Like :meth:`read_from`, as lists of plain ``(lsn, type, payload)`` tuples:
        the fastest replay (see :meth:`Follower.batches`)."""
        return self.read_from(lsn).batches()

    def follow(self, lsn: int | None = None, *, timeout: float | None = None) -> Follower:
        """Records from ``lsn`` on, waiting for new ones (see :class:`Follower`)."""
        return Follower(WriterSource(self), lsn, follow=True, timeout=timeout)

    # -- ending --------------------------------------------------------------------
    def close(self) -> None:
        """fsync what was written (unless the log failed), release the directory."""
        with self._lock:
            if self._closed:
                return
            try:
                if self._failed is None and self._seg.fd >= 0:
                    self._committer.write_queue()     # records queued for the next fsync
                    self._fsync(self._seg)
                    self._mark_durable(self._last_lsn)
            finally:
                self._closed = True
                self._latch.close()
                self._limit = -1
                # The final fsync covered everyone waiting for the next one.
                self._committer.stop(failed=self._failed is not None)
                for s in self._segs:
                    s.retired = True      # a pinned one is closed by the sync thread
                    if s.fd >= 0 and s.pins == 0:
                        self._io.close(s.fd)
                        s.fd = -1
                self._dirlock.release()
        self._committer.join_thread()
        self._wake_readers()

    def destroy(self) -> None:
        """Close and delete the log directory with everything in it."""
        self.close()
        for name in os.listdir(self.path):
            self._io.unlink(os.path.join(self.path, name))
        os.rmdir(self.path)
        self._io.fsync_dir(os.path.dirname(self.path))

    def __enter__(self) -> Wal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Wal({self.path!r}, mode={self.mode}, lsn {self.first_lsn}..{self._last_lsn}, "
                f"durable {self._durable_lsn})")


def _check_bytes_like(payload: object, n: int) -> None:
    """``len(payload)`` must be its byte count (the frame's length field): a memoryview
    of wider items (``array('i')``) would otherwise write a frame that lies."""
    if memoryview(payload).nbytes != n:  # type: ignore[arg-type]
        raise ValueError(f"payload must have 1-byte items (len {n}, "
                         f"{memoryview(payload).nbytes} bytes; pass bytes, or "  # type: ignore[arg-type]
                         f"memoryview.cast('B'))")


_OPEN = object()
_pack_head = HEAD.pack
_pack_check = CHECK.pack
_pack_check_head = CHECK_HEAD.pack
_COPY_MAX = 1024       # payloads up to this size are copied next to their head (append)


