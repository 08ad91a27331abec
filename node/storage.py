"""One cache's data and indexes on this node: ``checkpoint.PartitionStore`` at
``DATA/caches/<cache>/`` and ``indexes.IndexStore`` at ``DATA/indexes/<cache>/``.

This is the node's only seam to storage. Every data change also updates the indexes
(old value read first), so data and indexes agree.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Iterator

from checkpoint import PartitionStore
from faults import fileio
from checkpoint.pagefile import iter_entries
from indexes import IndexDefinition, IndexStore

from .config import CacheConfig, NodeConfig

log = logging.getLogger("ferry.node.storage")


Entry = tuple[bytes, "bytes | None", int]


class CacheData:
    """Data + indexes of one cache. Writers of one partition are serialised by the
    caller (the update path holds the partition lock)."""

    def __init__(self, cfg: NodeConfig, cache: CacheConfig, *, clean: bool = False) -> None:
        self.cache = cache
        self.root = os.path.join(cfg.data, "caches", cache.name)
        self.index_root = os.path.join(cfg.data, "indexes", cache.name)
        os.makedirs(self.root, exist_ok=True)
        os.makedirs(self.index_root, exist_ok=True)
        self.store = PartitionStore.open(self.root, page_size=cfg.page_size,
                                         memory_budget=cfg.memory_budget, wal_sync=cfg.wal_sync,
                                         checkpoint_interval=cfg.checkpoint_interval_s)
        defs = [IndexDefinition(i.name, i.field, unique=i.unique) for i in cache.indexes]
        self.indexes = IndexStore.open(self.index_root, defs)
        # An index update follows its data update; a crash between the two leaves the
        # index behind. Without a clean-shutdown marker, rebuild it from the data.
        for p in self.store.partitions():
            if not clean or not self.indexes.ready(p):
                self.indexes.rebuild(p, self.store)

    # -- partitions ---------------------------------------------------------------
    def partitions(self) -> list[int]:
        return list(self.store.partitions())

    def create(self, p: int) -> None:
        if p not in self.store.partitions():
            self.store.create_partition(p)
        self.indexes.rebuild(p, self.store)   # empty: makes the partition's index ready

    def drop(self, p: int) -> None:
        self.indexes.drop(p)
        if p in self.store.partitions():
            self.store.drop_partition(p)
        self.discard_partial(p)

    def discard_partial(self, p: int) -> None:
        """Delete what an unfinished file transfer of p left (temp file, resume journal)."""
        from transfer.resume import JOURNAL_SUFFIX, TMP_SUFFIX
        base = self.store.partition_path(p)
        io = fileio.layer()
        gone = False
        for path in (base + TMP_SUFFIX, base + JOURNAL_SUFFIX):
            if os.path.exists(path):
                io.unlink(path)
                gone = True
        if gone:
            io.fsync_dir(self.root)

    def counter(self, p: int) -> int:
        return int(self.store.counter(p))

    # -- data ---------------------------------------------------------------------
    def get(self, p: int, key: bytes) -> bytes | None:
        return self.store.get(p, key)

    def put(self, p: int, key: bytes, value: bytes | None) -> int:
        """Primary side: next counter, logged, applied to data and indexes."""
        old = self.store.get(p, key) if self.cache.indexes else None
        counter = self.store.put(p, key, value) if value is not None else self.store.remove(p, key)
        if self.cache.indexes:
            self.indexes.apply(p, key, old, value)
        return int(counter)

    def apply(self, p: int, key: bytes, value: bytes | None, counter: int) -> bool:
        """Backup side: idempotent by counter."""
        old = self.store.get(p, key) if self.cache.indexes else None
        done = bool(self.store.apply(p, key, value, counter))
        if done and self.cache.indexes:
            self.indexes.apply(p, key, old, value)
        return done

    def put_many(self, p: int, items: list[tuple[bytes, bytes]]) -> list[int]:
        """Primary side, bulk (partition lock held): the next counters, the data in ONE
        node-WAL batch with ONE durability wait and the index changes in ONE commit
        (:meth:`apply_many`). Before, each item waited for its own WAL fsync: a bulk
        load ran at one group commit per entry. Acknowledged as a whole; a crash
        mid-batch leaves a prefix applied (the client puts the batch again)."""
        base = self.counter(p)
        ups = [(k, v, base + 1 + i) for i, (k, v) in enumerate(items)]
        done = self.apply_many(p, ups)
        if done != len(ups):       # the lock is held: nothing else moved the counter
            raise RuntimeError(f"cache {self.cache.name} partition {p}: {done} of {len(ups)} "
                               "batched puts applied (counter moved under the partition lock)")
        return [c for _, _, c in ups]

    def apply_many(self, p: int, updates: list[tuple[bytes, bytes | None, int]], *,
                   logged: bool = True) -> int:
        """Backup side / temp-WAL replay, bulk: idempotent by counter like :meth:`apply`;
        the data in one WAL batch with ONE durability wait (``PartitionStore.apply_many``),
        the index changes in one commit. The caller holds the partition lock, so nothing
        else changes p meanwhile. Returns how many were applied. (A crash between the
        data and the index commit leaves the index behind; the unclean start-up rebuilds
        it, a move starts over.) ``logged=False``: the data is not written to the node
        WAL (``PartitionStore.apply_many``); only for the temp-WAL replay of a move."""
        held = self.counter(p)
        todo = []
        for u in updates:                       # only what apply() would apply, in order
            if u[2] > held:
                todo.append(u)
                held = u[2]
        if not todo:
            return 0
        olds: list[bytes | None] = []
        if self.cache.indexes:
            pending: dict[bytes, bytes | None] = {}   # a key updated twice in one batch
            for key, value, _ in todo:
                olds.append(pending[key] if key in pending else self.store.get(p, key))
                pending[key] = value
        done = self.store.apply_many(p, todo, logged=logged)
        if self.cache.indexes:
            if all(done):
                self.indexes.apply_many(p, [(k, o, v) for (k, v, _), o in zip(todo, olds)])
            else:   # not expected under the partition lock; the index must follow the data
                log.warning("cache=%s partition=%d: %d of %d batched updates were not applied; "
                            "rebuilding the partition's index", self.cache.name, p,
                            done.count(False), len(done))
                self.indexes.rebuild(p, self.store)
        return sum(done)

    def entries(self, p: int) -> list[Entry]:
        """Every entry of p with its update counter (tombstones included when the store
        keeps them), for the message-based rebalance."""
        # The caller holds the partition lock, so p gets no update meanwhile: once a
        # checkpoint covers p's counter, part-<p>.bin holds exactly p's entries (with
        # their counters and tombstones) and no checkpoint rewrites its pages.
        self.store.wait_checkpoint_covering(p, self.store.counter(p), timeout=120.0)
        return [(e.key, e.value, e.counter) for e in
                iter_entries(self.store.partition_path(p), include_tombstones=True)]

    def scan(self, p: int) -> Iterator[tuple[bytes, bytes]]:
        return iter(self.store.scan(p))

    # -- indexes ------------------------------------------------------------------
    def lookup(self, index: str, value: Any) -> list[bytes]:
        return [k if isinstance(k, bytes) else k[-1] for k in self.indexes.lookup(index, value)]

    def range(self, index: str, lo: Any, hi: Any, limit: int | None) -> list[Any]:
        return list(self.indexes.range(index, lo, hi, limit))

    def rebuild_index(self, p: int) -> None:
        self.indexes.rebuild(p, self.store)

    # -- lifecycle ----------------------------------------------------------------
    def checkpoint(self) -> Any:
        return self.store.checkpoint()

    def close(self) -> None:
        for part in (self.indexes, self.store):
            try:
                part.close()
            except Exception as e:  # closing must go on for the other one
                log.warning("closing %s of cache %s: %s", type(part).__name__, self.cache.name, e)
