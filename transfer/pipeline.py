"""The second thread on each side of a transfer, so hashing and disk I/O overlap with
the wire instead of taking turns with it (2 cores are enough for the whole pipeline).

- :class:`AheadHasher` (supplier): reads and hashes chunk i+1.. while chunk i is sent
  by ``sendfile``, so each CHUNK frame can carry its checksum without a pass over the
  whole file before the first byte (protocol version 1 had that pass).
- :class:`ChunkSink` (demander): records each received chunk for resume (the batched
  ``fdatasync`` of the temp file and the journal stay off the receive loop). On plain
  TCP the receive loop has already checked and written the chunk (one pass over the
  bytes, transfer.receive); on other streams this thread writes it to the temp file
  and hashes it while the receive loop reads the next one into another buffer; when
  the receive loop spliced the chunk into the file (transfer.splice), it hashes it
  from the page cache. ``recv_into``, ``pwrite``, ``preadv``, xxh3 and Poly1305 all
  release the GIL.
"""
from __future__ import annotations

import os
import queue
import threading
from typing import Callable, Iterable

from . import datamac
from .datamac import KeyFor, Tagger
from .errors import TransferError
from .resume import checksum, new_hasher
from .storage import Snapshot

# The supplier hashes a chunk in slices read into a buffer that stays in a core's L2
# cache: reading a 4 MiB chunk into one buffer and hashing it cost 3x the CPU here
# (0.2 s vs 0.06 s per 256 MiB), the copy and the hash both going to memory.
SLICE = 256 << 10


class Preimages:
    """The supplier's view of a snapshot's saved pre-images (page -> bytes at C),
    re-read only when the storage says there are new ones."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self._count = -1
        self._pages: dict[int, bytes] = {}
        self._lock = threading.Lock()

    def current(self) -> dict[int, bytes]:
        with self._lock:
            count = self.snap.preimage_count() if self.snap.preimage_count else None
            if count is None or count != self._count:
                self._pages = {i: bytes(b) for i, b in self.snap.preimages() if i < self.snap.page_count}
                self._count = -1 if count is None else count
            return self._pages


class ChunkSums:
    """A chunk's checksum (xxh3) and, with a MAC key (a sealed session), its Poly1305 MAC
    (transfer.datamac), fed piece by piece. ``result`` or ``matches`` once, at the end."""

    def __init__(self, key: bytes | None) -> None:
        self._h = new_hasher()
        self._t = Tagger(key) if key is not None else None

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._h.update(data)
        if self._t is not None:
            self._t.update(data)

    def result(self) -> tuple[int, bytes]:
        """(checksum, MAC or b"" without a key)."""
        return self._h.intdigest(), self._t.tag() if self._t is not None else b""

    def matches(self, expected: int, mac: bytes) -> bool:
        """Both sums are the ones a CHUNK frame announced (the MAC compared in constant time)."""
        s, tag = self.result()
        return s == expected and (self._t is None or datamac.same(tag, mac))


def chunk_as_of_c(snap: Snapshot, span: tuple[int, int], pre: Preimages | dict[int, bytes],
                  buf: bytearray | None = None) -> memoryview:
    """The chunk at ``span`` (offset, length) as of C: the live bytes, overlaid with the
    pre-images known AFTER the read. A page overwritten after C has its pre-image saved
    (durably) before the overwrite, so whatever post-C bytes the read saw are corrected."""
    off, n = span
    if buf is None or len(buf) < n:
        buf = bytearray(n)
    view = memoryview(buf)[:n]
    got = os.preadv(snap.fd, [view], off)
    if got != n:
        raise TransferError(f"{snap.path} is shorter than its snapshot size {snap.size} (at offset {off})")
    pages = pre.current() if isinstance(pre, Preimages) else pre
    if pages:
        ps = snap.page_size
        for page in range(off // ps, (off + n + ps - 1) // ps):
            if page in pages:
                lo = page * ps - off
                view[lo:lo + ps] = pages[page][:n - lo]
    return view


def chunk_sums(snap: Snapshot, span: tuple[int, int], pre: Preimages, buf: bytearray,
               key: bytes | None) -> tuple[int, bytes]:
    """(checksum, MAC) of the chunk at ``span`` as of C; the MAC (transfer.datamac) only
    with a ``key`` (a sealed session), else b"". Read in cache-sized slices, as
    :func:`chunk_checksum`."""
    if key is None:
        return chunk_checksum(snap, span, pre, buf), b""
    off, n = span
    view = memoryview(buf)[:SLICE]
    sums = ChunkSums(key)
    for lo in range(0, n, SLICE):
        k = min(SLICE, n - lo)
        if os.preadv(snap.fd, [view[:k]], off + lo) != k:
            raise TransferError(f"{snap.path} is shorter than its snapshot size {snap.size} "
                                f"(at offset {off + lo})")
        sums.update(view[:k])
    pages = pre.current()
    ps = snap.page_size
    if pages and any(p in pages for p in range(off // ps, (off + n + ps - 1) // ps)):
        data = chunk_as_of_c(snap, span, pre)
        return checksum(data), datamac.tag(key, data)
    return sums.result()


def chunk_checksum(snap: Snapshot, span: tuple[int, int], pre: Preimages, buf: bytearray) -> int:
    """Checksum of the chunk at ``span`` as of C, read in cache-sized slices. Pre-images
    are looked at after the reads (see chunk_as_of_c); if one falls in the chunk, the
    chunk is read again whole and overlaid (rare: only pages written after C)."""
    off, n = span
    view = memoryview(buf)[:SLICE]
    h = new_hasher()
    for lo in range(0, n, SLICE):
        k = min(SLICE, n - lo)
        if os.preadv(snap.fd, [view[:k]], off + lo) != k:
            raise TransferError(f"{snap.path} is shorter than its snapshot size {snap.size} "
                                f"(at offset {off + lo})")
        h.update(view[:k])
    pages = pre.current()
    ps = snap.page_size
    if pages and any(p in pages for p in range(off // ps, (off + n + ps - 1) // ps)):
        return checksum(chunk_as_of_c(snap, span, pre))   # pre-images fetched after this read
    return h.intdigest()


class AheadHasher:
    """Hashes the chunks ``indexes`` (as of C) in order, up to ``depth`` ahead of the
    consumer. ``next()`` returns (index, checksum) or raises what the thread hit."""

    def __init__(self, snap: Snapshot, indexes: Iterable[int],
                 span: Callable[[int], tuple[int, int]], pre: Preimages, depth: int = 4,
                 key: KeyFor | None = None) -> None:
        self._q: queue.Queue[tuple[int, int, bytes] | BaseException] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._key = key                    # offset -> the chunk's MAC key (a sealed session)
        self._args = (snap, list(indexes), span, pre)
        # one chunk (most partitions of a large cluster): hashed in next(), no thread
        self._thread: threading.Thread | None = None
        if len(self._args[1]) > 1:
            self._thread = threading.Thread(target=self._run, name="ferry-hash-ahead", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        snap, indexes, span, pre = self._args
        buf = bytearray(SLICE)
        try:
            for i in indexes:
                sp = span(i)
                s, mac = chunk_sums(snap, sp, pre, buf, self._key(sp[0]) if self._key else None)
                if not self._put((i, s, mac)):
                    return
        except BaseException as e:   # handed to the consumer, which reports it
            self._put(e)

    def _put(self, item: tuple[int, int, bytes] | BaseException) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def next(self) -> tuple[int, int, bytes]:
        """(chunk index, checksum at C, MAC at C or b"")."""
        if self._thread is None and self._q.empty():
            self._run()           # the one chunk, hashed now
        item = self._q.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)


# A chunk handed to the writer thread: buffer, index, offset, length, expected checksum,
# MAC key (None: unsealed), the MAC its frame carried, and whether it matched when the
# receive loop wrote and checked it itself (None: this thread checks it).
_Work = tuple[memoryview, int, int, int, int, "bytes | None", bytes, "bool | None"]


class ChunkSink:
    """The demander's writer thread. The receive loop takes a free chunk buffer
    (``buffer``), fills it from the socket and hands it over (``put``); this thread
    writes it at its offset, hashes it and calls ``done(index, length, expected, ok)``
    (which records it for resume), then frees the buffer. The first error (a full
    disk ...) stops the work and is raised in the receive loop at its next
    ``buffer``/``drain``. (Handing over 1 MiB pieces of a chunk, to keep the buffers
    in the CPU caches, was measured: more receive CPU for the extra hand-offs.)"""

    def __init__(self, chunk_size: int, write: Callable[[int, memoryview], None],
                 done: Callable[[int, int, int, bool], None], depth: int = 3,
                 in_file: int | None = None, checked: bool = False, threaded: bool = True) -> None:
        self._write, self._done = write, done
        # in_file: the receive loop puts chunks into this file itself (splice); the
        # "buffers" are then only tokens bounding how far hashing may lag behind, so
        # a chunk is hashed while its pages are still in the CPU's last-level cache.
        self._in_file = in_file
        self._slice = memoryview(bytearray(SLICE))
        self._free: queue.Queue[memoryview] = queue.Queue()
        # checked: the receive loop writes and checks every chunk itself (put_checked);
        # the buffers are then tokens too
        for _ in range(depth):
            self._free.put(memoryview(bytearray(0 if in_file is not None or checked else chunk_size)))
        self._work: queue.Queue[_Work | None] = queue.Queue()   # None: stop
        self._error: BaseException | None = None
        # not threaded: the caller does the work itself in put (a fetch of one chunk
        # gains nothing from a second thread and would pay its start and hand-offs)
        self._thread: threading.Thread | None = None
        if threaded:
            self._thread = threading.Thread(target=self._run, name="ferry-chunk-sink", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._work.get()
            try:
                if item is None:
                    return
                self._handle(item)
            finally:
                self._work.task_done()

    def _handle(self, item: _Work) -> None:
        try:
            buf, index, offset, length, expected, key, mac, checked = item
            if self._error is None:
                if checked is not None:
                    ok = checked
                elif self._in_file is not None:
                    ok = self._file_sums(offset, length, key) == (expected, mac)
                else:
                    data = buf[:length]
                    self._write(offset, data)
                    ok = checksum(data) == expected and (
                        key is None or datamac.same(datamac.tag(key, data), mac))
                self._done(index, length, expected, ok)
            self._free.put(buf)
        except BaseException as e:   # raised in the receive loop
            self._error = e
            self._free.put(item[0])

    def _submit(self, item: _Work) -> None:
        if self._thread is None:
            self._handle(item)
        else:
            self._work.put(item)

    def _file_sums(self, offset: int, length: int, key: bytes | None) -> tuple[int, bytes] | None:
        """The checksum (and with ``key`` the MAC, else b"") of what is in the file now
        (None if it is shorter), read in cache-sized slices into one reused buffer.
        (Hashing through an ``mmap`` of the chunk instead measured the same CPU in the
        demander, 0.40-0.46 s/GiB for this thread either way, and touching a mapping
        past the end of a file is SIGBUS.)"""
        fd = self._in_file
        assert fd is not None
        sums, v = ChunkSums(key), self._slice
        for lo in range(0, length, SLICE):
            k = min(SLICE, length - lo)
            if os.preadv(fd, [v[:k]], offset + lo) != k:
                return None
            sums.update(v[:k])
        return sums.result()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error      # sticky: nothing more is written after a failure

    def buffer(self) -> memoryview:
        while True:
            self._raise()
            try:
                return self._free.get(timeout=0.2)
            except queue.Empty:
                continue

    def put(self, buf: memoryview, index: int, offset: int, length: int, expected: int,
            key: bytes | None = None, mac: bytes = b"") -> None:
        """``key``/``mac``: the chunk's MAC key and the MAC its (sealed) frame carried
        (transfer.datamac); the chunk is good only if both sums match."""
        self._submit((buf, index, offset, length, expected, key, mac, None))

    def put_checked(self, buf: memoryview, index: int, offset: int, length: int, expected: int,
                    ok: bool) -> None:
        """A chunk the receive loop has already written and checked itself (``ok``: both
        sums matched): this thread only records it (``done``), off the receive loop."""
        self._submit((buf, index, offset, length, expected, None, b"", ok))

    def drain(self) -> None:
        """Wait until every chunk handed over is written and recorded."""
        if self._thread is not None:
            self._work.join()
        self._raise()

    def close(self) -> None:
        if self._thread is not None:
            self._work.put(None)
            self._thread.join(30.0)
