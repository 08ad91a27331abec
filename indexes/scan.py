"""The scan stage that rebuild and verify share: a partition's live values become entry
keys in an :class:`~indexes.extsort.ExternalSorter`.

The same code decides what "expected" means for both, so verify compares an index with
exactly what a rebuild would have written. The scan runs in this process
(``source.scan_batches`` or ``scan``), or shared with worker processes that take page
ranges of a partition file (:mod:`indexes.scanworker`), or whole in a
:class:`~indexes.scanpool.ScanPool` process.
"""
from __future__ import annotations

import itertools
import os
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Protocol, Union

from . import scanworker
from .errors import RebuildCancelled
from .extsort import ExternalSorter
from .indexer import Columns, Indexer
from .meta import Schema
from .results import RebuildResult, Reporter
from .source import PartitionFileSource, Source

if TYPE_CHECKING:
    from .scanpool import ScanPool

# Values between memory checks, cancel checks and progress reports in the scan (one
# batch): the sorter may overshoot its limit by this many values' keys (~200 KB for 3
# indexes).
_CHECK_EVERY = 1024
# The scratch folder under an index environment: sorted runs of rebuilds and verifies.
SCRATCH = "scratch"
# What the scan hands Indexer.feed_many: a list of pairs, or pairs in buffers.
Batch = Union[list[tuple[bytes, bytes]], Columns]


class Indexed(Protocol):
    """What the scan needs of an index store: how a value becomes entry keys."""

    @property
    def indexer(self) -> Indexer: ...

    @property
    def schema(self) -> Schema: ...


def scan_partition(store: Indexed, partition: int, source: Source, sorter: ExternalSorter,
                   res: RebuildResult, rep: Reporter, cancelled: Callable[[], bool],
                   workers: int | None = None, pool: ScanPool | None = None) -> None:
    """Feed every live value of ``partition`` to ``sorter``; counts go to ``res``
    (scanned, bad and its samples), progress to ``rep`` (stage ``scan``). Raises
    RebuildCancelled when ``cancelled()`` turns true."""
    count = getattr(source, "count", None)
    rep.start("scan", count(partition) if callable(count) else None)
    feed_many, add, addd = store.indexer.feed_many, sorter.append, sorter.add_with_data
    ids = store.schema.ids

    def on_bad(pk: bytes, bad: list) -> None:
        res.bad += len(bad)
        res.add_bad_samples([f"key {pk!r}: index {b.index.name!r}: {b.reason}" for b in bad])

    verified = bool(getattr(source, "verified", False))
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
                scanworker.task(scanworker.common_task(store.indexer, ids, path,
                                                       sorter.memory_limit, verified),
                                sorter.scratch_dir, 0),
                scanworker.Ranges(pcount).next, proc=proc)]
        except BaseException:
            pool.checkin(proc, healthy=False)
            raise
        batches: Iterable[Batch] = ()
    elif shared is not None:
        # Each process sorts with its share of the memory limit (see scanworker).
        path, pcount, procs = shared
        sorter.memory_limit //= procs
        ranges = scanworker.Ranges(pcount)
        handles = scanworker.start(store.indexer, ids, path, procs, ranges,
                                   sorter.scratch_dir, sorter.memory_limit, verified)
        batches = _ranges_batches(path, ranges, verified)
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
            res.add_bad_samples(r["bad_samples"])
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


def _ranges_batches(path: str, ranges: scanworker.Ranges, verified: bool) -> Iterator[Batch]:
    """This process's share of a shared scan: the ranges it takes, in batches."""
    from checkpoint.pagefile import iter_live_columns  # lower layer; loaded on use
    while (pages := ranges.next()) is not None:
        yield from _cut(iter_live_columns(path, pages=pages, verified=verified))


def scan_batches(source: Source, partition: int) -> Iterator[Batch]:
    """The source's live pairs in batches for ``Indexer.feed_many``: its own
    ``scan_columns`` (a partition file: the decoder's ``LiveColumns``, a read chunk
    at a time, and lists of pairs) or ``scan_batches`` when it has one, else ``scan``
    cut in lists."""
    own = getattr(source, "scan_columns", None)
    if not callable(own):
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


def _cut(batches: Iterable[Batch]) -> Iterator[Batch]:
    """A file's chunk is ~2 MiB of values; cut a list so that memory, cancel and
    progress are checked every _CHECK_EVERY values or so. A ``LiveColumns`` (one read
    chunk, no object per pair) goes whole: checks once a chunk."""
    for batch in batches:
        if not isinstance(batch, list) or len(batch) <= 2 * _CHECK_EVERY:
            yield batch
        else:
            for i in range(0, len(batch), _CHECK_EVERY):
                yield batch[i:i + _CHECK_EVERY]
