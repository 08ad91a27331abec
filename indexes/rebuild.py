"""Rebuild one partition's index entries from its data: the OWNING gate's index step.

Stages, each visible in progress reports:

1. ``clear``: one commit deletes the ready marker and empties the partition's
   database, so whatever an earlier, interrupted rebuild left is gone.
2. ``scan``: one sequential pass over ``source.scan(partition)``; every value gives its
   entry keys to an :class:`ExternalSorter` (memory bounded by ``memory_limit``).
3. ``load``: the sorted keys go to LMDB in batches with ``putmulti(append=True)``
   (no key comparisons, pages filled left to right), one commit per batch. The crash
   point ``demander.mid_index_rebuild`` follows every commit.
4. ``ready``: a last commit writes the ready marker. LMDB commits are ordered and
   synced, so the marker is durable only after every entry is.

A crash or a cancel between 1 and 4 leaves the partition not ready; the next
rebuild starts at 1, so no entry is duplicated or stale.
"""
from __future__ import annotations

import itertools
import os
import shutil
import time
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import faults

from . import keycodec, scanworker
from .errors import RebuildCancelled
from .extsort import DEFAULT_MEMORY, ExternalSorter, merged_data
from .uniqueness import unique_conflicts

if TYPE_CHECKING:
    from .scanpool import ScanPool
    from .store import IndexStore, Source

# Big enough that commits (two fsyncs each) cost little next to the work, small enough
# that one transaction's dirty pages stay a few MB and a crash point is hit often.
DEFAULT_BATCH = 100_000
# Values between memory checks, cancel checks and progress reports in the scan (one
# batch): the sorter may overshoot its limit by this many values' keys (~200 KB for 3
# indexes).
_CHECK_EVERY = 1024
_REPORT_SECONDS = 0.2
SCRATCH = "scratch"
MAX_SAMPLES = 20


@dataclass(frozen=True)
class Progress:
    """One progress report. ``stage``: scan (``done`` = values read) or load (``done``
    = index entries written). ``total``/``eta`` are None when the source cannot count."""

    partition: int
    stage: str
    done: int
    total: int | None
    rate: float                 # per second, this stage
    eta: float | None           # seconds left in this stage


@dataclass
class RebuildResult:
    partition: int
    scanned: int = 0             # values read from the source
    entries: int = 0             # index entries written
    bad: int = 0                 # (value, index) pairs not indexed by policy
    bad_samples: list[str] = field(default_factory=list)
    duplicates: int = 0          # entries the source gave twice (kept once)
    unique_conflicts: int = 0    # values of a unique index held by several keys
    unique_samples: list[str] = field(default_factory=list)
    runs: int = 0                # sorted runs spilled to scratch files
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class _Reporter:
    def __init__(self, partition: int, cb: Callable[[Progress], None] | None) -> None:
        self.partition, self.cb = partition, cb
        self.stage, self.t0, self.last, self.total = "", 0.0, 0.0, None

    def start(self, stage: str, total: int | None) -> None:
        self.stage, self.total = stage, total
        self.t0 = self.last = time.monotonic()
        self.report(0, force=True)

    def report(self, done: int, force: bool = False) -> None:
        if self.cb is None:
            return
        now = time.monotonic()
        if not force and now - self.last < _REPORT_SECONDS:
            return
        self.last = now
        el = now - self.t0
        rate = done / el if el > 0 else 0.0
        eta = ((self.total - done) / rate) if (self.total is not None and rate > 0) else None
        self.cb(Progress(self.partition, self.stage, done, self.total, rate, eta))


def _cancel_check(cancel: Any) -> Callable[[], bool]:
    if cancel is None:
        return lambda: False
    if hasattr(cancel, "is_set"):
        return cancel.is_set
    if callable(cancel):
        return cancel
    raise TypeError("cancel must be a callable returning bool or a threading.Event")


def rebuild(store: IndexStore, partition: int, source: Source, *,
            progress: Callable[[Progress], None] | None = None, cancel: Any = None,
            memory_limit: int | None = None, batch: int | None = None,
            workers: int | None = None, pool: ScanPool | None = None) -> RebuildResult:
    """Rebuild ``partition``'s entries from ``source`` (see the module doc). Values that
    an index cannot take are skipped and counted whatever its ``on_bad`` policy: the
    data is the truth here and a rebuild never fails on it. ``pool``: a partition
    file's whole scan goes to one of the pool's processes (:mod:`indexes.scanpool`);
    this thread only serves its page ranges, then merges and loads."""
    cancelled = _cancel_check(cancel)
    rep = _Reporter(partition, progress)
    res = RebuildResult(partition)
    t0 = time.monotonic()
    env = store._env
    scratch = os.path.join(env.path, SCRATCH, str(partition))
    shutil.rmtree(scratch, ignore_errors=True)      # left by a crashed rebuild

    rep.start("clear", None)
    store._clear(partition, delete_db=False)
    sorter = ExternalSorter(scratch, memory_limit or DEFAULT_MEMORY)
    try:
        _scan(store, partition, source, sorter, res, rep, cancelled, workers, pool)
        _load(store, partition, sorter, res, rep, cancelled, batch or DEFAULT_BATCH)
    finally:
        res.runs = len(sorter.runs)
        sorter.close()
        shutil.rmtree(scratch, ignore_errors=True)
    rep.start("ready", None)
    store._set_ready(partition, res.entries, res.bad)
    res.seconds = time.monotonic() - t0
    return res


def _scan(store: IndexStore, partition: int, source: Source, sorter: ExternalSorter,
          res: RebuildResult, rep: _Reporter, cancelled: Callable[[], bool],
          workers: int | None = None, pool: ScanPool | None = None) -> None:
    count = getattr(source, "count", None)
    rep.start("scan", count(partition) if callable(count) else None)
    feed_many, add, addd = store.indexer.feed_many, sorter.append, sorter.add_with_data

    def on_bad(pk: bytes, bad: list) -> None:
        res.bad += len(bad)
        _samples(res, [f"key {pk!r}: index {b.index.name!r}: {b.reason}" for b in bad])

    offload = _offload(source, partition, pool)
    shared = None if offload else scanworker.plan(source, partition, workers)
    handles: list[scanworker.ScanWorker] = []
    if offload is not None:
        # The whole scan in a pool process: it takes every range, sorts with the
        # memory limit, and this process holds no keys until the merge.
        assert pool is not None
        path, pcount = offload
        proc = pool.checkout(cancelled)
        try:
            handles = [scanworker.ScanWorker(
                scanworker.task(scanworker.common_task(store, path, sorter.memory_limit),
                                sorter.scratch_dir, 0),
                scanworker.Ranges(pcount).next, proc=proc)]
        except BaseException:
            pool.checkin(proc, healthy=False)
            raise
        batches: Iterable[list] = ()
    elif shared is not None:
        # Each process sorts with its share of the memory limit (see scanworker).
        path, pcount, procs = shared
        sorter.memory_limit //= procs
        ranges = scanworker.Ranges(pcount)
        handles = scanworker.start(store, path, procs, ranges, sorter.scratch_dir,
                                   sorter.memory_limit)
        batches = _ranges_batches(path, ranges)
    else:
        batches = scan_batches(source, partition)
    try:
        n = 0
        for batch in batches:
            n += feed_many(batch, add, addd, on_bad)
            sorter.check()
            if cancelled():
                raise RebuildCancelled(f"rebuild of partition {partition} cancelled after "
                                       f"{n} values; the partition is not ready")
            for h in handles:                   # serve the workers' range requests
                h.poll()
            rep.report(n + sum(h.done for h in handles))
        while pending := [h for h in handles if h.result is None]:   # the last ranges
            for h in pending:
                h.poll(0.1 / len(pending))
            if cancelled():
                raise RebuildCancelled(f"rebuild of partition {partition} cancelled "
                                       "while scanning; the partition is not ready")
            rep.report(n + sum(h.done for h in handles))
        for h in handles:
            r = h.result
            assert r is not None
            n += r["scanned"]
            res.bad += r["bad"]
            _samples(res, r["bad_samples"])
            sorter.adopt(r["runs"], r["count"])
    except BaseException:
        for h in handles:
            h.kill()
            if h.keep and pool is not None:
                pool.checkin(h.proc, healthy=False)
        raise
    for h in handles:
        if h.keep and pool is not None:
            pool.checkin(h.proc, healthy=True)
    res.scanned = n
    rep.report(n, force=True)


def _offload(source: Source, partition: int, pool: ScanPool | None) -> tuple[str, int] | None:
    """(file, page count) when the scan should go to ``pool``: a partition file the pool
    wants (``ScanPool.wants``: size, idle CPU) whose meta page reads (else the serial
    scan runs and raises the clear error)."""
    from checkpoint.pagefile import CorruptPageError, read_meta

    from .source import PartitionFileSource
    if pool is None or not isinstance(source, PartitionFileSource):
        return None
    path = source.file_for(partition)
    try:
        if not pool.wants(os.path.getsize(path)):
            return None
        pcount = read_meta(path).page_count
    except (OSError, CorruptPageError):
        return None
    return (path, pcount) if pcount >= 2 else None


def _ranges_batches(path: str, ranges: scanworker.Ranges) -> Iterator[list]:
    """This process's share of a shared scan: the ranges it takes, in batches."""
    from checkpoint.pagefile import iter_live_batches  # lower layer; loaded on use
    while (pages := ranges.next()) is not None:
        yield from _cut(iter_live_batches(path, pages=pages))


def _samples(res: RebuildResult, samples: list[str]) -> None:
    if len(res.bad_samples) < MAX_SAMPLES:
        res.bad_samples.extend(samples[:MAX_SAMPLES - len(res.bad_samples)])


def scan_batches(source: Source, partition: int) -> Iterator[list[tuple[bytes, bytes]]]:
    """The source's live pairs in lists: its own ``scan_batches`` when it has one (a
    partition file hands out a read chunk at a time), else ``scan`` cut in lists."""
    own = getattr(source, "scan_batches", None)
    if callable(own):
        yield from _cut(own(partition))
        return
    it = iter(source.scan(partition))
    while True:
        batch = list(itertools.islice(it, _CHECK_EVERY))
        if not batch:
            return
        yield batch


def _cut(batches: Iterable[list]) -> Iterator[list]:
    """A file's chunk is ~2 MiB of values; cut it so that memory, cancel and progress
    are checked every _CHECK_EVERY values or so."""
    for batch in batches:
        if len(batch) <= 2 * _CHECK_EVERY:
            yield batch
        else:
            for i in range(0, len(batch), _CHECK_EVERY):
                yield batch[i:i + _CHECK_EVERY]


def _load(store: IndexStore, partition: int, sorter: ExternalSorter, res: RebuildResult,
          rep: _Reporter, cancelled: Callable[[], bool], batch: int) -> None:
    env = store._env
    db = env.partition_db(partition, create=True)
    rep.start("load", len(sorter))
    uniq = sorted(keycodec.index_prefix(store.schema.ids[d.name])
                  for d in store.definitions if d.unique)
    last = b""
    done = 0
    for keys, extra in _key_chunks(sorter.key_batches(), batch):
        if uniq:
            last = unique_conflicts(keys, extra, uniq, last, res, MAX_SAMPLES)

        def put(txn: Any, keys: list[bytes] = keys,
                extra: dict[bytes, bytes] = extra) -> tuple[int, int]:
            # The pairs are streamed to putmulti, never held in a list: zip hands out
            # one reused tuple when putmulti drops it at once, so no per-entry object
            # is built (plain index keys carry the primary key and have empty data).
            # Made inside put because a full map runs it again from the start.
            data = map(extra.get, keys, repeat(b"")) if extra else repeat(b"")
            # append=True skips a key equal to the last one: that is how a value the
            # source gave twice is kept once (counted, not an error).
            return txn.cursor(db=db).putmulti(zip(keys, data), append=True)
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
