"""Copy-on-write transfer snapshots and their delta files ``part-<p>.bin.delta``.

A snapshot is fixed at the checkpoint with update counter C that opened it: the live
file's first ``page_count`` pages as they were at C.  The sender reads the live file
(sendfile) through the store's descriptor of it, :meth:`TransferSnapshot.fileno`,
which the store keeps open (pinned in its open files, ``files.py``) until the snapshot
closes (the transfer storage sends from a duplicate of it, a reference of its own),
and reports progress with :meth:`TransferSnapshot.mark_sent`.  Page ``i``
with ``i < page_count`` and ``i >= sent_offset // page_size`` (not fully sent yet) is
saved to the delta file (:meth:`save_preimages`), at most once per page, with its
bytes at C, before any checkpoint can overwrite it: when a writer first changes it
after a cut (the same bytes as its undo image, ``undo.py``), when the snapshot opens
for pages changed since C's cut (read from the file, which C left as of C), and at a
checkpoint's cut for the meta page.  Overlaying the saved pages on what was sent and
cutting to ``page_count`` pages gives the partition at C exactly.

Durability: none is needed, so the delta file is never fsynced.  The only reader is
the supplier process (``preimages()``), which reads through the same page cache the
write went to, and the write completes before the checkpointer's overwrite of the
page starts - that ordering is what "saved before the overwrite" requires.  A crash
of the supplier process or of the machine ends the snapshot (docs/protocol.md,
section 4: the demander re-demands and a new snapshot is opened) and the store deletes
every ``*.delta`` at open, so no delta byte is ever read after a crash.

Delta layout (little-endian)::

    magic "FERRYDL\\0" | version u16 | reserved u16 | partition u32 | page_size u32 | page_count u32 | counter u64
    records: page u32 | crc u32 (CRC32C of the page bytes) | page bytes

Delta files are scratch: a crash loses the snapshot, and the store deletes every
``*.delta`` at open.  A torn last record (crash) is therefore never read.
"""
from __future__ import annotations

import os
import struct
import threading
from typing import Callable, Iterator

from faults.crc import crc32c

from faults import fileio

from .errors import CheckpointError

MAGIC = b"FERRYDL\x00"
VERSION = 1
_HEAD = struct.Struct("<8sHHIIIQ")
_REC = struct.Struct("<II")
SUFFIX = ".delta"


class TransferSnapshot:
    """An open transfer snapshot of one partition (see module doc)."""

    def __init__(self, partition: int, path: str, page_size: int, page_count: int,
                 counter: int, on_close: Callable[[TransferSnapshot], None], *,
                 fd: int = -1) -> None:
        self.partition, self.path = partition, path
        self._file_fd = fd                   # the live file, open until close (the store's)
        self.page_size, self.page_count, self.counter = page_size, page_count, counter
        self.size_bytes = page_size * page_count
        self.delta_path = path + SUFFIX
        self._on_close = on_close
        self._lock = threading.Lock()        # orders mark_sent against pre-image decisions
        self._sent = 0
        self._saved: set[int] = set()
        self._closed = False
        self._io = fileio.layer()
        self._fd = self._io.open(self.delta_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        fileio.write_all(self._fd, _HEAD.pack(MAGIC, VERSION, 0, partition, page_size,
                                              page_count, counter), self.delta_path, io=self._io)

    # -- sender side -------------------------------------------------------------
    def mark_sent(self, offset: int) -> None:
        """Bytes ``[0, offset)`` of the file have been read for sending; later
        overwrites of those pages need no pre-image."""
        with self._lock:
            self._sent = max(self._sent, min(offset, self.size_bytes))

    @property
    def sent_offset(self) -> int:
        return self._sent

    def fileno(self) -> int:
        """The live file's descriptor (read-only, shared: read it at explicit offsets,
        pread/sendfile, never by its file position), open until :meth:`close`;
        -1 after it, or when the snapshot was made without one."""
        return self._file_fd

    def preimages(self) -> Iterator[tuple[int, bytes]]:
        """(page index, page bytes at C) of every page overwritten before it was sent."""
        with self._lock:
            with open(self.delta_path, "rb") as f:
                data = f.read()
        at = _HEAD.size
        step = _REC.size + self.page_size
        while at + step <= len(data):
            index, crc = _REC.unpack_from(data, at)
            page = data[at + _REC.size:at + step]
            if crc32c(page) != crc:
                raise CheckpointError(f"delta file {self.delta_path}: record at offset {at} "
                                      "fails its CRC; close the snapshot and open a new one")
            yield index, page
            at += step

    @property
    def preimage_count(self) -> int:
        return len(self._saved)

    def close(self) -> None:
        """Forget the snapshot and remove its delta file."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._file_fd = -1                # the store's: released by on_close, not closed here
        try:
            with self._lock:
                self._io.close(self._fd)
                try:
                    self._io.unlink(self.delta_path)
                except FileNotFoundError:
                    pass
        finally:
            self._on_close(self)

    def __enter__(self) -> TransferSnapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- checkpointer side -------------------------------------------------------
    def save_preimages(self, pages: list[tuple[int, bytes | bytearray | memoryview]]) -> int:
        """Called before any checkpoint can overwrite ``pages`` in place, with each
        page's bytes as of the snapshot's checkpoint: save those this snapshot still
        needs (one write, no fsync - see the module doc).  Returns how many."""
        with self._lock:
            if self._closed:
                return 0
            first_unsent = self._sent // self.page_size
            out: list[bytes | bytearray | memoryview] = []
            need: list[int] = []
            for i, page in pages:
                if first_unsent <= i < self.page_count and i not in self._saved:
                    out.append(_REC.pack(i, crc32c(page)))
                    out.append(page)
                    need.append(i)
            if not need:
                return 0
            fileio.write_all(self._fd, b"".join(out), self.delta_path, io=self._io)
            self._saved.update(need)
            return len(need)


def overlay(image: bytearray, page_size: int, page_count: int,
            preimages: Iterator[tuple[int, bytes]]) -> bytearray:
    """Apply pre-images to a received copy and cut it to ``page_count`` pages (what the
    demander does; here for tests and tools)."""
    del image[page_count * page_size:]
    for index, page in preimages:
        image[index * page_size:(index + 1) * page_size] = page
    return image
