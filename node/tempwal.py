"""The catch-up temporary WAL of one MOVING partition (files mode): the ``Move.sink``
that buffers the updates the primary replicates to this copy while its file travels.

One :class:`wal.Wal` per partition at ``DATA/tmpwal/<cache>/part-<p>/``. Each record is
one update with its partition update counter, appended durably before the replicate
call returns, so the primary's acknowledgement never precedes it. The log lives on
disk: a long move under heavy writes does not grow memory with the write rate.

Appends (the replicate handler) and the replaying reader (the move thread) run at the
same time; the reader only reads what is already written, so appends never wait for it
(writes beat reads, as the seed asks).
"""
from __future__ import annotations

import enum
import itertools
import os
import shutil
import struct
from dataclasses import dataclass
from typing import Iterator

from faults import fileio
from wal import Wal

SEGMENT_SIZE = 16 << 20
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

    def __init__(self, path: str, sync: str = "group") -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.path, self.sync_mode = path, sync
        self.wal = Wal.open(path, sync=sync, segment_size=SEGMENT_SIZE)
        self.replayed = self.wal.first_lsn - 1
        self.appended_bytes = 0
        self.appended = 0                 # records appended by this process (ingest rate)

    @classmethod
    def fresh(cls, data: str, cache: str, p: int, sync: str = "group") -> "TempWalSink":
        """A new, empty temp WAL for p (whatever an earlier attempt left is deleted)."""
        remove(data, cache, p)
        return cls(tmpwal_dir(data, cache, p), sync)

    def append(self, counter: int, key: bytes, value: bytes | None, *, durable: bool = True) -> None:
        """Durable on return (unless sync is none); ``durable=False``: written in order
        to the OS only, :meth:`sync` makes it durable (one fsync for a batch)."""
        payload = Update(counter, key, value).encode()
        self.wal.append(payload, TempRecord.UPDATE, wait=durable)
        self.appended_bytes += len(payload)
        self.appended += 1

    def sync(self) -> None:
        """Make every append so far durable (no-op with sync = none)."""
        if self.sync_mode != "none":
            self.wal.sync()

    def read(self, lsn: int, limit: int | None) -> list[tuple[int, Update]]:
        """Up to ``limit`` (lsn, update) from ``lsn`` on; [] when nothing is there yet."""
        if self.wal.last_lsn < lsn:
            return []
        return [(r.lsn, Update.decode(r.payload))
                for r in itertools.islice(self.wal.read_from(lsn), limit)]

    def records(self) -> Iterator[Update]:
        for r in self.wal.read_from(None):
            yield Update.decode(r.payload)

    @property
    def last_lsn(self) -> int:
        return self.wal.last_lsn

    def backlog(self) -> int:
        """Updates buffered and not yet replayed."""
        return max(self.wal.last_lsn - self.replayed, 0)

    def destroy(self) -> None:
        self.wal.destroy()
        shutil.rmtree(self.path, ignore_errors=True)

    def close(self) -> None:
        self.wal.close()
