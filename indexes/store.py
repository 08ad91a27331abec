"""IndexStore: the secondary indexes of one cache on one node, in one LMDB environment.

Partitions are ints. A node serving several caches opens one IndexStore per cache,
each in its own directory (``<node>/indexes/<cache>``): a cache's index definitions,
codec and ready markers then live and die together, and a corrupt environment costs
one cache's rebuild, not the node's.

The gate: ``apply`` refuses a partition that is not ready, and ``lookup``/``range``
read only ready partitions, so a partition whose index is being rebuilt (MOVING) is
neither updated nor served from a partial index.
"""
from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any, Callable, Iterable

import lmdb

from . import keycodec, meta
from .definitions import Entry, IndexDefinition
from .errors import (BadQueryError, IndexDefinitionError, IndexNotReadyError,
                     UniqueViolationError)
from .indexer import Indexer
from .lmdbenv import INITIAL_MAP, MAX_DBS, LmdbEnv
from .rebuild import load_streamed as _load_streamed, rebuild as _rebuild
from .results import Progress, RebuildResult
from .source import Source
from .extsort import DEFAULT_MEMORY
from .streaming import StreamedKeys, StreamingIndex
from .verify import VerifyReport, verify as _verify

if TYPE_CHECKING:
    from .scanpool import ScanPool

__all__ = ["IndexStore", "Source"]


class IndexStore:
    def __init__(self, env: LmdbEnv, schema: meta.Schema) -> None:
        self._env = env
        self.path = env.path
        self.schema = schema
        self.indexer = Indexer(list(schema.definitions), schema.ids, schema.codec, env.max_key)
        self._by_name = {d.name: d for d in schema.definitions}
        markers = env.read(lambda txn: meta.ready_markers(txn, env.meta))
        fp = schema.fingerprint
        self._ready = {p for p, m in markers.items() if m.get("fingerprint") == fp}
        self._markers = markers
        self._closed = False

    # -- opening ------------------------------------------------------------------
    @classmethod
    def open(cls, path: str, definitions: Iterable[IndexDefinition] | None = None, *,
             codec: str | None = None, reset_corrupt: bool = False,
             map_size: int = INITIAL_MAP, max_dbs: int = MAX_DBS) -> IndexStore:
        """Open (or create) the store at ``path``. ``definitions=None`` uses the ones
        stored by the last open; new or changed definitions make every partition not
        ready until rebuilt. ``codec``: "json" (default) or "msgpack" documents.
        ``reset_corrupt``: move a corrupt data file aside and start empty instead of
        raising IndexCorruptError. A store of an older layout starts empty (its
        definitions kept, no partition ready); a newer one raises IndexStoreError.
        ``max_dbs``: LMDB's named-database limit (the layout uses three)."""
        env = LmdbEnv(path, map_size=map_size, max_dbs=max_dbs, reset_corrupt=reset_corrupt)
        try:
            defs = None if definitions is None else list(definitions)
            for d in defs or []:
                if not isinstance(d, IndexDefinition):
                    raise IndexDefinitionError(f"{d!r} is not an IndexDefinition")
            stored = env.read(lambda txn: meta.load_schema(txn, env.meta))
            schema = meta.reconcile(stored, defs, codec)
            if schema != stored:
                env.write(lambda txn: meta.save_schema(txn, env.meta, schema))
            return cls(env, schema)
        except BaseException:
            env.close()
            raise

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._env.close()

    def __enter__(self) -> IndexStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def definitions(self) -> tuple[IndexDefinition, ...]:
        return self.schema.definitions

    # -- readiness ------------------------------------------------------------------
    def ready(self, partition: int) -> bool:
        return partition in self._ready

    def ready_partitions(self) -> list[int]:
        return sorted(self._ready)

    def marker(self, partition: int) -> dict[str, Any] | None:
        """The partition's ready marker as stored (None when absent)."""
        return self._markers.get(partition)

    @property
    def env(self) -> LmdbEnv:
        """The store's LMDB environment: rebuild and verify read and write a
        partition's entries through it (``env.entries``)."""
        return self._env

    def mark_ready(self, partition: int, entries: int, bad: int) -> None:
        """Write the partition's ready marker (a rebuild's last step: every entry is
        committed before it)."""
        fp = self.schema.fingerprint
        env = self._env
        # the one marker, not all of them read again: O(1) per partition made ready
        self._markers[partition] = env.write(
            lambda txn: meta.put_ready(txn, env.meta, partition, fp, entries, bad))
        self._ready.add(partition)

    def ready_empty(self, partition: int) -> None:
        """Make the partition ready with no entries in ONE commit: its marker and every
        entry deleted and a fresh marker (0 entries, 0 bad) written together. What
        :meth:`clear` then :meth:`mark_ready` leave for a source with no live pairs,
        with one commit instead of two; atomic, so never a marker beside old entries."""
        fp = self.schema.fingerprint
        env = self._env
        self._ready.discard(partition)

        def reset(txn: lmdb.Transaction[bytes]) -> dict[str, Any]:
            txn.delete(meta.ready_key(partition), db=env.meta)
            env.entries.clear(txn, partition)
            return meta.put_ready(txn, env.meta, partition, fp, 0, 0)
        self._markers[partition] = env.write(reset)
        self._ready.add(partition)

    def _clear(self, partition: int) -> None:
        """Remove the ready marker and every entry of the partition, in one commit:
        the marker never survives its entries."""
        env = self._env
        self._ready.discard(partition)

        def clear(txn: lmdb.Transaction[bytes]) -> None:
            txn.delete(meta.ready_key(partition), db=env.meta)
            env.entries.clear(txn, partition)
        env.write(clear)
        self._markers.pop(partition, None)

    def clear(self, partition: int) -> None:
        """Make the partition not ready and delete its entries (a rebuild's first step)."""
        self._clear(partition)

    def drop(self, partition: int) -> None:
        """Forget the partition's index entries (it was evicted or is about to move)."""
        self._clear(partition)

    def unmark(self, partitions: Iterable[int]) -> None:
        """Make these partitions not ready in ONE commit: their ready markers are
        deleted, their entries left for the rebuild that clears them first. For
        indexes not known to match their data (a node that stops before it rebuilt
        them): the next open finds them not ready."""
        todo = sorted(set(partitions))
        if not todo:
            return
        env = self._env

        def unmark(txn: lmdb.Transaction[bytes]) -> None:
            for p in todo:
                txn.delete(meta.ready_key(p), db=env.meta)
        env.write(unmark)
        for p in todo:
            self._ready.discard(p)
            self._markers.pop(p, None)

    # -- the write path -------------------------------------------------------------
    def check(self, key: bytes, new_value: bytes | None) -> None:
        """Raise BadValueError when an index with ``on_bad="refuse"`` would refuse
        ``new_value``; writes nothing. Lets a node refuse a write before it logs it."""
        self.indexer.refuse(key, self.indexer.entries(key, new_value)[1])

    def apply(self, partition: int, key: bytes, old_value: bytes | None,
              new_value: bytes | None) -> None:
        """Move the key's entries from ``old_value`` to ``new_value`` (None: absent) in
        one commit. Refused values (policy ``refuse``) and unique violations raise
        before anything changes. Applying the same update twice is harmless."""
        self.apply_many(partition, [(key, old_value, new_value)])

    def apply_many(self, partition: int,
                   updates: Iterable[tuple[bytes, bytes | None, bytes | None]]) -> None:
        """Apply (key, old value, new value) updates in order in ONE commit (one fsync
        for all: temp-WAL replay and group commit use this). All or nothing: a refused
        value or a unique violation in any update raises and changes nothing."""
        if partition not in self._ready:
            raise IndexNotReadyError(
                f"index of partition {partition} in {self.path} is not ready; its updates "
                "stay in the temp WAL until rebuild() has finished (an empty partition: "
                "rebuild it from indexes.EMPTY)")
        plan = []
        for key, old_value, new_value in updates:
            new, bad = self.indexer.entries(key, new_value)
            self.indexer.refuse(key, bad)
            old = {e.key: e.data for e in self.indexer.entries(key, old_value)[0]}
            new_keys = {e.key for e in new}
            add = [e for e in new if e.key not in old]
            gone = [(k, d) for k, d in old.items() if k not in new_keys]
            if add or gone:
                plan.append((key, add, gone))
        if not plan:
            return
        entries = self._env.entries
        unique = any(e.index.unique for _, add, _ in plan for e in add)
        others = self._partitions(None) if unique else []

        def write(txn: lmdb.Transaction[bytes]) -> None:
            for key, add, gone in plan:
                for k, data in gone:
                    entries.delete(txn, partition, k, data)
                for e in add:
                    if e.index.unique:      # sees this commit's earlier updates too
                        holder = self._holder(txn, e, key, others)
                        if holder is not None:
                            raise UniqueViolationError(e.index.name, e.value, key, holder)
                    entries.put(txn, partition, e.key, e.data)
        self._env.write(write)

    def _holder(self, txn: lmdb.Transaction[bytes], e: Entry, key: bytes,
                partitions: list[int]) -> bytes | None:
        """Another primary key that holds e's value in any of ``partitions``."""
        head = e.key[:e.head]
        for k, data in self._env.entries.with_prefix(txn, partitions, head):
            pk = keycodec.parse_entry(k, data)[2]
            if pk != key:
                return pk
        return None

    # -- queries ---------------------------------------------------------------------
    def _index(self, name: str) -> tuple[IndexDefinition, bytes]:
        d = self._by_name.get(name)
        if d is None:
            raise IndexDefinitionError(f"no index named {name!r} in {self.path}; "
                                       f"defined: {sorted(self._by_name)}")
        return d, keycodec.index_prefix(self.schema.ids[name])

    def _encode(self, name: str, value: object) -> bytes:
        try:
            return keycodec.encode_value(value)
        except keycodec.UnencodableValue as e:
            raise BadQueryError(f"index {name!r}: {e}") from None

    def _partitions(self, partitions: Iterable[int] | None) -> list[int]:
        """The ready partitions; only those in ``partitions`` when given."""
        ready = self._ready if partitions is None else self._ready.intersection(partitions)
        return sorted(ready)

    def lookup(self, index: str, value: object,
               partitions: Iterable[int] | None = None) -> list[bytes]:
        """Primary keys whose document has ``value`` at the index's field, sorted
        (``partitions``: only theirs; a node answers for the ones it leads)."""
        _, idp = self._index(index)
        prefix = idp + self._encode(index, value)
        parts = self._partitions(partitions)
        entries = self._env.entries

        def read(txn: lmdb.Transaction[bytes]) -> list[bytes]:
            parse = keycodec.parse_entry
            return sorted(parse(k, d)[2] for k, d in entries.with_prefix(txn, parts, prefix))
        return self._env.read(read)

    def range(self, index: str, lo: object = None, hi: object = None,
              limit: int | None = None,
              partitions: Iterable[int] | None = None) -> list[tuple[object, bytes]]:
        """(value, primary key) pairs with ``lo <= value < hi`` in index order (value,
        then primary key); ``None`` bounds are open. To bound by null itself, use
        :meth:`lookup`. ``limit`` ends the scan after that many pairs; ``partitions``:
        only theirs (a node answers for the ones it leads, and skips the others' key
        ranges instead of reading and dropping their pairs)."""
        _, idp = self._index(index)
        lo_key = idp + (self._encode(index, lo) if lo is not None else b"")
        hi_key = idp + self._encode(index, hi) if hi is not None else _successor(idp)
        parts = self._partitions(partitions)
        entries = self._env.entries

        def read(txn: lmdb.Transaction[bytes]) -> list[tuple[object, bytes]]:
            long = entries.any_long(txn)
            its = [entries.items(txn, p, lo_key, hi=hi_key, long=long) for p in parts]
            out: list[tuple[object, bytes]] = []
            for k, d in heapq.merge(*its):
                if limit is not None and len(out) >= limit:
                    break
                _, v, pk = keycodec.parse_entry(k, d)
                out.append((v, pk))
            return out
        return self._env.read(read)

    def entry_count(self, partition: int) -> int:
        env = self._env
        return env.read(lambda txn: env.entries.count(txn, partition))

    # -- rebuild and verify ------------------------------------------------------------
    def rebuild(self, partition: int, source: Source, *,
                progress: Callable[[Progress], None] | None = None,
                cancel: Any = None, memory_limit: int | None = None,
                batch: int | None = None, workers: int | None = None,
                pool: ScanPool | None = None) -> RebuildResult:
        """Rebuild the partition's entries from ``source.scan(partition)``; see
        :func:`indexes.rebuild.rebuild` (``workers``: processes sharing the scan of a
        partition file, see :mod:`indexes.scanworker`; ``pool``: a
        :class:`~indexes.scanpool.ScanPool` that takes the whole scan of a file)."""
        return _rebuild(self, partition, source, progress=progress, cancel=cancel,
                       memory_limit=memory_limit, batch=batch, workers=workers, pool=pool)

    def load_streamed(self, partition: int, built: StreamedKeys, *,
                      progress: Callable[[Progress], None] | None = None,
                      cancel: Any = None, batch: int | None = None) -> RebuildResult:
        """Load keys built while the partition's file arrived
        (:class:`~indexes.streaming.StreamingIndex`): the rebuild without its scan;
        see :func:`indexes.rebuild.load_streamed`."""
        return _load_streamed(self, partition, built, progress=progress, cancel=cancel,
                              batch=batch)

    def streaming(self, partition: int, path: str, page_size: int, page_count: int,
                  span: int, counter: int = 0, memory_limit: int | None = None) -> StreamingIndex:
        """A :class:`~indexes.streaming.StreamingIndex` of this store's definitions for
        the partition file being written at ``path``."""
        return StreamingIndex(self.indexer, partition, path, page_size, page_count, span,
                              counter, memory_limit or DEFAULT_MEMORY)

    def verify(self, partition: int, source: Source, *, memory_limit: int | None = None,
               max_details: int = 10_000) -> VerifyReport:
        """Compare the partition's entries with the data: a VerifyReport."""
        return _verify(self, partition, source, memory_limit=memory_limit,
                      max_details=max_details)


def _successor(prefix: bytes) -> bytes:
    """The smallest key above every key starting with ``prefix`` (prefix != all 0xFF)."""
    p = prefix.rstrip(b"\xff")
    return p[:-1] + bytes([p[-1] + 1])
