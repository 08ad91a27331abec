"""Page memory: the resident pages of all partitions of a store, within a byte budget.

Pages are bytearrays keyed by ``(partition << 32) | page_index``.  Three sets matter:

* resident pages, in LRU order (an OrderedDict); clean ones may be evicted at any time
  because the file holds the same bytes;
* dirty pages: changed since the last checkpoint cut;
* the cut: the pages the running checkpoint writes.  A writer that changes a page of
  the cut first copies it (copy-on-write), so the checkpointer writes exactly the bytes
  at the cut - every update up to its WAL mark, none after - without holding the store
  lock while it writes.  Cut pages are never evicted: until they are on disk the file
  is older than memory.

The caller holds the store lock for every call.  ``pressure`` (dirty + cut pages)
drives checkpoints and makes writers wait (see :class:`checkpoint.store.PartitionStore`).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable

SPARE_PAGES = 64       # evicted buffers kept for reuse (at most 1/32 of the capacity)
EVICT_BATCH = 32       # an eviction pass frees at least this many pages (at most 1/64 of the
                       # capacity): at capacity, a pass per new page was ~1-2 us of setup each
MIN_PAGES = 32          # below this a single put (data + meta + a few overflow pages) may not fit
IO_BYTES = 1 << 20      # largest transient read/write batch (scans, open scan, checkpoint runs)
IO_FRACTION = 32        # ... else this fraction of the budget
IO_MIN = 64 << 10       # ... but not below this (tiny test budgets would do page-sized I/O)


def page_key(partition: int, index: int) -> int:
    return (partition << 32) | index


class PageMemory:
    def __init__(self, page_size: int, budget_bytes: int) -> None:
        self.page_size = page_size
        self.capacity = max(MIN_PAGES, budget_bytes // page_size)
        # Transient buffers outside page memory (a scan batch and its decoded entries,
        # the open-time scan, the undo images an apply_many batch queues before it
        # flushes them) are sized from the budget, so a small budget is not dwarfed by
        # fixed 1 MiB batches.
        self.io_bytes = max(page_size, IO_MIN,
                            min(IO_BYTES, self.capacity * page_size // IO_FRACTION))
        self.spare_limit = min(SPARE_PAGES, self.capacity // IO_FRACTION)
        self.evict_batch = min(EVICT_BATCH, self.capacity // 64)
        self.pages: OrderedDict[int, bytearray] = OrderedDict()
        self.dirty: set[int] = set()
        self.cut: dict[int, bytearray] = {}
        self.copies = 0                   # cut pages replaced by a copy (both in memory)
        self.loads = 0
        self.evictions = 0
        # Evicted buffers are reused for loads and new pages: allocating and freeing
        # page-sized bytearrays in a long run fragments the C heap, and RSS then
        # creeps far past the budget even though Python holds only the budget.
        self.spare: list[bytearray] = []

    def take(self) -> bytearray:
        """A page-sized buffer (contents undefined) from the spare pool or new."""
        return self.spare.pop() if self.spare else bytearray(self.page_size)

    # -- lookups -----------------------------------------------------------------
    def get(self, key: int, load: Callable[[], bytearray]) -> bytearray:
        """The page for reading; ``load`` reads it from the file on a miss."""
        buf = self.pages.get(key)
        if buf is not None:
            self.pages.move_to_end(key)
            return buf
        buf = load()
        self.loads += 1
        self.pages[key] = buf
        self._evict(keep=key)
        return buf

    def peek(self, key: int) -> bytearray | None:
        """The resident page or None, without changing LRU order (scans)."""
        return self.pages.get(key)

    def writable(self, key: int, load: Callable[[], bytearray]) -> bytearray:
        """The page for changing: marked dirty, copied first when the cut holds it."""
        buf = self.get(key, load)
        if key in self.cut and self.cut[key] is buf:
            buf = bytearray(buf)          # copy-on-write: the checkpointer keeps the old one
            self.pages[key] = buf
            self.copies += 1              # the old one still takes memory until the cut ends
        self.dirty.add(key)
        return buf

    def put_new(self, key: int, buf: bytearray) -> None:
        """Install a freshly built page (new, reused or freed), dirty."""
        pages = self.pages
        pages[key] = buf
        pages.move_to_end(key)
        self.dirty.add(key)
        if len(pages) + self.copies > self.capacity:
            self._evict(keep=key)

    def put_new_many(self, keys: list[int], bufs: list[bytearray]) -> None:
        """:meth:`put_new` for several pages (an overflow chain): one eviction pass at
        the end. The new pages are dirty, so that pass never evicts them."""
        pages = self.pages
        before = len(pages)
        pages.update(zip(keys, bufs))
        if len(pages) - before != len(keys):    # some were resident (reused FREE pages):
            move = pages.move_to_end            # all now the newest, in chain order
            for key in keys:
                move(key)
        self.dirty.update(keys)
        if len(pages) + self.copies > self.capacity:
            self._evict()

    # -- checkpoint cut ----------------------------------------------------------
    @property
    def pressure(self) -> int:
        return len(self.dirty) + len(self.cut)

    def begin_cut(self, partition: int | None = None) -> dict[int, bytearray]:
        """The dirty pages become the cut (of ``partition`` only, when given)."""
        if partition is None:
            self.cut = {k: self.pages[k] for k in self.dirty}
            self.dirty = set()
        else:
            lo, hi = page_key(partition, 0), page_key(partition + 1, 0)
            self.cut = {k: self.pages[k] for k in self.dirty if lo <= k < hi}
            self.dirty.difference_update(self.cut)
        return self.cut

    def end_cut(self) -> None:
        self.cut = {}
        self.copies = 0
        self._evict()

    # -- partitions --------------------------------------------------------------
    def forget_partition(self, partition: int) -> None:
        """Drop every page of ``partition`` (install/drop replaced its file)."""
        lo, hi = page_key(partition, 0), page_key(partition + 1, 0)
        for k in [k for k in self.pages if lo <= k < hi]:
            del self.pages[k]
        self.dirty = {k for k in self.dirty if not lo <= k < hi}
        self.cut = {k: v for k, v in self.cut.items() if not lo <= k < hi}

    def _evict(self, keep: int = -1) -> None:
        """Evict clean pages, oldest first, down to capacity and at least
        ``evict_batch`` of them (never ``keep``, the page the caller is about to use).

        Dirty and cut pages passed on the way move to the young end: they cannot leave
        before a checkpoint writes them, and left in front every later call would walk
        past all of them again - under a steady write load that front is the running
        checkpoint's whole cut (thousands of pages), scanned once per update. Moved,
        each is passed once per trip through the LRU order; once written and clean it
        is evicted after the clean pages that were older than it."""
        over = len(self.pages) + self.copies - self.capacity
        if over <= 0:
            return
        over = max(over, self.evict_batch)
        dirty, cut = self.dirty, self.cut
        victims: list[int] = []
        passed: list[int] = []
        for k in self.pages:              # oldest first
            if k in dirty or k in cut:
                passed.append(k)
            elif k != keep:
                victims.append(k)
                if len(victims) >= over:
                    break
        move = self.pages.move_to_end
        for k in passed:
            move(k)
        pages, spare, limit = self.pages, self.spare, self.spare_limit
        for k in victims:
            buf = pages.pop(k)
            if len(spare) < limit:        # (a victim is never in the cut: checked above)
                spare.append(buf)
        self.evictions += len(victims)

    def stats(self) -> dict[str, int]:
        return {"capacity_pages": self.capacity, "resident_pages": len(self.pages),
                "dirty_pages": len(self.dirty), "cut_pages": len(self.cut),
                "loads": self.loads, "evictions": self.evictions}
