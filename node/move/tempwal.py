"""The catch-up temporary WAL of one MOVING partition (files mode): the ``Move.sink``
that buffers the updates the primary replicates to this copy while its file travels.

One :class:`wal.Wal` per partition at ``DATA/tmpwal/<cache>/part-<p>/``. Each record is
one update with its partition update counter, appended durably before the replicate
call returns, so the primary's acknowledgement never precedes it. The log lives on
disk: a long move under heavy writes does not grow memory with the write rate (the
newest CACHE_BYTES of it are also kept in memory, see below).

Appends (the replicate handler) and the replaying reader (the move thread) run at the
same time; the reader only reads what is already written, so appends never wait for it
(writes beat reads, as the seed asks).

The newest records also stay in memory, up to CACHE_BYTES of payload per temp WAL (a
bounded tail, as Raft/Kafka logs keep): the replay takes them from there and reads the
disk only for what fell out of it, the older part of a large backlog. Memory stays
bounded whatever the write rate; the log on disk stays the record of truth.

A fresh temp WAL is created on disk at its first append (before that record is
written, so every record is as durable as before): a move during which the primary
replicates nothing (an idle or empty partition) creates and deletes no log, its
directories, segment and their fsyncs, nor its sync thread. Nothing reads an absent
log: a restart deletes whatever temp WAL it finds and starts the move over.
"""
from __future__ import annotations

import collections
import enum
import os
import shutil
import struct
import threading
from dataclasses import dataclass
from typing import Generator, Iterator

from faults import fileio
from wal import Follower, RawRecord, Wal, WalClosedError

SEGMENT_SIZE = 16 << 20
CACHE_BYTES = 32 << 20      # newest payload bytes kept in memory for the replay, per temp WAL
# counter, key length, value length (-1 = remove)
_HEAD = struct.Struct(">QIi")


class TempRecord(enum.IntEnum):
    UPDATE = 1


@dataclass(frozen=True)
class Update:
    counter: int
    key: bytes
    value: bytes | None

    def encode(self) -> bytes:
        vlen = -1 if self.value is None else len(self.value)
        return _HEAD.pack(self.counter, len(self.key), vlen) + self.key + (self.value or b"")

    @classmethod
    def decode(cls, buf: bytes) -> "Update":
        counter, klen, vlen = _HEAD.unpack_from(buf)
        k0 = _HEAD.size
        key = bytes(buf[k0:k0 + klen])
        value = None if vlen < 0 else bytes(buf[k0 + klen:k0 + klen + vlen])
        return cls(counter, key, value)


def tmpwal_dir(data: str, cache: str, p: int) -> str:
    return os.path.join(data, "tmpwal", cache, f"part-{p}")


def leftovers(data: str) -> list[tuple[str, int]]:
    """(cache, partition) of every temp WAL left in ``DATA/tmpwal`` (after a crash)."""
    root = os.path.join(data, "tmpwal")
    out = []
    for cache in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        for name in sorted(os.listdir(os.path.join(root, cache))):
            if name.startswith("part-") and name[5:].isdigit():
                out.append((cache, int(name[5:])))
    return out


def remove(data: str, cache: str, p: int) -> None:
    """Delete a leftover temp WAL (not open by anyone)."""
    path = tmpwal_dir(data, cache, p)
    if not os.path.isdir(path):
        return
    io = fileio.layer()
    for name in os.listdir(path):
        io.unlink(os.path.join(path, name))
    os.rmdir(path)
    io.fsync_dir(os.path.dirname(path))


class TempWalSink:
    """``append`` (durable on return, with ``sync`` != none), ``read(lsn, limit)``,
    ``backlog()``, ``destroy()``. ``replayed`` is the LSN the replay has reached."""

    def __init__(self, path: str, sync: str = "group", cache_bytes: int = CACHE_BYTES, *,
                 lazy: bool = False) -> None:
        self.path, self.sync_mode = path, sync
        # (lsn, update, payload bytes) of the newest records; the lock orders the
        # appender's evictions against the replay's takes
        self.cache: collections.deque[tuple[int, Update, int]] = collections.deque()
        self.cache_size, self.cache_bytes = 0, cache_bytes
        self.cache_lock = threading.Lock()
        self._wal: Wal | None = None
        self._open_lock = threading.Lock()
        self._ended = False               # closed or destroyed: never opened again
        if not lazy:
            self._open()
        self.replayed = self.first_lsn - 1
        self.appended_bytes = 0
        self.appended = 0                 # records appended by this process (ingest rate)

    @classmethod
    def fresh(cls, data: str, cache: str, p: int, sync: str = "group") -> "TempWalSink":
        """A new, empty temp WAL for p (whatever an earlier attempt left is deleted),
        created on disk at its first append."""
        remove(data, cache, p)
        return cls(tmpwal_dir(data, cache, p), sync, lazy=True)

    def _open(self) -> Wal:
        with self._open_lock:
            if self._wal is None:
                if self._ended:
                    raise WalClosedError(f"temp WAL {self.path} is closed")
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                self._wal = Wal.open(self.path, sync=self.sync_mode, segment_size=SEGMENT_SIZE)
            return self._wal

    @property
    def wal(self) -> Wal:
        """The log on disk (created now if no record made it exist yet)."""
        w = self._wal
        return w if w is not None else self._open()

    @property
    def on_disk(self) -> bool:
        """Whether the log exists on disk (a record was appended, or it was opened)."""
        return self._wal is not None

    @property
    def first_lsn(self) -> int:
        w = self._wal
        return w.first_lsn if w is not None else 1      # a new log's first LSN (Wal.open)

    def append(self, counter: int, key: bytes, value: bytes | None, *, durable: bool = True) -> None:
        """Durable on return (unless sync is none); ``durable=False``: written in order
        to the OS only, :meth:`sync` makes it durable (one fsync for a batch)."""
        u = Update(counter, key, value)
        payload = u.encode()
        lsn = self.wal.append(payload, TempRecord.UPDATE, wait=durable)
        self.appended_bytes += len(payload)
        self.appended += 1
        if self.cache_bytes:
            with self.cache_lock:
                self.cache.append((lsn, u, len(payload)))
                self.cache_size += len(payload)
                while self.cache_size > self.cache_bytes:
                    self.cache_size -= self.cache.popleft()[2]

    def sync(self) -> None:
        """Make every append so far durable (no-op with sync = none, or no append)."""
        w = self._wal
        if self.sync_mode != "none" and w is not None:
            w.sync()

    def read(self, lsn: int, limit: int | None) -> list[tuple[int, Update]]:
        """Up to ``limit`` (lsn, update) from ``lsn`` on; [] when nothing is there yet.
        (One read through a :meth:`cursor`, the replay's reader.)"""
        cursor = self.cursor(lsn)
        try:
            return cursor.read(limit)
        finally:
            cursor.close()

    def cursor(self, lsn: int) -> "TempWalCursor":
        """A forward reader from ``lsn`` kept open for a whole replay (see
        :class:`TempWalCursor`); close it when done."""
        return TempWalCursor(self, lsn)

    def records(self) -> Iterator[Update]:
        w = self._wal
        if w is None:
            return
        for r in w.read_from(None):
            yield Update.decode(r.payload)

    @property
    def last_lsn(self) -> int:
        w = self._wal
        return w.last_lsn if w is not None else self.first_lsn - 1

    def backlog(self) -> int:
        """Updates buffered and not yet replayed."""
        return max(self.last_lsn - self.replayed, 0)

    def _drop_cache(self) -> None:
        with self.cache_lock:
            self.cache.clear()
            self.cache_size = 0

    def _end(self) -> Wal | None:
        with self._open_lock:
            self._ended = True
            return self._wal

    def destroy(self) -> None:
        self._drop_cache()
        w = self._end()
        if w is not None:                 # else nothing was ever on disk
            w.destroy()
            shutil.rmtree(self.path, ignore_errors=True)

    def close(self) -> None:
        self._drop_cache()
        w = self._end()
        if w is not None:
            w.close()


class TempWalCursor:
    """Reads one temp WAL forward for the replay: from the sink's in-memory tail when
    the next record is still there, else from disk with ONE open reader
    (``Wal.follow``, opened at the first disk read). A fresh ``read_from(lsn)`` per
    batch would decode the segment from its start up to ``lsn`` every time (the log
    has no LSN -> offset index).

    :meth:`read` returns only records already written (up to ``last_lsn`` when it is
    called), so it never waits for an appender; appends never wait for it either
    (they share only the short cache lock)."""

    def __init__(self, sink: TempWalSink, lsn: int) -> None:
        self.sink = sink
        self.next = lsn                   # LSN of the next record to return
        self.from_disk = 0                # records read from disk (the rest: from memory)
        self._follower: Follower | None = None
        self._batches: Generator[list[RawRecord], None, None] | None = None
        self._held: list[tuple[int, int, bytes]] = []
        self._at = 0

    def read(self, max_records: int | None, max_bytes: int | None = None) -> list[tuple[int, Update]]:
        """Up to ``max_records`` (None: no limit) records, stopping once they hold
        ``max_bytes`` of payload (at least one record), from :attr:`next` up to the
        last record written when called; [] when there is none."""
        end = self.sink.last_lsn
        out: list[tuple[int, Update]] = []
        size = 0
        while self.next <= end and (max_records is None or len(out) < max_records) \
                and (max_bytes is None or size < max_bytes):
            lsn, u, n = self._cached() or self._from_disk()
            out.append((lsn, u))
            size += n
        return out

    def _cached(self) -> tuple[int, Update, int] | None:
        """The next record from the sink's in-memory tail (dropping what the replay is
        past), or None when it is not there (evicted, or not cached yet)."""
        sink = self.sink
        with sink.cache_lock:
            cache = sink.cache
            while cache and cache[0][0] < self.next:
                sink.cache_size -= cache.popleft()[2]
            if not cache or cache[0][0] != self.next:
                return None
            rec = cache.popleft()
            sink.cache_size -= rec[2]
        self.next = rec[0] + 1
        return rec

    def _from_disk(self) -> tuple[int, Update, int]:
        """The next record from the log (the caller knows it is written)."""
        if self._follower is None:
            self._follower = self.sink.wal.follow(self.next)
            self._batches = self._follower.batches()
        assert self._batches is not None  # made with the follower
        while True:
            if self._at >= len(self._held):
                # the record is written: the follower yields it without waiting
                batch = next(self._batches, None)
                if batch is None:
                    raise WalClosedError(f"temp WAL {self.sink.path} closed during the replay")
                self._held, self._at = batch, 0
            lsn, _type, payload = self._held[self._at]
            self._at += 1
            if lsn >= self.next:
                self.next = lsn + 1
                self.from_disk += 1
                return lsn, Update.decode(payload), len(payload)

    def close(self) -> None:
        if self._follower is not None:
            self._follower.close()
            assert self._batches is not None  # made with the follower
            self._batches.close()         # releases the segment's file descriptor
