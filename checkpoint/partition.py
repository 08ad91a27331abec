"""One partition in memory: its key index, free space maps, and entry operations on
its pages through page memory.  Every method runs under the store lock.

In-memory state (rebuilt at open by one sequential scan of the file):

* ``index``: key -> ``page << 16 | slot`` of its entry (live or tombstone), a
  :class:`~checkpoint.keyindex.KeyIndex` of key hashes (the keys stay in the pages).
  This is the one per-key structure kept in memory: ~28 bytes per key (16-43).
* ``space``: reusable bytes per page (an ``array('I')``, 0 for non-DATA pages: 4 bytes
  per page, no per-page object); ``roomy``: DATA pages with at least a quarter page
  free, where inserts go; ``free_pages``: a min-heap of FREE pages, reused lowest first
  so a partition that shrinks and grows again keeps its file compact.

Every change of a page goes through :meth:`writable`, :meth:`_alloc` or :meth:`_free`,
which first hand the page's bytes at the last checkpoint cut to the store's undo-image
log when this is the page's first change since that cut (``checkpoint/undo.py``).

The file is read and written through the store's :class:`~checkpoint.files.FileCache`
(``files.py``): no descriptor is held between uses, each read pins the file for its
syscall, and the checkpointer's writes keep it open until their fsync.
"""
from __future__ import annotations

import heapq
from array import array
from typing import TYPE_CHECKING, Callable, Iterator

from . import page as pg
from .accel import key_scan_accel
from .chain import chain_limit, chain_link_problem
from .check import check_page
from .decode import page_entries
from .errors import CorruptPageError
from .files import FileCache
from .keyindex import KeyIndex, PageKeys
from .keyscan import iter_page_keys, scan_key_hashes
from .layout import (ENTRY, F_OVERFLOW, F_TOMBSTONE, HDR, HEADER, OFF_TYPE, PTR, SLOT,
                     EntryFlag, PageType, header_count, header_index)
from .memory import PageMemory, page_key
from .reader import read_meta

if TYPE_CHECKING:
    from .undo import ImageLog


_OVERFLOW = int(PageType.OVERFLOW)
SCAN_BATCH = 16384       # keys handed to KeyIndex.add_many at a time by the open-time scan


class Partition:
    def __init__(self, pid: int, path: str, mem: PageMemory, undo: ImageLog | None,
                 files: FileCache) -> None:
        self.pid, self.mem, self.undo, self.files = pid, mem, undo, files
        self.page_size = mem.page_size
        meta = read_meta(path)
        if meta.page_size != self.page_size:
            raise CorruptPageError(path, 0, 0, f"page size {meta.page_size} differs from the "
                                               f"store's {self.page_size}")
        if meta.partition != pid:
            raise CorruptPageError(path, 0, 0, f"meta names partition {meta.partition}, "
                                               f"file name says {pid}")
        self.file = files.file(path)
        self.page_count = meta.page_count      # in memory (grows as pages are allocated)
        self.file_pages = meta.page_count      # durable in the file (meta of the last checkpoint)
        self.counter = meta.counter            # latest applied update counter
        self.ckpt_counter = meta.counter       # counter of the last checkpoint
        self.file_counter = meta.counter       # counter the file holds now: the last
                                               # checkpoint's, or a later flush's (flush)
        self.cut_pages = meta.page_count       # page count at the last cut: pages below it
                                               # get an undo image at their first change
        self.index = KeyIndex(self._key_at)
        self._key_page = bytearray()
        self.space = array("I", bytes(4 * self.page_count))
        self.roomy: set[int] = set()
        self.free_pages: list[int] = []
        self.fill = 0                          # current insert page (0 = none)
        self.quarter = self.page_size // 4
        self.inline_max = pg.inline_limit(self.page_size)
        # Every page of the file passed check_page (CRC and structure) in the scan
        # below, and nothing was written to it since (write_fd clears it): a reader of
        # the whole file (the index rebuild of an installed file) need not compute the
        # CRCs again. See PartitionStore.file_checked.
        self.checked_whole = False
        try:
            # page 0 as in the file: the meta page's undo image at the next checkpoint
            # (its first open also records which inode the partition's file is)
            self.meta_bytes = files.pread(self.file, self.page_size, 0)
            self._scan()
            self.checked_whole = True
        except BaseException:
            files.close(self.file)
            raise

    @property
    def path(self) -> str:
        return self.file.path

    @path.setter
    def path(self, path: str) -> None:
        """The store renamed the file (install): the same inode under a new name."""
        self.files.rename(self.file, path)

    def pread(self, n: int, offset: int) -> bytes:
        """``n`` bytes of the file from ``offset`` (the file pinned for the read)."""
        return self.files.pread(self.file, n, offset)

    def write_fd(self) -> int:
        """The file opened for the checkpointer's writes (through the file-I/O seam); it
        counts as written, and stays open, until :meth:`fsync`. The file is no longer
        the one the open/install scan checked (``checked_whole``)."""
        self.checked_whole = False
        return self.files.write_fd(self.file)

    def fsync(self) -> None:
        """fsync what was written through :meth:`write_fd` (nothing when nothing was)."""
        self.files.fsync(self.file)

    def close(self) -> None:
        self.files.close(self.file)

    # -- open-time scan ----------------------------------------------------------
    def _scan(self) -> None:
        """The key index and space maps from one sequential pass of the file, keys
        only (keyscan.scan_key_hashes / iter_page_keys: each page checked once,
        overflow values never read); a bad page or a truncated file raises
        CorruptPageError."""
        # Keys go to the index SCAN_BATCH at a time (at a page's end): batches bound the
        # transient and fix the index's growth steps, the same on both paths below.
        # _set_space inlined: each page comes once and `roomy` starts empty.
        ps, quarter, free_type = self.page_size, self.quarter, int(PageType.FREE)
        space, roomy, free_pages = self.space, self.roomy, self.free_pages
        acc = self.index.scan_accel()
        if acc is not None and key_scan_accel() is not None:
            # C decoder straight to hashed columns (_pageaccel.scan_keys): no Python
            # object per key or page; same checks, errors and batches as below.
            for hashes, locs in scan_key_hashes(self.path, self.mem.io_bytes, SCAN_BATCH,
                                                space, quarter, roomy, free_pages,
                                                self.index.hash_fn):
                self.index.add_hashed(hashes, locs)
            heapq.heapify(free_pages)
            return
        pages = iter_page_keys(self.path, self.mem.io_bytes)
        if acc is not None:
            # C (checkpoint/_keyaccel.c): this loop, hashing included, with no per-page
            # or per-key Python step; the index keeps its sizing decisions.
            more = True
            while more:
                hashes, locs, more = acc.scan_pages(pages, SCAN_BATCH, ps, quarter, space,
                                                    roomy, free_pages)
                self.index.add_hashed(hashes, locs)
            heapq.heapify(free_pages)
            return
        roomy_add, free_add = roomy.add, free_pages.append
        add_pages = self.index.add_page_keys
        pending: list[PageKeys] = []
        n = 0
        for page in pages:
            i, ptype, used, keys = page
            if ptype == free_type:
                free_add(i)
                continue
            free = ps - used
            space[i] = free
            if free >= quarter:
                roomy_add(i)
            if keys:
                pending.append(page)
                n += len(keys)
                if n >= SCAN_BATCH:
                    add_pages(pending)
                    pending, n = [], 0
        add_pages(pending)
        heapq.heapify(self.free_pages)

    # -- pages -------------------------------------------------------------------
    def _load(self, index: int) -> Callable[[], bytearray]:
        def load() -> bytearray:
            buf = self.mem.take()
            files, f = self.files, self.file
            if files.preadv(f, [buf], index * self.page_size) != self.page_size:
                buf = bytearray(files.pread(f, self.page_size, index * self.page_size))
            reason = check_page(buf, index, self.page_size)
            if reason:
                raise CorruptPageError(self.path, index, index * self.page_size, reason)
            return buf
        return load

    def page(self, index: int) -> bytearray:
        key = (self.pid << 32) | index          # page_key
        pages = self.mem.pages
        buf = pages.get(key)
        if buf is not None:                     # mem.get's hit, without making the loader
            pages.move_to_end(key)
            return buf
        return self.mem.get(key, self._load(index))

    def _first_change(self, index: int) -> bool:
        """True when page ``index`` is about to change for the first time since the last
        cut and was live at it (below its page count), so it needs an undo image."""
        return (index < self.cut_pages and self.undo is not None
                and page_key(self.pid, index) not in self.mem.dirty)

    def writable(self, index: int) -> bytearray:
        key = (self.pid << 32) | index          # page_key
        mem = self.mem
        if key in mem.dirty:
            # Changed since the last cut (the common case of a write load): no undo
            # image, no copy (a page of the running cut was copied at its first change,
            # so the cut holds another buffer), resident (dirty pages are never
            # evicted): mem.writable would only move it in the LRU order.
            buf = mem.pages.get(key)
            if buf is not None:
                mem.pages.move_to_end(key)
                return buf
        if self._first_change(index):
            self.undo.image(self, index, self.page(index))   # type: ignore[union-attr]
        return mem.writable(key, self._load(index))

    def _alloc(self, ptype: PageType) -> tuple[int, bytearray]:
        index = self._alloc_index()
        buf = pg.new_page(index, self.page_size, ptype, self.mem.take())
        self.mem.put_new(page_key(self.pid, index), buf)
        return index, buf

    def _alloc_index(self) -> int:
        """A page for a new page image (a FREE one, else a new one at the end); the
        caller puts that image into page memory before the store lock is released."""
        if self.free_pages:
            index = heapq.heappop(self.free_pages)
            if self._first_change(index):       # FREE at the cut: listed, not read
                self.undo.free_page(self, index)  # type: ignore[union-attr]
        else:
            index = self.page_count
            self.page_count += 1
            self.space.append(0)
        return index

    def _free(self, index: int) -> None:
        if self._first_change(index):
            self.undo.image(self, index, self.page(index))   # type: ignore[union-attr]
        self.mem.put_new(page_key(self.pid, index),
                         pg.new_page(index, self.page_size, PageType.FREE, self.mem.take()))
        self.space[index] = 0
        self.roomy.discard(index)
        if self.fill == index:
            self.fill = 0
        heapq.heappush(self.free_pages, index)

    def _set_space(self, index: int, free: int) -> None:
        self.space[index] = free
        if free >= self.quarter:
            self.roomy.add(index)
        else:
            self.roomy.discard(index)

    # -- entries -----------------------------------------------------------------
    def _key_at(self, loc: int) -> bytearray:
        """The key of the entry at ``loc`` (the key index compares it on a hash match).
        Leaves the page in ``_key_page``: a successful lookup's last call is for the
        location it returns, so :meth:`get` reads the entry from there."""
        buf = self._key_page = self.page(loc >> 16)
        (off,) = SLOT.unpack_from(buf, HDR + 2 * (loc & 0xFFFF))
        k0 = off + ENTRY.size
        return buf[k0:k0 + ENTRY.unpack_from(buf, off)[1]]

    def get(self, key: bytes) -> bytes | None:
        loc = self.index.get(key)
        if loc is None:
            return None
        buf = self._key_page          # the page of ``loc``, just read by the lookup
        flags, _c, vlen, where, _size = pg.read_entry(buf, loc & 0xFFFF)
        if flags & F_TOMBSTONE:
            return None
        if flags & F_OVERFLOW:
            return self._read_chain(where, vlen, loc >> 16)
        return bytes(buf[where:where + vlen])

    def _chain_pages(self, first: int, length: int, origin: int) -> Iterator[bytearray]:
        """The pages of the overflow chain of a ``length``-byte value whose entry is on
        page ``origin``, checked link by link (chain.chain_link_problem): a corrupt
        chain (a cycle, a link to page 0 or past the end, more pages than the length
        allows, a page that is not OVERFLOW) raises CorruptPageError, never loops."""
        visited: set[int] = set()
        got, at, index = 0, origin, first
        ps, count = self.page_size, self.page_count
        limit = chain_limit(length, ps)
        while got < length:
            # chain_link_problem's rules, tested inline; it names the fault when one fails
            if not (0 < index < count and index not in visited and len(visited) < limit):
                bad = chain_link_problem(at, index, got, length, visited, ps, count)
                if bad:
                    raise CorruptPageError(self.path, at, at * ps, bad)
            buf = self.page(index)
            _crc, _index, ptype, _flags, used, nxt = HEADER.unpack_from(buf, 0)
            if ptype != _OVERFLOW:
                raise CorruptPageError(self.path, index, index * ps,
                                       f"page of an overflow chain has type {PageType(ptype).name}")
            visited.add(index)
            got += used
            yield buf
            at, index = index, nxt
        if got != length:
            raise CorruptPageError(self.path, at, at * self.page_size,
                                   f"overflow chain holds {got} bytes, entry says {length}")

    def _read_chain(self, first: int, length: int, origin: int) -> bytes:
        parts = [bytes(buf[HDR:HDR + header_count(buf)])
                 for buf in self._chain_pages(first, length, origin)]
        return b"".join(parts)

    def write(self, key: bytes, value: bytes | None, counter: int) -> None:
        """Store ``value`` (None: a tombstone) for ``key`` with update ``counter``."""
        self.counter = counter
        pos = self.index.find(key)
        old = None if pos < 0 else self.index.loc_at(pos)
        if value is None and old is None:
            return                            # removing an absent key stores nothing
        flags: int
        if value is None:
            flags, vlen, stored = EntryFlag.TOMBSTONE, 0, b""
        elif 15 + len(key) + len(value) <= self.inline_max:
            flags, vlen, stored = 0, len(value), value
        else:
            flags, vlen = EntryFlag.OVERFLOW, len(value)
            stored = PTR.pack(self._write_chain(value))
        if old is not None:
            index, slot = old >> 16, old & 0xFFFF
            buf = self.writable(index)
            oflags, _c, ovlen, where, size = pg.read_entry(buf, slot)
            if oflags & F_OVERFLOW:
                self._free_chain(where, ovlen, index)
                buf = self.writable(index)    # loading the chain may have evicted our page copy
            free = self.space[index] + pg.delete(buf, slot, size)
            done = pg.insert(buf, free, flags, key, counter, vlen, stored)
            if done is not None:
                self.index.set_at(pos, index << 16 | done[0])
                self._set_space(index, free - done[1])
                return
            self._set_space(index, free)
            self._maybe_free_data_page(index, buf)
        self._insert_elsewhere(key, flags, counter, vlen, stored, pos)

    def _locate(self, key: bytes, pos: int, loc: int) -> None:
        """Point the index at the key's new entry (``pos``: its table position, -1: new)."""
        if pos < 0:
            self.index.add(key, loc)
        else:
            self.index.set_at(pos, loc)

    def _insert_elsewhere(self, key: bytes, flags: int, counter: int, vlen: int, stored: bytes,
                          pos: int) -> None:
        need = 17 + len(key) + len(stored)
        space = self.space
        candidate = self.fill                   # the current insert page, then a roomy one
        for _ in range(2):
            if candidate and space[candidate] >= need:
                buf = self.writable(candidate)
                done = pg.insert(buf, space[candidate], flags, key, counter, vlen, stored)
                if done is not None:
                    self.fill = candidate
                    if pos < 0:                 # _locate, inline on the hot path
                        self.index.add(key, candidate << 16 | done[0])
                    else:
                        self.index.set_at(pos, candidate << 16 | done[0])
                    self._set_space(candidate, space[candidate] - done[1])
                    return
            candidate = next(iter(self.roomy), 0)
        index, buf = self._alloc(PageType.DATA)
        free = self.page_size - HDR
        done = pg.insert(buf, free, flags, key, counter, vlen, stored)
        assert done is not None, "an inline entry always fits an empty page"
        self.fill = index
        self._locate(key, pos, index << 16 | done[0])
        self._set_space(index, free - done[1])

    def _maybe_free_data_page(self, index: int, buf: bytearray) -> None:
        if header_count(buf) == 0:    # no slots left: the page is empty
            self._free(index)

    def _write_chain(self, value: bytes) -> int:
        # Each overflow page is built once, in its final form: the chain's page numbers
        # are taken first (each page links to the next), then one call builds every page
        # image (page.chain_pages: C when built) in page memory's spare buffers, and one
        # call puts them into page memory.
        count = max(1, -(-len(value) // (self.page_size - HDR)))
        indexes = self._alloc_indexes(count)
        bufs = pg.chain_pages(value, self.page_size, indexes, self.mem.spare)
        base = self.pid << 32                   # memory.page_key of each
        self.mem.put_new_many([base | i for i in indexes], bufs)
        return indexes[0]

    def _alloc_indexes(self, count: int) -> list[int]:
        """:meth:`_alloc_index` ``count`` times; without FREE pages to reuse, a run of new
        pages at the end in one step."""
        if self.free_pages:
            return [self._alloc_index() for _ in range(count)]
        first = self.page_count
        self.page_count = first + count
        self.space.frombytes(bytes(4 * count))
        return list(range(first, first + count))

    def _free_chain(self, first: int, length: int, origin: int) -> None:
        # Walk (and so validate) the whole chain before freeing any page of it: a
        # corrupt chain raises before the partition is changed.
        indexes = [header_index(buf) for buf in self._chain_pages(first, length, origin)]
        # _free for each page, with one page-memory insertion (one eviction pass) at the
        # end: the walk left the pages resident, so their undo images need no reload.
        for index in indexes:
            if self._first_change(index):
                self.undo.image(self, index, self.page(index))   # type: ignore[union-attr]
        ps, take, free_type = self.page_size, self.mem.take, PageType.FREE
        bufs = [pg.new_page(index, ps, free_type, take()) for index in indexes]
        base = self.pid << 32                   # page_key of each
        self.mem.put_new_many([base | i for i in indexes], bufs)
        space, roomy, heap = self.space, self.roomy, self.free_pages
        for index in indexes:
            space[index] = 0
            roomy.discard(index)
            if self.fill == index:
                self.fill = 0
            heapq.heappush(heap, index)

    # -- scans -------------------------------------------------------------------
    def scan_range(self, first: int, n: int) -> list[tuple[bytes, bytes]]:
        """Live entries of pages ``[first, first+n)``: resident pages from memory, the
        others read straight from the file in one pread, so a full scan does not
        flush page memory.  Safe under the store lock: a page that is not resident is
        clean and not being written by the checkpointer (cut pages stay resident)."""
        ps = self.page_size
        raw = memoryview(self.files.pread(self.file, n * ps, first * ps))
        out: list[tuple[bytes, bytes]] = []
        for j in range(n):
            index = first + j
            resident = self.mem.peek(page_key(self.pid, index))
            buf: bytes | memoryview
            if resident is not None:
                buf = bytes(resident)   # reading a chain below may evict and reuse this buffer
            else:
                buf = raw[j * ps:(j + 1) * ps]
                reason = check_page(buf, index, ps)
                if reason:
                    raise CorruptPageError(self.path, index, index * ps, reason)
            if buf[OFF_TYPE] != PageType.DATA:
                continue
            for _s, flags, key, _c, vlen, where in page_entries(buf):
                if flags & F_TOMBSTONE:
                    continue
                if flags & F_OVERFLOW:
                    out.append((key, self._read_chain(where, vlen, index)))
                else:
                    out.append((key, bytes(buf[where:where + vlen])))
        return out
