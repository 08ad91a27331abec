"""The demander's receiving file and its durable record of verified chunks.

Next to the target ``part-<p>.bin`` the demander keeps

- ``part-<p>.bin.ferry-tmp``: the file being received (never installed unless complete
  and verified), and
- ``part-<p>.bin.ferry-resume``: a journal of the chunks of the temp file that passed
  their checksum. Layout: a 16-byte header ``b"FYRESUM1", u32 chunk_size, u32 crc``
  then 20-byte records ``u32 index, u32 length, u64 xxh3_64, u32 crc`` (CRC32C of the
  bytes before it in the header/record).

Order makes it crash-safe: chunk data is fdatasync'ed before the records naming it are
appended and fdatasync'ed, so a record never names data a power cut could lose. The
record is only an optimisation; any doubt (torn or bad record, a chunk that no longer
hashes to its record) drops the chunk and it is fetched again. Flushes are batched
(every ``sync_bytes``) because an fsync per chunk would cost more than the transfer.

The journal is created by the first flush that has records to write, and not at all
once the fetch is known to be of at most one chunk (:meth:`Receiving.without_journal`):
such a file has nothing to resume from, a crash simply fetches it again, and the
journal's atomic write (fsync, rename, directory fsync) and removal would be most of
the fixed cost of installing an empty or small partition.
"""
from __future__ import annotations

import contextlib
import os
import stat
import struct

from faults.crc import crc32c
import xxhash

from faults import fileio

from . import safefs
from .errors import OutOfDiskError, UnsafePath

TMP_SUFFIX = ".ferry-tmp"
JOURNAL_SUFFIX = ".ferry-resume"


def partial_paths(target: str) -> tuple[str, str]:
    """The files an unfinished fetch of ``target`` leaves next to it: the temp file
    being received and its resume journal (a holder that gives the partition up
    deletes both)."""
    return target + TMP_SUFFIX, target + JOURNAL_SUFFIX


_MAGIC = b"FYRESUM1"
_HEAD = struct.Struct("<8sII")
_REC = struct.Struct("<IIQI")


def checksum(data: bytes | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(data)


def new_hasher() -> xxhash.xxh3_64:
    """The same checksum fed piece by piece (``update``, then ``intdigest``)."""
    return xxhash.xxh3_64()


class Receiving:
    """The temp file and journal of one partition being received."""

    def __init__(self, target: str, chunk_size: int, *, sync_bytes: int = 32 << 20) -> None:
        self.target = target
        self.tmp_path, self.journal_path = partial_paths(target)
        self.chunk_size = chunk_size
        self.sync_bytes = sync_bytes
        self.held: dict[int, tuple[int, int]] = {}     # index -> (length, checksum), durable
        self._pending: list[tuple[int, int, int]] = []
        self._pending_bytes = 0
        self.io = fileio.layer()
        # Never through a link or into a FIFO or another file's inode: a temp file is
        # resumed only if it is a regular file of its own; anything else planted here is
        # removed and a new file created exclusively (transfer.safefs).
        fd = safefs.open_existing(self.tmp_path, os.O_RDWR, self.io)
        self.fd = fd if fd is not None else safefs.create_new(self.tmp_path, os.O_RDWR, self.io)
        self._jfd = -1
        self.journaling = True     # False: verified chunks are not recorded (one-chunk file)
        try:
            self._load()
        except BaseException:
            self.close()
            raise

    # -- opening -----------------------------------------------------------------
    def _load(self) -> None:
        fd = safefs.open_existing(self.journal_path, os.O_RDONLY, self.io)
        raw = b""
        if fd is not None:
            try:
                raw = _read_all(fd)
            finally:
                self.io.close(fd)
        records = self._parse(raw)
        if records is None:
            return         # none to resume from; a new one is written by the first flush
        size = os.fstat(self.fd).st_size
        for idx, length, s in records:
            off = idx * self.chunk_size
            if off + length <= size and checksum(os.pread(self.fd, length, off)) == s:
                self.held[idx] = (length, s)
        jfd = safefs.open_existing(self.journal_path, os.O_WRONLY | os.O_APPEND, self.io)
        if jfd is None:                # replaced by something else meanwhile: start over
            self.held.clear()
        else:
            self._jfd = jfd

    def _parse(self, raw: bytes) -> list[tuple[int, int, int]] | None:
        if len(raw) < _HEAD.size:
            return None
        magic, cs, crc = _HEAD.unpack_from(raw)
        if magic != _MAGIC or crc != crc32c(raw[:12]) or cs != self.chunk_size:
            return None
        out = []
        for pos in range(_HEAD.size, len(raw) - _REC.size + 1, _REC.size):
            idx, length, s, crc = _REC.unpack_from(raw, pos)
            if crc != crc32c(raw[pos:pos + 16]):
                break      # torn or damaged: everything after it is re-fetched
            out.append((idx, length, s))
        return out

    def _new_journal(self) -> None:
        """A fresh journal, atomically (fileio.atomic_write, which creates its temp file
        exclusively and never writes through a planted ``.tmp`` link)."""
        head = _HEAD.pack(_MAGIC, self.chunk_size, 0)[:12]
        tmp = self.journal_path + ".tmp"
        # a crash's leftover goes quietly; anything planted is reported, a directory refused
        safefs.remove_planted(tmp, self.io, stale_ok=True)
        try:
            fileio.atomic_write(self.journal_path, head + struct.pack("<I", crc32c(head)),
                                error=OutOfDiskError)
        except OSError as e:
            raise _disk_error(e, tmp, None) from e      # ENOSPC at the fsync too
        jfd = safefs.open_existing(self.journal_path, os.O_WRONLY | os.O_APPEND, self.io)
        if jfd is None:
            raise UnsafePath(f"{self.journal_path} was replaced right after it was written; "
                             "something keeps planting files in this directory")
        self._jfd = jfd

    @staticmethod
    def stored_chunk_size(target: str) -> int | None:
        """The chunk size of a resumable record for ``target``, if there is one."""
        try:
            raw = safefs.read_head(target + JOURNAL_SUFFIX, _HEAD.size)
        except (OSError, UnsafePath):
            return None       # no journal, or not one to trust (a FIFO would block here)
        if len(raw) == _HEAD.size and raw[:8] == _MAGIC and \
                _HEAD.unpack(raw)[2] == crc32c(raw[:12]):
            chunk_size: int = _HEAD.unpack(raw)[1]
            return chunk_size
        return None

    # -- receiving -----------------------------------------------------------------
    def held_checksums(self) -> dict[int, int]:
        return {i: s for i, (_, s) in self.held.items()}

    def write_at(self, offset: int, data: bytes | memoryview) -> None:
        view = memoryview(data)
        try:
            while view:
                n = self.io.pwrite(self.fd, view[:fileio.WRITE_SLICE], offset)
                view, offset = view[n:], offset + n
        except OSError as e:
            raise _disk_error(e, self.tmp_path, len(view)) from e

    def write_error(self, e: OSError, needed: int | None) -> BaseException:
        """A failed write to the temp file as the error to raise (disk full ...)."""
        return _disk_error(e, self.tmp_path, needed)

    def verified(self, index: int, length: int, s: int) -> None:
        """Chunk ``index`` is in the temp file and matches; make it durable in batches."""
        self._pending.append((index, length, s))
        self._pending_bytes += length
        if self._pending_bytes >= self.sync_bytes:
            self.flush()

    def without_journal(self) -> None:
        """The file is empty or a single chunk: record nothing. A journal already here
        (an earlier fetch's) is left as it is and deleted with the temp file; the chunk
        received now is never listed as held, so a failed fetch leaves no litter and
        the next one fetches it whole. The temp file is still fsynced by :meth:`finish`
        before it is installed."""
        self.journaling = False

    def forget(self, index: int) -> None:
        """Chunk ``index`` is about to be overwritten: it no longer counts as held.
        (Its old journal record stays; on reload the re-hash drops it.)"""
        self.held.pop(index, None)

    def flush(self) -> None:
        if not self._pending:
            return
        if not self.journaling:
            self._pending.clear()
            self._pending_bytes = 0
            return
        if self._jfd < 0:
            self._new_journal()
        try:
            self.io.fdatasync(self.fd)          # data first, then the records that name it
            recs = b"".join(_rec(i, n, s) for i, n, s in self._pending)
            fileio.write_all(self._jfd, recs, self.journal_path, error=OutOfDiskError, io=self.io)
            self.io.fdatasync(self._jfd)
        except OSError as e:
            raise _disk_error(e, self.tmp_path, None) from e
        for i, n, s in self._pending:
            self.held[i] = (n, s)
        self._pending.clear()
        self._pending_bytes = 0

    def finish(self, size: int) -> None:
        """Cut to ``size`` and make the whole temp file durable before install."""
        try:
            self.io.ftruncate(self.fd, size)
            self.io.fsync(self.fd)
        except OSError as e:
            raise _disk_error(e, self.tmp_path, None) from e

    def close(self) -> None:
        for fd in (self.fd, self._jfd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    self.io.close(fd)
        self.fd = self._jfd = -1

    def check_in_place(self) -> None:
        """Before install: the temp path still names the file this side wrote (a link
        or another file swapped in would be renamed into place otherwise)."""
        try:
            now = os.lstat(self.tmp_path)
        except FileNotFoundError:
            now = None
        mine = os.fstat(self.fd)
        if now is None or not stat.S_ISREG(now.st_mode) or \
                (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
            what = "gone" if now is None else f"now {safefs.kind(now.st_mode)} " \
                "that is not the file received"
            raise UnsafePath(f"{self.tmp_path} is {what}; nothing installed")

    def drop_journal(self) -> None:
        """After :meth:`close`: delete the journal only. The temp file stays, to be used
        whole (a delta fetch's base) rather than resumed."""
        with contextlib.suppress(FileNotFoundError):
            self.io.unlink(self.journal_path)

    def discard_journal(self) -> None:
        """After install (or when giving up): the record has nothing left to describe."""
        self.close()
        for p in (self.journal_path, self.tmp_path):
            with contextlib.suppress(FileNotFoundError):
                self.io.unlink(p)


def _read_all(fd: int) -> bytes:
    parts: list[bytes] = []
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            return b"".join(parts)
        parts.append(b)


def _rec(i: int, n: int, s: int) -> bytes:
    body = struct.pack("<IIQ", i, n, s)
    return body + struct.pack("<I", crc32c(body))


def _disk_error(e: OSError, path: str, needed: int | None) -> BaseException:
    from faults import translate_os_error
    return translate_os_error(e, path, needed, OutOfDiskError)
