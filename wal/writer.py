"""The writer's state and its slow paths, under :class:`wal.Wal` (``log.py``).

``log.py`` holds the public face and the per-record hot path (``append``); this module
holds what they stand on: opening (recovery of the tail), whole-frame writes with
roll-back on a full disk, segment cuts, the sync thread's side of group commit
(``groupcommit.SyncTarget``), waking in-process readers, and the latched failure.
Every method here that changes state runs under ``_lock`` (see ``log.py``).
"""
from __future__ import annotations

import os
import struct
import threading
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

import faults
from faults import crashpoint, translate_os_error
from faults.fileio import WRITE_SLICE, FileLayer, iov_slices

from . import accel, recovery
from faults.latch import Latch, cause_of

from .errors import OutOfDiskError, WalClosedError, WalError, WriteRefusedError
from faults.crc import crc32c

from .format import (CHECK, FRAME_HEADER_SIZE, HEADER_SIZE, VERSION, encode_batch,
                     encode_frames, encode_typed_frames)
from .groupcommit import GroupCommitter
from .segments import DirLock, OpenSegment, create_segment, remove_temp_files

if TYPE_CHECKING:
    from typing_extensions import Buffer    # bytes, or a batch frame's array of lengths

    from .position import Position

_ACK = {"none": 0, "always": 1, "group": 2}     # what append(wait=True) does after writing
# Every this many bytes written to a segment, the sync thread fsyncs it in the
# background (write-behind; see SegmentWriter._flush_behind).
WRITE_BEHIND = 4 << 20


class SegmentWriter:
    """Base of :class:`wal.Wal`: state, slow paths, failure (no public methods)."""

    path: str
    segment_size: int
    mode: str

    def _start(self, path: str | os.PathLike[str], segment_size: int, sync: str,
               first_lsn: int, start: Position | None = None) -> None:
        """Set up the writer's state: lock the directory, recover the tail, open the
        last segment for appending."""
        self.path = os.path.abspath(os.fspath(path))
        self.segment_size = segment_size
        self.mode = sync
        self._ack = _ACK[sync]
        self._io = faults.fileio.layer()
        # The real layer's write is os.write behind a Python call; skip that call on
        # the per-record path when the layer is the real one (tests' layers are not).
        real = type(self._io).write is FileLayer.write
        self._os_write = os.write if real else self._io.write
        # Frames given as parts (batch frames, big payloads) go out with writev (no copy
        # into one buffer) when the layer is the real one; other layers get them joined,
        # through their write (see _write_parts).
        self._writev = os.writev if real else self._joined_write
        # The C frame path of append (wal/_accel.c; None: the Python one). Only on the
        # real layer, for the same reason as _os_write.
        self._frame_write = accel.frame_writer(real)
        self._lock = threading.Lock()
        self._truncating = threading.Lock()   # one truncate_before at a time (log.py)
        self._append_cond = threading.Condition(threading.Lock())
        self._readers_waiting = 0
        self._failed: BaseException | None = None
        self._latch = Latch("wal", self.path)    # the failure, for logs and metrics
        self._closed = False
        # An append whose frame would end past this offset takes the slow path
        # (_make_room): segment_size while usable, -1 once failed or closed, so one
        # comparison covers "segment full", "payload too big" and "log unusable".
        self._limit = -1
        if not os.path.isdir(self.path):
            os.makedirs(self.path, exist_ok=True)
            self._io.fsync_dir(os.path.dirname(self.path))
        self._dirlock = DirLock(self.path)
        try:
            remove_temp_files(self.path, self._io)
            tail = recovery.recover(self.path, self._io, start)
            if tail is None:
                sf = create_segment(self.path, 0, first_lsn, 0, self._io)
                tail = recovery.Tail([sf], HEADER_SIZE, 0, first_lsn)
            if tail.version != VERSION:
                tail = self._upgrade(tail)
            last = tail.segments[-1]
            fd = self._io.open(last.path, os.O_WRONLY | os.O_APPEND)
            segs = [OpenSegment(s.seq, s.first_lsn, s.path, 0, -1) for s in tail.segments[:-1]]
            for s in segs:
                s.complete, s.retired, s.size = True, True, os.path.getsize(s.path)
            self._seg = OpenSegment(last.seq, last.first_lsn, last.path, tail.size, fd)
            self._segs: list[OpenSegment] = segs + [self._seg]
            self._crc = tail.crc
            self._last_lsn = tail.next_lsn - 1
            # What an earlier process wrote may still sit in the page cache only: make
            # it durable now so durable_lsn tells the truth from the start.
            self._durable_lsn = 0
            self._fsync(self._seg)
            self._durable_lsn = self._last_lsn
        except BaseException:
            self._dirlock.release()
            raise
        self._committer = GroupCommitter(self, self._lock, os.path.basename(self.path))
        self._set_flush_mark(self._seg.size + WRITE_BEHIND)

    def _upgrade(self, tail: recovery.Tail) -> recovery.Tail:
        """The last segment is of an older frame format: append to a fresh segment in
        the current one (a segment holds one format), continuing LSNs and the chain.
        The old segment is fsynced first: a segment with a successor must be whole."""
        last = tail.segments[-1]
        fd = self._io.open(last.path, os.O_WRONLY)
        try:
            self._io.fdatasync(fd)
        finally:
            self._io.close(fd)
        sf = create_segment(self.path, last.seq + 1, tail.next_lsn, tail.crc, self._io)
        return recovery.Tail(tail.segments + [sf], HEADER_SIZE, tail.crc, tail.next_lsn)

    def _joined_write(self, fd: int, parts: Sequence[Buffer]) -> int:
        """writev for a file layer that has none (tests' layers): join, then write."""
        return self._io.write(fd, b"".join(parts))

    def _write_parts(self, seg: OpenSegment, parts: Sequence[Buffer], size: int) -> None:
        """Write one frame given as ``parts`` (``size`` bytes in all) with one writev,
        or one per WRITE_SLICE bytes for a bigger frame (faults.fileio.WRITE_SLICE: a
        write of 2 MiB or more costs several times the CPU); a short or failed writev is
        finished, or its error translated, by :meth:`_write`."""
        groups: Iterable[tuple[Sequence[Buffer], int]] = (
            ((parts, size),) if size <= WRITE_SLICE else iov_slices(parts))
        written = 0
        for group, gsize in groups:
            try:
                n = self._writev(seg.fd, group)
            except OSError:
                n = 0            # _write tries again and turns the error into ours
            written += n
            if n != gsize:
                self._write(seg, b"".join(parts), written)
                return
        seg.size += size

    def _set_flush_mark(self, at: int) -> None:
        """Next write-behind fsync once the current segment passes ``at`` bytes;
        ``_limit`` (what an append checks) is the nearer of that and the segment end."""
        self._flush_at = at
        self._limit = min(self.segment_size, at)

    def _flush_behind(self) -> None:
        """Another :data:`WRITE_BEHIND` bytes were written since the last write-behind
        fsync: ask the sync thread for an fsync nobody waits for, and move the mark.
        Without it a segment reaches its cut with up to 64 MiB in the page cache, and
        the cut's fsync (a segment with a successor must be whole on disk) stalls the
        appender for the whole of it: in mode none most of the 4 KiB appends' lost
        wall time (RocksDB's ``wal_bytes_per_sync`` does the same)."""
        self._set_flush_mark(self._seg.size + WRITE_BEHIND)
        self._committer.join(abandoned=True)

    def write_records(self, payloads: Sequence[bytes], types: int | Sequence[int]) -> int:
        """Write records in order (under the lock); return the last LSN. ``types``: one
        type for all, or one per record. Several records of one type go into one batch
        frame (format version 3: one CRC call and one ``write`` for all of them, and
        all or none of them after a crash); mixed types into plain frames, one ``write``
        per segment touched. On a full disk (or another refusal the log outlives: a
        read-only file system, no descriptors) every one of them is taken back and
        :class:`OutOfDiskError` (:class:`WriteRefusedError`) raised."""
        undo = (self._seg, self._seg.size, self._crc, self._last_lsn)
        try:
            if isinstance(types, int):
                one_type: int | None = types
            else:
                one_type = types[0] if types.count(types[0]) == len(types) else None
            if one_type is not None and len(payloads) > 1:
                self._write_batch(payloads, one_type)
            else:
                self._write_frames(payloads, types)
        except WriteRefusedError:
            self._undo(*undo)
            raise
        if self._readers_waiting:
            self._wake_readers()
        if self._seg.size > self._flush_at and self._limit >= 0:
            self._flush_behind()
        return self._last_lsn

    def _write_batch(self, payloads: Sequence[bytes], type: int) -> None:
        """One batch frame for ``payloads``, whole in one segment: cut first when it
        does not fit the current one; one bigger than a segment gets a segment of its
        own, like an oversized record. Only a batch too big for one frame (4 GiB) is
        split, in halves."""
        try:
            parts, size, chain = encode_batch(payloads, self._last_lsn + 1, type, self._crc)
        except (OverflowError, struct.error):
            if len(payloads) == 1:
                self._write_frames(payloads, type)     # raises the plain path's error
                return
            mid = len(payloads) // 2
            self._write_batch(payloads[:mid], type)
            self._write_batch(payloads[mid:], type)
            return
        seg = self._seg
        if seg.size + size > self.segment_size and seg.size > HEADER_SIZE:
            seg = self._cut()
        self._write_parts(seg, parts, size)
        self._crc = chain
        self._last_lsn += len(payloads)

    def _write_frames(self, payloads: Sequence[bytes], types: int | Sequence[int]) -> None:
        """Plain frames, one ``write`` per segment touched (see :meth:`write_records`)."""
        for start, end in self._chunks(payloads):
            chunk = payloads if end - start == len(payloads) else payloads[start:end]
            seg = self._seg
            if seg.size + frames_size(chunk) > self.segment_size and \
                    seg.size > HEADER_SIZE:
                seg = self._cut()
            buf = bytearray()
            if isinstance(types, int):
                count, crc = encode_frames(chunk, self._last_lsn + 1, types, self._crc, buf)
            else:
                count, crc = encode_typed_frames(chunk, types[start:end],
                                                 self._last_lsn + 1, self._crc, buf)
            self._write(seg, buf)
            self._crc = crc
            self._last_lsn += count

    def _chunks(self, payloads: Sequence[bytes]) -> Iterator[tuple[int, int]]:
        """Index ranges of a batch, split where it would overflow a segment. The common
        case, one chunk, costs one ``sum`` and no per-record Python work; an oversized
        record ends up alone in its chunk (and so in its own segment)."""
        room = self.segment_size - self._seg.size
        if frames_size(payloads) <= room:
            yield 0, len(payloads)
            return
        start, size = 0, 0
        for i, p in enumerate(payloads):
            f = FRAME_HEADER_SIZE + len(p)
            if i > start and size + f > room:
                yield start, i
                start, size, room = i, 0, self.segment_size - HEADER_SIZE
            size += f
        yield start, len(payloads)

    def _write(self, seg: OpenSegment, data: bytes | bytearray, written: int = 0) -> None:
        """Write whole frames (``written`` bytes of them are already in); publish them to
        readers only once all bytes are in. On a full disk, cut the partial write off
        again: it was never acknowledged."""
        try:
            faults.fileio.write_all(seg.fd, memoryview(data)[written:], seg.path,
                                    error=OutOfDiskError, io=self._io)
        except OutOfDiskError as e:
            self._truncate_back(seg, seg.size, e)
            raise
        except OSError as e:
            err = translate_os_error(e, seg.path, len(data), OutOfDiskError)
            if isinstance(err, OutOfDiskError):
                self._truncate_back(seg, seg.size, err)
                raise err from e
            if cause_of(e) is not None:
                # read-only file system: refused like a full disk, the log goes on
                refused = WriteRefusedError(seg.path, e)
                self._truncate_back(seg, seg.size, refused)
                raise refused from e
            raise self._fail(WalError(f"write to {seg.path} failed: {e}"), e) from e
        seg.size += len(data)

    def _truncate_back(self, seg: OpenSegment, size: int, cause: BaseException) -> None:
        try:
            self._io.ftruncate(seg.fd, size)
        except OSError as e:
            try:
                if os.fstat(seg.fd).st_size == size:
                    return          # nothing of the failed write got in (a read-only fs)
            except OSError:
                pass
            raise self._fail(WalError(
                f"{seg.path}: could not cut a failed write back to {size} bytes ({e}) after "
                f"{cause}; reopen the log (a torn tail is repaired on open)"), e) from e

    def _undo(self, seg: OpenSegment, size: int, crc: int, last_lsn: int) -> None:
        """Take back a batch that failed part-way (disk full), including segments it cut."""
        while self._seg is not seg:
            dead = self._segs.pop()
            self._io.close(dead.fd)
            self._io.unlink(dead.path)
            self._io.fsync_dir(self.path)
            self._seg = self._segs[-1]
        if seg.fd < 0 or seg.retired:
            try:
                seg.fd = self._io.open(seg.path, os.O_WRONLY | os.O_APPEND)
            except OSError as e:
                raise self._fail(WalError(
                    f"{seg.path}: could not reopen it to take back a refused batch ({e}); "
                    "reopen the log (a torn tail is repaired on open)"), e) from e
            seg.retired = False
        seg.complete = False
        self._truncate_back(seg, size, WalError("batch rolled back"))
        seg.size = size
        self._crc, self._last_lsn = crc, last_lsn
        if self._durable_lsn > last_lsn:
            # The cut fsynced part of the batch; fsync the truncation so it cannot come back.
            self._fsync(seg)
            self._durable_lsn = last_lsn

    # -- segments ------------------------------------------------------------------
    def _cut(self) -> OpenSegment:
        """Start the next segment (in the critical section). The old one is fsynced
        first, so a segment that has a successor is always complete on disk: only the
        last segment can have a torn tail."""
        old = self._seg
        self._fsync(old)
        self._mark_durable(self._last_lsn)
        try:
            sf = create_segment(self.path, old.seq + 1, self._last_lsn + 1, self._crc, self._io)
            fd = self._io.open(sf.path, os.O_WRONLY | os.O_APPEND)
        except OSError as e:
            err = translate_os_error(e, self.path, HEADER_SIZE, OutOfDiskError)
            if isinstance(err, OutOfDiskError):
                raise err from e
            if cause_of(e) is not None:     # read-only, out of descriptors: refused
                raise WriteRefusedError(self.path, e) from e
            raise self._fail(WalError(f"could not cut a new segment in {self.path}: {e}"), e) from e
        new = OpenSegment(sf.seq, sf.first_lsn, sf.path, HEADER_SIZE, fd)
        self._segs.append(new)
        self._seg = new
        if self._limit >= 0:
            self._set_flush_mark(HEADER_SIZE + WRITE_BEHIND)
        old.complete = True       # after its final size: readers check complete first
        old.retired = True
        if old.pins == 0:
            self._io.close(old.fd)
            old.fd = -1
        return new

    # The sync thread's side (groupcommit.SyncTarget).
    def _sync_begin(self) -> tuple[OpenSegment, int] | None:
        if self._failed is not None or self._closed:
            return None
        seg = self._seg
        seg.pins += 1
        return seg, self._last_lsn

    def _sync_fsync(self, seg: OpenSegment) -> bool:
        try:
            self._fsync(seg)
        except WalError:
            return False
        return True

    def _sync_end(self, seg: OpenSegment, target: int, ok: bool) -> None:
        seg.pins -= 1
        if seg.retired and seg.pins == 0 and seg.fd >= 0:
            self._io.close(seg.fd)
            seg.fd = -1
        if ok:
            self._mark_durable(target)

    def _fsync(self, seg: OpenSegment) -> None:
        crashpoint("wal.before_sync")
        try:
            self._io.fdatasync(seg.fd)
        except OSError as e:
            raise self._fail(WalError(
                f"fsync of {seg.path} failed ({e}); records since the last durable LSN "
                f"may be lost. Reopen the log to continue from what is on disk"), e) from e
        crashpoint("wal.after_sync")

    def _mark_durable(self, lsn: int) -> None:
        if lsn > self._durable_lsn:
            self._durable_lsn = lsn

    # -- in-process readers ----------------------------------------------------------
    def _wake_readers(self) -> None:
        with self._append_cond:
            self._append_cond.notify_all()

    def _wait_appended(self, next_lsn: int, timeout: float) -> bool:
        with self._append_cond:
            self._readers_waiting += 1
            try:
                if self._last_lsn < next_lsn and not self._closed:
                    self._append_cond.wait(timeout)
            finally:
                self._readers_waiting -= 1
        return not self._closed

    # -- the chain -----------------------------------------------------------------
    # The chain value after the last frame is kept as the pair (v, m): the CRC before
    # that frame's check and the check (m = mix(v)), chain = crc32c(check bytes, v).
    # ``append`` then feeds the previous check and its own head to the CRC as one packed
    # struct, which saves a CRC call per record. m = -1: no check pending, chain = v.
    @property
    def _crc(self) -> int:
        m = self._m
        return self._v if m < 0 else crc32c(CHECK.pack(m), self._v)

    @_crc.setter
    def _crc(self, chain: int) -> None:
        self._v, self._m = chain, -1

    # -- failure -------------------------------------------------------------------
    def _fail(self, err: BaseException, os_error: BaseException | None = None) -> BaseException:
        """Latch ``err`` (caused by ``os_error``): every later call raises it."""
        if os_error is not None and err.__cause__ is None:
            err.__cause__ = os_error       # what the latch's log line and metric name
        if self._failed is None:
            self._failed = err
            # never retried (a failed fsync may have lost pages): logged once, metric
            self._latch.fail(err, retry=False)
        self._limit = -1
        return err

    def _check_open(self) -> None:
        if self._failed is not None or self._closed:
            self._raise_unusable()

    def _raise_unusable(self) -> None:
        if self._failed is not None:
            raise WalError(f"write-ahead log {self.path} failed earlier and takes no more "
                           f"appends: {self._failed}") from self._failed
        raise WalClosedError(f"write-ahead log {self.path} is closed")


def frames_size(payloads: Sequence[bytes]) -> int:
    return sum(map(len, payloads)) + FRAME_HEADER_SIZE * len(payloads)
