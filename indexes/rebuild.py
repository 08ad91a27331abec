"""Rebuild one partition's index entries from its data: the OWNING gate's index step.

Stages, each visible in progress reports:

1. ``clear``: one commit deletes the ready marker and the partition's entries, so
   whatever an earlier, interrupted rebuild left is gone.
2. ``scan``: one sequential pass over ``source.scan(partition)``; every value gives its
   entry keys to an :class:`ExternalSorter` (memory bounded by ``memory_limit``).
3. ``load``: the sorted keys go to LMDB in batches, appended to the partition's own
   sub-tree (no key comparisons but with its last key, pages filled left to right),
   one commit per batch. The crash point ``demander.mid_index_rebuild`` follows every
   commit.
4. ``ready``: a last commit writes the ready marker. LMDB commits are ordered and
   synced, so the marker is durable only after every entry is.

A source with no live pair (a partition file of at most ``EMPTY_PROBE_BYTES`` whose
pages hold none, or a source that counts 0) skips 2 and 3: one commit deletes the
marker and the entries and writes the ready marker (0 entries), atomically.

A crash or a cancel between 1 and 4 leaves the partition not ready; the next
rebuild starts at 1, so no entry is duplicated or stale.
"""
from __future__ import annotations

import os
import shutil
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

import lmdb

import faults

from . import keycodec
from .definitions import IndexDefinition
from .errors import RebuildCancelled, StreamingUnavailable
from .extsort import DEFAULT_MEMORY, ExternalSorter, merged_data
from .lmdbenv import LmdbEnv
from .results import MAX_SAMPLES, Progress, RebuildResult, Reporter
from .scan import SCRATCH, Indexed, scan_batches, scan_partition
from .source import Source
from .streaming import StreamedKeys
from .uniqueness import unique_conflicts

if TYPE_CHECKING:
    from .scanpool import ScanPool

# Big enough that commits (two fsyncs each) cost little next to the work, small enough
# that one transaction's dirty pages stay a few MB and a crash point is hit often.
DEFAULT_BATCH = 100_000

__all__ = ["rebuild", "load_streamed", "Rebuildable", "Progress", "RebuildResult", "DEFAULT_BATCH",
           "MAX_SAMPLES", "SCRATCH", "scan_batches"]


class Rebuildable(Indexed, Protocol):
    """What a rebuild needs of an index store (:class:`~indexes.IndexStore` is one)."""

    @property
    def env(self) -> LmdbEnv: ...

    @property
    def definitions(self) -> tuple[IndexDefinition, ...]: ...

    def clear(self, partition: int) -> None: ...

    def mark_ready(self, partition: int, entries: int, bad: int) -> None: ...


def _cancel_check(cancel: Any) -> Callable[[], bool]:
    if cancel is None:
        return lambda: False
    if hasattr(cancel, "is_set"):
        return cancel.is_set
    if callable(cancel):
        return cancel
    raise TypeError("cancel must be a callable returning bool or a threading.Event")


def rebuild(store: Rebuildable, partition: int, source: Source, *,
            progress: Callable[[Progress], None] | None = None, cancel: Any = None,
            memory_limit: int | None = None, batch: int | None = None,
            workers: int | None = None, pool: ScanPool | None = None) -> RebuildResult:
    """Rebuild ``partition``'s entries from ``source`` (see the module doc). Values that
    an index cannot take are skipped and counted whatever its ``on_bad`` policy: the
    data is the truth here and a rebuild never fails on it. ``pool``: a partition
    file's whole scan goes to one of the pool's processes (:mod:`indexes.scanpool`);
    this thread only serves its page ranges, then merges and loads."""
    cancelled = _cancel_check(cancel)
    rep = Reporter(partition, progress)
    res = RebuildResult(partition)
    t0 = time.monotonic()
    scratch = os.path.join(store.env.path, SCRATCH, str(partition))
    shutil.rmtree(scratch, ignore_errors=True)      # left by a crashed rebuild
    ready_empty = getattr(store, "ready_empty", None)
    if callable(ready_empty) and _holds_nothing(source, partition):
        # no live pair: the clear and the ready marker (0 entries) in one commit
        rep.start("ready", None)
        ready_empty(partition)
        res.seconds = time.monotonic() - t0
        return res

    rep.start("clear", None)
    store.clear(partition)
    sorter = ExternalSorter(scratch, memory_limit or DEFAULT_MEMORY)
    try:
        scan_partition(store, partition, source, sorter, res, rep, cancelled, workers, pool)
        _load(store, partition, sorter, res, rep, cancelled, batch or DEFAULT_BATCH)
    finally:
        res.runs = len(sorter.runs)
        sorter.close()
        shutil.rmtree(scratch, ignore_errors=True)
    rep.start("ready", None)
    store.mark_ready(partition, res.entries, res.bad)
    res.seconds = time.monotonic() - t0
    return res


# a partition file at most this big is looked at for live pairs before the rebuild
EMPTY_PROBE_BYTES = 256 << 10


def _holds_nothing(source: Source, partition: int) -> bool:
    """True when ``source`` surely has no live pair of ``partition``: a partition file
    of at most EMPTY_PROBE_BYTES whose pages hold none (read to its end: a page that
    does not decode raises, as in the scan), or a source that counts 0. False when
    unsure: the rebuild runs whole."""
    file_for = getattr(source, "file_for", None)
    if callable(file_for):
        try:
            if os.path.getsize(file_for(partition)) > EMPTY_PROBE_BYTES:
                return False
        except OSError:
            return False            # the scan says why
        batches = getattr(source, "scan_batches", None)
        if not callable(batches):
            return False
        return not any(batch for batch in batches(partition))
    count = getattr(source, "count", None)
    return callable(count) and count(partition) == 0


class _Runs:
    """A streamed build's sorted runs where the load stage takes a sorter: the runs
    are concatenated and sorted once (timsort merges presorted runs in one pass)."""

    def __init__(self, built: StreamedKeys) -> None:
        self.built = built

    def __len__(self) -> int:
        return self.built.count

    def key_batches(self) -> Iterator[tuple[list[bytes], dict[bytes, bytes]]]:
        runs = self.built.runs
        keys = runs[0] if len(runs) == 1 else [k for run in runs for k in run]
        if len(runs) > 1:
            keys.sort()
        self.built.runs = []            # the one list from here on
        yield keys, self.built.data


def load_streamed(store: Rebuildable, partition: int, built: StreamedKeys, *,
                  progress: Callable[[Progress], None] | None = None, cancel: Any = None,
                  batch: int | None = None) -> RebuildResult:
    """The rebuild's clear, load and ready stages for keys a
    :class:`~indexes.streaming.StreamingIndex` built while the file arrived (its scan
    stage ran during the transfer). The same load as :func:`rebuild`, so the same
    entries, duplicate counts and unique-value reports; the same crash point after
    every commit. StreamingUnavailable when the keys were built with another
    definition set than the store's now."""
    if built.indexer is not store.indexer:
        raise StreamingUnavailable(f"the index definitions of partition {partition} changed "
                                   "while its file arrived; rebuild from the file")
    cancelled = _cancel_check(cancel)
    rep = Reporter(partition, progress)
    res = RebuildResult(partition)
    t0 = time.monotonic()
    ready_empty = getattr(store, "ready_empty", None)
    if callable(ready_empty) and built.count == 0 and built.scanned == 0 and built.bad == 0:
        # no live pair: the clear and the ready marker (0 entries) in one commit
        rep.start("ready", None)
        ready_empty(partition)
        res.seconds = time.monotonic() - t0
        return res
    rep.start("clear", None)
    store.clear(partition)
    res.scanned, res.bad = built.scanned, built.bad
    res.add_bad_samples(built.bad_samples)
    _load(store, partition, _Runs(built), res, rep, cancelled, batch or DEFAULT_BATCH)  # type: ignore[arg-type]
    rep.start("ready", None)
    store.mark_ready(partition, res.entries, res.bad)
    res.seconds = time.monotonic() - t0
    return res


def _load(store: Rebuildable, partition: int, sorter: ExternalSorter, res: RebuildResult,
          rep: Reporter, cancelled: Callable[[], bool], batch: int) -> None:
    env = store.env
    rep.start("load", len(sorter))
    uniq = sorted(keycodec.index_prefix(store.schema.ids[d.name])
                  for d in store.definitions if d.unique)
    last = b""
    done = 0
    for keys, extra in _key_chunks(sorter.key_batches(), batch):
        if uniq:
            last = unique_conflicts(keys, extra, uniq, last, res, MAX_SAMPLES)

        def put(txn: lmdb.Transaction[bytes], keys: list[bytes] = keys,
                extra: dict[bytes, bytes] = extra) -> tuple[int, int]:
            # Appended to the partition's entries, streamed to LMDB without a pair list
            # (indexes/entrydb.py). A key equal to the last one is not added: that is
            # how a value the source gave twice is kept once (counted, not an error).
            return env.entries.load(txn, partition, keys, extra)
        consumed, added = env.write(put)
        res.duplicates += consumed - added
        res.entries += added
        done += consumed
        faults.crashpoint("demander.mid_index_rebuild")
        if cancelled():
            raise RebuildCancelled(f"rebuild of partition {partition} cancelled after "
                                   f"{done} entries loaded; the partition is not ready")
        rep.report(done)
    rep.report(done, force=True)


def _key_chunks(batches: Iterator[tuple[list[bytes], dict[bytes, bytes]]],
                size: int) -> Iterator[tuple[list[bytes], dict[bytes, bytes]]]:
    """Regroup the sorter's key lists into lists of exactly ``size`` keys (the last
    shorter), each with a dict holding their data: one LMDB commit each. A list of
    ``size`` or more (all keys in memory: one list) is sliced, not copied whole."""
    buf: list[bytes] = []
    extras: list[dict[bytes, bytes]] = []
    for keys, extra in batches:
        i, n = 0, len(keys)
        while i < n:
            if not buf and n - i >= size:
                yield keys[i:i + size], extra
                i += size
                continue
            take = min(size - len(buf), n - i)
            buf += keys[i:i + take]
            i += take
            if extra and (not extras or extras[-1] is not extra):
                extras.append(extra)
            if len(buf) == size:
                yield buf, merged_data(extras)
                buf, extras = [], []
    if buf:
        yield buf, merged_data(extras)
