"""Checking the data against an expected dataset (``--expected FILE``).

The file holds the contents the cluster should have, e.g. the harness's model of
acknowledged writes: JSON lines or Parquet with columns

- ``key`` (text or binary) or ``key_hex``;
- ``value`` (text or binary), ``value_hex``, or ``value_hash`` (Spark's
  ``xxhash64(value)``, = Python ``xxhash.xxh64_intdigest(value, seed=42)`` as a
  signed 64-bit integer); a NULL value means the key must be absent (removed);
- ``partition`` (optional: a whole number 0..65535 on every row); without it the
  partition is derived from the key with the cluster's own function
  (``node.assignment.partition_of(key, P)``), P being the cache's partition count (from
  the cluster's map in live mode, ``--partitions``, or the highest partition file found
  + 1 in folder mode); optional ``cache`` (without it the data must hold one cache, or
  the rows are taken to be of the cache ``default``).

A column of the wrong type (``"partition": "abc"``, a key that is an object, a
``value_hash`` that is text) or a row without a partition is an error naming the
file, the column and an example (exit status 2), not a mismatch: a NULL partition
would show up as "missing" keys and fail the check for a reason that is not in the
data.

Every expected row is checked on every owner of its partition: ``missing`` (an
owner lacks the key, or no node holds the partition: node NULL), ``wrong`` (the
owner's value differs), ``extra`` (an owner holds a live key the expected data does
not, in a cache the expected data covers). Counts are of (node, key) pairs.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Mapping

from .compare import PartitionState, render_key, value_hash
from .errors import ExpectedFileError, short_error
from .layout import DEFAULT_CACHE

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

KINDS = ("missing", "extra", "wrong")
INTEGRAL = ("tinyint", "smallint", "int", "bigint")
TEXT = ("string", "binary")
MAX_PARTITION = 65535      # node.config: a cache has at most 65536 partitions


def _load(spark: "SparkSession", path: str) -> "DataFrame":
    if not os.path.exists(path):
        raise ExpectedFileError(f"expected file {path} does not exist")
    try:
        if os.path.isdir(path) or path.endswith((".parquet", ".pq")):
            return spark.read.parquet(path)
        # FAILFAST: a malformed line is an error naming the file, not a NULL row
        # that would show up as a thousand "missing" keys.
        return spark.read.option("mode", "FAILFAST").json(path)
    except Exception as exc:  # noqa: BLE001 - Spark raises its own analysis errors
        if os.path.isdir(path) or path.endswith((".parquet", ".pq")):
            raise ExpectedFileError(f"cannot read expected file {path} as Parquet: "
                                    f"{short_error(exc)}") from exc
        where = _first_bad_line(path)      # Spark does not say which line
        raise ExpectedFileError(f"cannot read expected file {path} as JSON lines (one object "
                                f"per line): {where or short_error(exc)}") from exc


def _first_bad_line(path: str) -> str | None:
    """``line N: why`` of the first line of a JSON-lines file that is not one JSON
    object, found by reading it here (only after Spark refused the file)."""
    import json
    try:
        with open(path, "rb") as f:
            for n, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    if not isinstance(json.loads(raw), dict):
                        return f"line {n} is not a JSON object"
                except json.JSONDecodeError as e:
                    return f"line {n}, column {e.colno}: {e.msg}"
                except (ValueError, RecursionError) as e:     # not UTF-8, nested too deep
                    return f"line {n}: {type(e).__name__}: {e}"
    except OSError:
        pass
    return None


def _check_type(df: "DataFrame", path: str, column: str, allowed: tuple[str, ...],
                what: str) -> None:
    """``column`` holds one of the ``allowed`` Spark types, or ExpectedFileError with
    an example value. A cast would make the wrong type NULL (or, with ANSI casts, fail
    later inside the comparison with a Spark stack trace)."""
    from pyspark.sql import functions as F
    dtype = dict(df.dtypes)[column]
    if dtype in allowed:
        return
    col = F.col(column)
    rows = df.where(col.isNotNull()).select(column)
    row = None
    if dtype == "string":       # an example that is plainly not a number, if there is one
        row = rows.where(~col.rlike(r"^\s*-?[0-9]+\s*$")).first()
    row = row or rows.first()
    if row is None:
        raise ExpectedFileError(f"{path}: column {column} is null on every row; it must hold {what}")
    raise ExpectedFileError(f"{path}: column {column} holds {dtype} values such as {row[0]!r}; "
                            f"it must hold {what}")


def _check_partitions(df: "DataFrame", path: str, key_column: str) -> None:
    from pyspark.sql import functions as F
    _check_type(df, path, "partition", INTEGRAL, f"whole numbers 0..{MAX_PARTITION}")
    p = F.col("partition")
    bad = (df.where(p.isNull() | (p < 0) | (p > MAX_PARTITION))
           .select("partition", key_column).first())
    if bad is not None:
        raise ExpectedFileError(f"{path}: the row with {key_column} {bad[1]!r} has partition "
                                f"{bad[0]!r}; every row needs a partition 0..{MAX_PARTITION}")


def derived_partition(counts: Mapping[str, int]) -> "Column":
    """A Spark column computing the partition of (``cache``, ``key``) with the
    cluster's own key -> partition function; NULL for a cache not in ``counts``.
    A plain Python UDF: ``partition_of`` is xxh64 with seed 0, which Spark's built-in
    ``xxhash64`` (seed 42) cannot compute, and it needs no pandas on the executors."""
    from pyspark.sql import functions as F

    table = dict(counts)

    def part(cache: str | None, key: bytes | None) -> int | None:
        from node import partition_of   # imported in the executor
        n = table.get(cache) if cache is not None else None
        if n is None or key is None:
            return None
        return partition_of(bytes(key), n)
    return F.udf(part, "int", useArrow=False)(F.col("cache"), F.col("key"))


def read_expected(spark: "SparkSession", path: str, caches: set[str],
                  partitions: Mapping[str, int] | None = None) -> "DataFrame":
    """(cache, partition, key binary, value_hash long) rows of the expected file.
    ``partitions`` (cache -> partition count) derives the partition of rows that have
    no ``partition`` column."""
    from pyspark.sql import functions as F

    df = _load(spark, path)
    types = dict(df.dtypes)
    if "key" in types:
        _check_type(df, path, "key", TEXT, "text or binary keys")
        key = F.col("key").cast("binary")
    elif "key_hex" in types:
        _check_type(df, path, "key_hex", ("string",), "keys as hex text")
        key = F.unhex("key_hex")
    else:
        raise ExpectedFileError(f"{path} has no key column (key or key_hex); columns: "
                                f"{sorted(types)}")
    if "value_hash" in types:
        _check_type(df, path, "value_hash", INTEGRAL, "64-bit xxhash64 values (whole numbers)")
        vh = F.col("value_hash").cast("long")
    elif "value" in types:
        _check_type(df, path, "value", TEXT, "text or binary values")
        vh = value_hash(F.col("value").cast("binary"), None)
    elif "value_hex" in types:
        _check_type(df, path, "value_hex", ("string",), "values as hex text")
        vh = value_hash(F.unhex("value_hex"), None)
    else:
        raise ExpectedFileError(f"{path} has no value column (value, value_hex or "
                                f"value_hash); columns: {sorted(types)}")
    has_partition = "partition" in types
    if has_partition:
        _check_partitions(df, path, "key" if "key" in types else "key_hex")
    elif not partitions:
        raise ExpectedFileError(f"{path} has no partition column and the partition count is "
                                "unknown (give --partitions N, or validate a cluster); "
                                f"columns: {sorted(types)}")
    if "cache" in types:
        _check_type(df, path, "cache", ("string",), "cache names (text)")
        cache = F.col("cache").cast("string")
    elif len(caches) == 1:
        cache = F.lit(next(iter(caches)))
    else:
        cache = F.lit(DEFAULT_CACHE)
    if has_partition:
        return df.select(cache.alias("cache"), F.col("partition").cast("int").alias("partition"),
                         key.alias("key"), vh.alias("value_hash"))
    rows = df.select(cache.alias("cache"), key.alias("key"), vh.alias("value_hash"))
    rows = rows.withColumn("partition", derived_partition(partitions or {}))
    unknown = rows.where(F.col("partition").isNull()).select("cache").first()
    if unknown is not None:
        raise ExpectedFileError(f"{path}: rows of cache {unknown[0]!r} have no partition column "
                                f"and the partition count of that cache is unknown (known: "
                                f"{dict(sorted((partitions or {}).items()))})")
    return rows.select("cache", "partition", "key", "value_hash")


def check(exp: "DataFrame", ents: "DataFrame", states: list[PartitionState],
          max_examples: int) -> dict:
    """Missing, extra and wrong entries of the data against the expected rows
    (from :func:`read_expected`)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    spark = exp.sparkSession
    owner_rows = [(s.cache, s.partition, n) for s in states for n in s.replicas]
    owners = spark.createDataFrame(owner_rows or [("", -1, "")],
                                   "cache string, partition int, node string")
    e = (exp.join(F.broadcast(owners), ["cache", "partition"], "left")
         .select("cache", "partition", "node", "key",
                 F.col("value_hash").alias("expected_hash"), F.lit(True).alias("listed")))
    covered = exp.select("cache").distinct()
    live = (ents.where(~F.col("tombstone")).join(F.broadcast(covered), "cache")
            .select("cache", "partition", "node", "key", F.col("value_hash").alias("actual_hash")))
    joined = e.join(live, ["cache", "partition", "node", "key"], "full_outer")
    kind = (F.when(F.col("listed").isNull() | F.col("expected_hash").isNull(),
                   F.when(F.col("actual_hash").isNotNull(), "extra"))
            .when(F.col("actual_hash").isNull(), "missing")
            .when(F.col("actual_hash") != F.col("expected_hash"), "wrong"))
    bad = joined.withColumn("kind", kind).where(F.col("kind").isNotNull())
    w = Window.partitionBy("kind")
    rows = (bad.withColumn("total", F.count(F.lit(1)).over(w))
            .withColumn("rank", F.row_number().over(w.orderBy("cache", "partition", "key", "node")))
            .where(F.col("rank") <= max_examples).collect())
    out: dict = {k: 0 for k in KINDS}
    out["rows"] = exp.count()
    out["examples"] = []
    for r in sorted(rows, key=lambda r: (KINDS.index(r["kind"]), r["rank"])):
        out[r["kind"]] = r["total"]
        out["examples"].append({
            "kind": r["kind"], "cache": r["cache"], "partition": r["partition"],
            "node": r["node"], "key": render_key(bytes(r["key"])),
            "key_hex": bytes(r["key"]).hex(), "expected_hash": r["expected_hash"],
            "actual_hash": r["actual_hash"]})
    return out
