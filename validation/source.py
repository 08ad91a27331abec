"""The ``ferry`` Spark data source: partition files decoded inside the executors.

``spark.read.format("ferry").option("tasks", json).load()`` gives one Spark input
partition per partition file; each is decoded by :mod:`checkpoint.pagefile` in the
executor's Python worker and handed to the JVM as Arrow record batches, so entries
never pass through the driver. A corrupt page does not fail the task: it becomes one
row whose ``problem`` column says which page, at what offset, and why (data sources
cannot update accumulators, so the problem travels in-band; ``validation.compare``
splits it out in the same pass that computes the digests).

This module must stay importable on an executor with only the standard library,
pyarrow, pyspark and the shipped decoder (see ``validation.ship``).
"""
from __future__ import annotations

import json
import logging
from typing import Any, Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

log = logging.getLogger("ferry.validate")

SOURCE_NAME = "ferry"

# Raw rows: entries (problem NULL) and page problems (key, value ... NULL).
# A problem row stands for ``count`` corrupt pages: 1, or (the last row of a file with
# more than MAX_LISTED) every one past the listed ones.
RAW_SCHEMA = ("node string, cache string, partition int, key binary, value binary, "
              "counter long, tombstone boolean, "
              "problem struct<page: long, offset: long, reason: string, count: long>")

# An Arrow batch is sent when it holds BATCH entries or BATCH_BYTES of keys and values:
# large enough that the per-batch cost (one IPC message to the JVM) is small next to
# decoding, small enough to bound a Python worker's memory whatever the file size.
BATCH = 16384
BATCH_BYTES = 8 << 20

# A page of a file that is not a partition file at all (bad meta page, unreadable).
FILE_PAGE = -1
# Corrupt pages listed per file; the rest are counted in one more row. A crafted meta
# page over a sparse file made every page of it a problem row: a million rows went to
# the driver (3 GB) and into the report (150 MB of JSON). Now a file costs at most this
# many rows, whatever it holds.
MAX_LISTED = 100


class FerryDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return RAW_SCHEMA

    def reader(self, schema: Any) -> "FerryReader":
        tasks = json.loads(self.options.get("tasks", "[]"))
        return FerryReader(tasks)


class FerryReader(DataSourceReader):
    def __init__(self, tasks: list[dict]) -> None:
        self.tasks = tasks

    def partitions(self) -> list[InputPartition]:
        # One input partition per file: Spark runs as many at once as it has cores,
        # so a job with more files than cores streams through them.
        return [InputPartition(t) for t in self.tasks]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        yield from self.run_task(partition.value)

    def run_task(self, task: dict) -> Iterator[Any]:
        """What one input partition yields (live mode's reader runs another task)."""
        return decode_task(task)


def decode_task(task: dict) -> Iterator[Any]:
    """Arrow batches of one partition file's entries and page problems."""
    import pyarrow as pa

    from checkpoint import pagefile  # the shipped decoder; imported in the executor

    node, cache, part, path = task["node"], task["cache"], task["partition"], task["path"]
    keys: list[bytes] = []
    values: list[bytes | None] = []
    counters: list[int] = []
    tombs: list[bool] = []
    problems: list[dict] = []
    unlisted: list[Any] = []          # [first problem past MAX_LISTED, last one, count]

    def on_error(problem: Any) -> None:
        if len(problems) < MAX_LISTED:
            problems.append(_row(problem.page, problem.offset, problem.reason))
        elif not unlisted:
            unlisted.extend([problem, problem, 1])
        else:
            unlisted[1] = problem
            unlisted[2] += 1

    def batch(n_entries: int, probs: list[dict]) -> "pa.RecordBatch":
        n = n_entries + len(probs)
        null_tail = [None] * len(probs)
        return pa.RecordBatch.from_arrays([
            pa.array([node] * n, pa.string()),
            pa.array([cache] * n, pa.string()),
            pa.array([part] * n, pa.int32()),
            pa.array(keys + null_tail, pa.binary()),
            pa.array(values + null_tail, pa.binary()),
            pa.array(counters + null_tail, pa.int64()),
            pa.array(tombs + null_tail, pa.bool_()),
            pa.array([None] * n_entries + probs, problem_type(pa)),
        ], names=COLUMNS)

    size = 0
    try:
        for e in pagefile.iter_entries(path, include_tombstones=True, on_error=on_error):
            keys.append(e.key)
            values.append(e.value)
            counters.append(e.counter)
            tombs.append(e.tombstone)
            size += len(e.key) + (len(e.value) if e.value is not None else 0)
            if len(keys) >= BATCH or size >= BATCH_BYTES:
                yield batch(len(keys), [])
                keys.clear(); values.clear(); counters.clear(); tombs.clear()
                size = 0
    except Exception as exc:  # noqa: BLE001 - a broken file must not stop the job
        # The decoder raises on what it cannot skip (missing file, bad meta page):
        # report it against the whole file and keep what was decoded before it.
        problems.append(_row(FILE_PAGE, 0, f"{type(exc).__name__}: {exc}"))
        log.warning("%s: decoding stopped (%s: %s); reported as a problem of the file", path,
                    type(exc).__name__, exc)
    if unlisted:
        first, last, n = unlisted
        if n == 1:
            problems.append(_row(first.page, first.offset, first.reason))
        else:
            problems.append(_row(first.page, first.offset,
                                 f"{n} more corrupt pages not listed (pages {first.page}.."
                                 f"{last.page}); the first: {first.reason}", n))
    if keys or problems:
        yield batch(len(keys), problems)


COLUMNS = ["node", "cache", "partition", "key", "value", "counter", "tombstone", "problem"]


def _row(page: int, offset: int, reason: str, count: int = 1) -> dict:
    return {"page": int(page), "offset": int(offset), "reason": str(reason), "count": count}


def problem_type(pa: Any) -> Any:
    return pa.struct([("page", pa.int64()), ("offset", pa.int64()), ("reason", pa.string()),
                      ("count", pa.int64())])
