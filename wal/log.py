"""The writer: :class:`Wal` (append, group commit, segment cuts, truncation).

Concurrency, in one place:

* ``_lock`` orders appends. Under it a record gets its LSN, its frame (CRC chained to
  the previous one) and its ``write`` to the OS, and then the segment's published end
  moves past it. Readers never take it (see ``reader.py``).
* ``_sync_cond`` guards ``_durable_lsn`` and ``_syncing``. ``wait_durable`` is leader /
  follower group commit: the first waiter that finds no sync running becomes the leader,
  notes the last written LSN, fsyncs *outside* every lock, publishes the new durable
  LSN and wakes everyone; waiters whose LSN it covered return, the rest elect the next
  leader. So N concurrent appenders share one fsync instead of paying N.
* A segment being fsynced by a leader is *pinned*: a cut that retires it meanwhile
  leaves its descriptor open and the leader closes it when done (else the leader could
  fsync a closed, or reused, descriptor number).
* The first failure of a write (other than a full disk, which is rolled back) or of an
  fsync is latched: every later call raises it. Retrying an fsync after an error can
  report success for data the kernel dropped, so the log refuses instead.
"""
from __future__ import annotations

import os
import threading
from typing import Iterable, Iterator, Sequence

from crc32c import crc32c

import faults
from faults import crashpoint, translate_os_error
from faults.fileio import FileLayer

from . import recovery
from .decoder import Record
from .errors import OutOfDiskError, WalClosedError, WalError
from .format import (CRC_FIELD, FRAME_REST, FRAME_HEADER_SIZE, HEADER_SIZE, MAX_PAYLOAD,
                     check_type, encode_frames)
from .reader import DirSource, Follower, WriterSource
from .segments import DirLock, create_segment, remove_temp_files

MODES = ("always", "group", "none")
DEFAULT_SEGMENT_SIZE = 64 << 20


class _Segment:
    """A segment as the writer (and its in-process readers) know it."""

    __slots__ = ("seq", "first_lsn", "path", "size", "complete", "fd", "pins", "retired")

    def __init__(self, seq: int, first_lsn: int, path: str, size: int, fd: int) -> None:
        self.seq = seq
        self.first_lsn = first_lsn
        self.path = path
        self.size = size           # end of the last whole frame written: readers' limit
        self.complete = False      # set (after the final size) when the next segment exists
        self.fd = fd
        self.pins = 0              # group-commit leaders fsyncing this fd right now
        self.retired = False


class Wal:
    """A segmented write-ahead log in one directory (one writer, any readers).

    Use :meth:`open` for the writer and :meth:`reader` for a read-only view that works
    from any process."""

    def __init__(self, *, _token: object = None) -> None:
        if _token is not _OPEN:
            raise TypeError("use Wal.open(path) or Wal.reader(path)")

    # -- opening -------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str], *, segment_size: int = DEFAULT_SEGMENT_SIZE,
             sync: str = "group", first_lsn: int = 1) -> Wal:
        """Open (creating if needed) the log in ``path`` for writing.

        ``sync``: ``always`` (each acknowledged append fsynced on its own), ``group``
        (acknowledged appends fsynced, concurrent ones share an fsync), ``none``
        (acknowledged once written to the OS; survives a process crash, not a power cut).
        ``first_lsn`` is the LSN of the first record of a *new* log; an existing log keeps
        its LSNs. A torn tail of the last segment is cut off; any other damage raises
        :class:`CorruptRecordError`."""
        if sync not in MODES:
            raise ValueError(f"sync must be one of {', '.join(MODES)}, got {sync!r}")
        if segment_size < HEADER_SIZE + FRAME_HEADER_SIZE:
            raise ValueError(f"segment_size {segment_size} is too small")
        if first_lsn < 1:
            raise ValueError(f"first_lsn must be >= 1, got {first_lsn}")
        self = cls(_token=_OPEN)
        self.path = os.path.abspath(os.fspath(path))
        self.segment_size = segment_size
        self.mode = sync
        self._io = faults.fileio.layer()
        # The real layer's write is os.write behind a Python call; skip that call on
        # the per-record path when the layer is the real one (tests' layers are not).
        self._os_write = os.write if type(self._io).write is FileLayer.write else self._io.write
        self._lock = threading.Lock()
        self._sync_cond = threading.Condition(threading.Lock())
        self._append_cond = threading.Condition(threading.Lock())
        self._readers_waiting = 0
        self._syncing = False
        self._failed: BaseException | None = None
        self._closed = False
        if not os.path.isdir(self.path):
            os.makedirs(self.path, exist_ok=True)
            self._io.fsync_dir(os.path.dirname(self.path))
        self._dirlock = DirLock(self.path)
        try:
            remove_temp_files(self.path, self._io)
            tail = recovery.recover(self.path, self._io)
            if tail is None:
                sf = create_segment(self.path, 0, first_lsn, 0, self._io)
                tail = recovery.Tail([sf], HEADER_SIZE, 0, first_lsn)
            last = tail.segments[-1]
            fd = self._io.open(last.path, os.O_WRONLY | os.O_APPEND)
            segs = [_Segment(s.seq, s.first_lsn, s.path, 0, -1) for s in tail.segments[:-1]]
            for s in segs:
                s.complete, s.retired, s.size = True, True, os.path.getsize(s.path)
            self._seg = _Segment(last.seq, last.first_lsn, last.path, tail.size, fd)
            self._segs: list[_Segment] = segs + [self._seg]
            self._crc = tail.crc
            self._last_lsn = tail.next_lsn - 1
            # What an earlier process wrote may still sit in the page cache only: make
            # it durable now so durable_lsn tells the truth from the start.
            self._fsync(self._seg)
            self._durable_lsn = self._last_lsn
        except BaseException:
            self._dirlock.release()
            raise
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
    def durable_lsn(self) -> int:
        """Every record up to this LSN is fsynced."""
        return self._durable_lsn

    # -- appending -----------------------------------------------------------------
    def append(self, payload: bytes, type: int = 0, *, wait: bool = True) -> int:
        """Append one record; return its LSN.

        ``wait=False`` returns as soon as the record is written, in order, to the OS
        (not fsynced): release your own lock, then :meth:`wait_durable`. With
        ``wait=True`` it returns once the record is durable as the mode promises."""
        n = len(payload)
        if n > MAX_PAYLOAD:
            raise ValueError(f"payload of {n} bytes exceeds the maximum {MAX_PAYLOAD}")
        if type.__class__ is not int or not 0 <= type <= 0xFFFF:
            check_type(int(type))
        with self._lock:
            if self._failed is not None or self._closed:
                self._raise_unusable()
            seg = self._seg
            flen = FRAME_HEADER_SIZE + n
            if seg.size + flen > self.segment_size and seg.size > HEADER_SIZE:
                seg = self._cut()
            lsn = self._last_lsn + 1
            # encode_frame, inlined: this is the per-record hot path.
            rest = _pack_rest(n, lsn, type)
            crc = crc32c(payload, crc32c(rest, self._crc))
            frame = b"".join((_pack_crc(crc), rest, payload))
            try:
                written = self._os_write(seg.fd, frame)
            except OSError:
                written = 0          # _write tries again and turns the error into ours
            if written == flen:
                seg.size += flen
            else:
                self._write(seg, frame, written)
            self._crc = crc
            self._last_lsn = lsn
            if self._readers_waiting:
                self._wake_readers()
            if wait and self.mode == "always":
                self._fsync(seg)
                self._mark_durable(lsn)
                return lsn
        if wait and self.mode == "group":
            self.wait_durable(lsn)
        return lsn

    def append_many(self, payloads: Sequence[bytes] | Iterable[bytes], type: int = 0, *,
                    wait: bool = True) -> int:
        """Append records in order with one write per segment touched; return the last
        LSN (``last_lsn`` unchanged when ``payloads`` is empty). All of them are
        acknowledged together; on an error none is."""
        check_type(type)
        if not isinstance(payloads, (list, tuple)):
            payloads = list(payloads)
        if not payloads:
            # The return value promises "durable up to here" like any other append, so
            # an empty batch still waits for records appended earlier with wait=False.
            last = self._last_lsn
            if wait and self.mode != "none" and last >= self.first_lsn:
                self.wait_durable(last)
            return last
        with self._lock:
            if self._failed is not None or self._closed:
                self._raise_unusable()
            undo = (self._seg, self._seg.size, self._crc, self._last_lsn)
            try:
                for chunk in self._chunks(payloads):
                    seg = self._seg
                    if seg.size + _frames_size(chunk) > self.segment_size and \
                            seg.size > HEADER_SIZE:
                        seg = self._cut()
                    buf = bytearray()
                    count, crc = encode_frames(chunk, self._last_lsn + 1, type, self._crc, buf)
                    self._write(seg, buf)
                    self._crc = crc
                    self._last_lsn += count
            except OutOfDiskError:
                self._undo(*undo)
                raise
            lsn = self._last_lsn
            if self._readers_waiting:
                self._wake_readers()
            if wait and self.mode == "always":
                self._fsync(self._seg)
                self._mark_durable(lsn)
                return lsn
        if wait and self.mode == "group":
            self.wait_durable(lsn)
        return lsn

    def _chunks(self, payloads: Sequence[bytes]) -> Iterator[Sequence[bytes]]:
        """Split a batch where it would overflow a segment. The common case, one chunk,
        costs one ``sum`` and no per-record Python work; an oversized record ends up
        alone in its chunk (and so in its own segment)."""
        room = self.segment_size - self._seg.size
        if _frames_size(payloads) <= room:
            yield payloads
            return
        start, size = 0, 0
        for i, p in enumerate(payloads):
            f = FRAME_HEADER_SIZE + len(p)
            if i > start and size + f > room:
                yield payloads[start:i]
                start, size, room = i, 0, self.segment_size - HEADER_SIZE
            size += f
        yield payloads[start:]

    def _write(self, seg: _Segment, data: bytes | bytearray, written: int = 0) -> None:
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
            raise self._fail(WalError(f"write to {seg.path} failed: {e}")) from e
        seg.size += len(data)

    def _truncate_back(self, seg: _Segment, size: int, cause: BaseException) -> None:
        try:
            self._io.ftruncate(seg.fd, size)
        except OSError as e:
            raise self._fail(WalError(
                f"{seg.path}: could not cut a failed write back to {size} bytes ({e}) after "
                f"{cause}; reopen the log (a torn tail is repaired on open)")) from e

    def _undo(self, seg: _Segment, size: int, crc: int, last_lsn: int) -> None:
        """Take back a batch that failed part-way (disk full), including segments it cut."""
        while self._seg is not seg:
            dead = self._segs.pop()
            self._io.close(dead.fd)
            self._io.unlink(dead.path)
            self._io.fsync_dir(self.path)
            self._seg = self._segs[-1]
        if seg.fd < 0 or seg.retired:
            seg.fd = self._io.open(seg.path, os.O_WRONLY | os.O_APPEND)
            seg.retired = False
        seg.complete = False
        self._truncate_back(seg, size, WalError("batch rolled back"))
        seg.size = size
        self._crc, self._last_lsn = crc, last_lsn
        if self._durable_lsn > last_lsn:
            # The cut fsynced part of the batch; fsync the truncation so it cannot come back.
            self._fsync(seg)
            with self._sync_cond:
                self._durable_lsn = last_lsn

    # -- segments ------------------------------------------------------------------
    def _cut(self) -> _Segment:
        """Start the next segment (under ``_lock``). The old one is fsynced first, so a
        segment that has a successor is always complete on disk: only the last segment
        can have a torn tail."""
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
            raise self._fail(WalError(f"could not cut a new segment in {self.path}: {e}")) from e
        new = _Segment(sf.seq, sf.first_lsn, sf.path, HEADER_SIZE, fd)
        self._segs.append(new)
        self._seg = new
        old.complete = True       # after its final size: readers check complete first
        old.retired = True
        if old.pins == 0:
            self._io.close(old.fd)
            old.fd = -1
        return new

    def truncate_before(self, lsn: int) -> int:
        """Delete the whole segments whose records all have LSN < ``lsn`` (never the
        current one); return how many were deleted. Oldest first, each removal made
        durable before the next, so a crash leaves a gap-free run of segments."""
        removed = 0
        with self._lock:
            self._check_open()
            while len(self._segs) > 1 and self._segs[1].first_lsn <= lsn:
                seg = self._segs[0]
                self._io.unlink(seg.path)
                self._io.fsync_dir(self.path)
                self._segs.pop(0)
                removed += 1
        return removed

    # -- durability ----------------------------------------------------------------
    def wait_durable(self, lsn: int) -> None:
        """Return once every record up to ``lsn`` is fsynced (in any mode), sharing an
        fsync with concurrent callers."""
        if lsn <= self._durable_lsn:
            return
        if lsn > self._last_lsn:
            raise ValueError(f"LSN {lsn} was not appended yet (last is {self._last_lsn})")
        with self._sync_cond:
            while self._durable_lsn < lsn:
                if self._failed is not None:
                    self._raise_unusable()
                if self._syncing:
                    self._sync_cond.wait()
                    continue
                self._syncing = True
                self._sync_cond.release()
                try:
                    target = self._sync_written()
                finally:
                    self._sync_cond.acquire()
                    self._syncing = False
                    self._sync_cond.notify_all()
                if target > self._durable_lsn:
                    self._durable_lsn = target

    def sync(self) -> None:
        """Make everything appended so far durable."""
        if self._last_lsn >= self.first_lsn:
            self.wait_durable(self._last_lsn)

    def _sync_written(self) -> int:
        """fsync the current segment outside ``_lock``; return the LSN it covers."""
        with self._lock:
            if self._failed is not None:
                self._raise_unusable()
            if self._closed:
                raise WalClosedError(f"write-ahead log {self.path} is closed")
            seg, target = self._seg, self._last_lsn
            seg.pins += 1
        try:
            self._fsync(seg)
        finally:
            with self._lock:
                seg.pins -= 1
                if seg.retired and seg.pins == 0 and seg.fd >= 0:
                    self._io.close(seg.fd)
                    seg.fd = -1
        return target

    def _fsync(self, seg: _Segment) -> None:
        crashpoint("wal.before_sync")
        try:
            self._io.fdatasync(seg.fd)
        except OSError as e:
            raise self._fail(WalError(
                f"fsync of {seg.path} failed ({e}); records since the last durable LSN "
                f"may be lost. Reopen the log to continue from what is on disk")) from e
        crashpoint("wal.after_sync")

    def _mark_durable(self, lsn: int) -> None:
        with self._sync_cond:
            if lsn > self._durable_lsn:
                self._durable_lsn = lsn
            self._sync_cond.notify_all()

    # -- reading -------------------------------------------------------------------
    def read_from(self, lsn: int | None = None) -> Iterator[Record]:
        """Records from ``lsn`` (default: the first kept) to the end as of now."""
        return Follower(WriterSource(self), lsn, follow=False)

    def follow(self, lsn: int | None = None, *, timeout: float | None = None) -> Follower:
        """Records from ``lsn`` on, waiting for new ones (see :class:`Follower`)."""
        return Follower(WriterSource(self), lsn, follow=True, timeout=timeout)

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

    # -- ending --------------------------------------------------------------------
    def close(self) -> None:
        """fsync what was written (unless the log failed), release the directory."""
        with self._lock:
            if self._closed:
                return
            try:
                if self._failed is None and self._seg.fd >= 0:
                    self._fsync(self._seg)
                    self._mark_durable(self._last_lsn)
            finally:
                self._closed = True
                for s in self._segs:
                    if s.fd >= 0 and s.pins == 0:
                        self._io.close(s.fd)
                        s.fd = -1
                self._dirlock.release()
        self._wake_readers()
        with self._sync_cond:
            self._sync_cond.notify_all()

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

    # -- failure -------------------------------------------------------------------
    def _fail(self, err: BaseException) -> BaseException:
        if self._failed is None:
            self._failed = err
        return err

    def _check_open(self) -> None:
        if self._failed is not None or self._closed:
            self._raise_unusable()

    def _raise_unusable(self) -> None:
        if self._failed is not None:
            raise WalError(f"write-ahead log {self.path} failed earlier and takes no more "
                           f"appends: {self._failed}") from self._failed
        raise WalClosedError(f"write-ahead log {self.path} is closed")


_OPEN = object()
_pack_rest = FRAME_REST.pack
_pack_crc = CRC_FIELD.pack


def _frames_size(payloads: Sequence[bytes]) -> int:
    return sum(map(len, payloads)) + FRAME_HEADER_SIZE * len(payloads)


class WalReader:
    """Read-only view of a log directory from any process (no lock, no writes)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.path.abspath(os.fspath(path))
        if not os.path.isdir(self.path):
            raise WalError(f"write-ahead log directory {self.path} does not exist")

    def read_from(self, lsn: int | None = None) -> Iterator[Record]:
        """Records from ``lsn`` to the end as of now (a torn tail is the end)."""
        return Follower(DirSource(self.path), lsn, follow=False)

    def follow(self, lsn: int | None = None, *, timeout: float | None = None) -> Follower:
        """Records from ``lsn`` on, polling for new ones (see :class:`Follower`)."""
        return Follower(DirSource(self.path), lsn, follow=True, timeout=timeout)

    @property
    def first_lsn(self) -> int | None:
        segs = DirSource(self.path).segments()
        return segs[0].first_lsn if segs else None

    def close(self) -> None:
        pass


def follow_dir(path: str | os.PathLike[str], lsn: int | None = None, *,
               timeout: float | None = None) -> Follower:
    """Follow the log in ``path`` from another process: ``Wal.reader(path).follow(lsn)``."""
    return WalReader(path).follow(lsn, timeout=timeout)
