"""Replica comparison in Spark SQL: digests per (cache, partition, node), owners
compared, differing keys of divergent partitions listed (capped and counted).

Digest of one replica = (entry count, XOR of h, sum of the low 32 bits of h) with
``h = xxhash64(key, value_hash, counter, tombstone)``: both XOR and sum are
order-independent, so files whose pages hold the same entries in another order
digest alike, and no entry has to be sorted or brought to the driver. XOR alone
would let two equal entries cancel; the sum (exact in 64 bits for < 2^31 entries
per partition, and ANSI-safe) does not.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .layout import PartitionFile

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

# value_hash = xxhash64(value), Spark's seeded XXH64 (seed 42); NULL for tombstones.
ENTRY_COLUMNS = ("node", "cache", "partition", "key", "value_hash", "counter", "tombstone")
ENTRY_SCHEMA = ("node string, cache string, partition int, key binary, value_hash long, "
                "counter long, tombstone boolean")
LOW32 = 0xFFFFFFFF
# live mode (validation.livesource): per-copy columns, constant within one copy
LIVE_COLUMNS = ("at", "snapshot", "error")


def value_hash(col: "str | Column" = "value", tombstone: str | None = "tombstone") -> "Column":
    """xxhash64 of the value, NULL for a tombstone (or, with ``tombstone=None``, for a
    NULL value: an expected row that says the key must be absent)."""
    from pyspark.sql import functions as F

    c = F.col(col) if isinstance(col, str) else col
    h = F.xxhash64(c)
    if tombstone is None:
        return F.when(c.isNull(), F.lit(None).cast("long")).otherwise(h)
    return F.when(F.col(tombstone), F.lit(None).cast("long")).otherwise(h)


def entries(raw: "DataFrame", *, with_value: bool = False) -> "DataFrame":
    """The entries DataFrame (``ENTRY_SCHEMA``) of raw source rows; ``with_value``
    keeps the value bytes too (for export)."""
    from pyspark.sql import functions as F

    cols = [F.col(c) for c in ("node", "cache", "partition", "key")]
    if with_value:
        cols.append(F.col("value"))
    cols += [value_hash().alias("value_hash"), F.col("counter"), F.col("tombstone")]
    # an entry row has a key; page problems and live mode's per-copy marker rows do not
    return raw.where(F.col("key").isNotNull()).select(*cols)


@dataclass
class Replica:
    node: str
    entries: int
    digest: str
    corrupt_pages: int
    # live mode: the counter the partition was fenced at, this copy's snapshot counter,
    # and why the copy could not be fetched (then it is not compared)
    at: int | None = None
    snapshot: int | None = None
    error: str | None = None


@dataclass
class PartitionState:
    cache: str
    partition: int
    replicas: dict[str, Replica] = field(default_factory=dict)

    @property
    def divergent(self) -> bool:
        return len({(r.entries, r.digest) for r in self.replicas.values() if r.error is None}) > 1


def digests(raw: "DataFrame",
            files: list[PartitionFile]) -> tuple[list[PartitionState], list[dict]]:
    """One pass over all ``files`` (read as ``raw``): per-replica digests and every
    page problem. A file that yields no row (an empty partition) is still an owner,
    with 0 entries: an owner that lost everything must diverge, not vanish."""
    from pyspark.sql import functions as F

    ok = F.col("key").isNotNull()
    h = F.xxhash64("key", "value_hash", "counter", "tombstone")
    live = [F.max(c).alias(c) for c in LIVE_COLUMNS if c in raw.columns]
    rows = (raw.withColumn("value_hash", value_hash())
            .groupBy("node", "cache", "partition")
            .agg(F.count(F.when(ok, 1)).alias("n"),
                 F.bit_xor(F.when(ok, h)).alias("x"),
                 F.sum(F.when(ok, h.bitwiseAND(F.lit(LOW32)))).alias("s"),
                 F.collect_list("problem").alias("problems"), *live)
            .collect())
    states: dict[tuple[str, int], PartitionState] = {}
    problems: list[dict] = []
    for r in rows:
        key = (r["cache"], r["partition"])
        st = states.setdefault(key, PartitionState(*key))
        extra = {c: r[c] for c in LIVE_COLUMNS if live and c in r}
        st.replicas[r["node"]] = Replica(r["node"], r["n"], _digest(r["x"] or 0, r["s"] or 0),
                                         sum(p["count"] or 1 for p in r["problems"]), **extra)
        for p in r["problems"]:
            row = {"node": r["node"], "cache": r["cache"], "partition": r["partition"],
                   "page": p["page"], "offset": p["offset"], "reason": p["reason"]}
            if (p["count"] or 1) > 1:         # the pages of a file past the listed ones
                row["count"] = p["count"]
            problems.append(row)
    for f in files:
        st = states.setdefault((f.cache, f.partition), PartitionState(f.cache, f.partition))
        if f.node not in st.replicas:
            st.replicas[f.node] = Replica(f.node, 0, _digest(0, 0), 0)
    ordered = sorted(states.values(), key=lambda s: (s.cache, s.partition))
    problems.sort(key=lambda p: (p["cache"], p["partition"], p["node"], p["page"]))
    return ordered, problems


def file_problem(f: PartitionFile) -> dict:
    """The finding of a file the layout does not decode (``f.problem``), as a problem
    row of the whole file."""
    from .source import FILE_PAGE
    return {"node": f.node, "cache": f.cache, "partition": f.partition, "page": FILE_PAGE,
            "offset": 0, "reason": f.problem or ""}


def corrupt_count(problems: list[dict]) -> int:
    """Corrupt pages behind ``problems`` (a row past a file's listed ones counts many)."""
    return sum(p.get("count", 1) for p in problems)


def _digest(xor: int, total: int) -> str:
    return f"{xor & 0xFFFFFFFFFFFFFFFF:016x}{total:012x}"


def render_key(key: bytes) -> str:
    """A key as text when it is printable UTF-8, else ``0x`` + hex."""
    try:
        text = key.decode("utf-8")
        if text.isprintable():
            return text
    except UnicodeDecodeError:
        pass
    return "0x" + key.hex()


def key_diffs(ents: "DataFrame", states: list[PartitionState],
              max_keys: int) -> list[dict]:
    """The differing keys of the divergent partitions in ``states``.

    ``ents`` should hold only those partitions' entries (the caller reads only their
    files). A key differs when some owner lacks it (``missing``), owners disagree on
    the value or tombstone (``value``), or only on the update counter (``counter``).
    At most ``max_keys`` keys per partition are listed; ``keys_total`` counts all.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    div = [s for s in states if s.divergent]
    if not div:
        return []
    spark = ents.sparkSession
    compared = {(s.cache, s.partition): {n for n, r in s.replicas.items() if r.error is None}
                for s in div}
    owners = spark.createDataFrame(
        [(c, p, len(nodes)) for (c, p), nodes in compared.items()],
        "cache string, partition int, owners int")
    versions = F.collect_list(F.struct("node", "value_hash", "counter", "tombstone"))
    grouped = (ents.groupBy("cache", "partition", "key")
               .agg(versions.alias("v"))
               .join(F.broadcast(owners), ["cache", "partition"]))
    values = F.size(F.array_distinct(
        F.transform("v", lambda x: F.struct(x["value_hash"], x["tombstone"]))))
    counters = F.size(F.array_distinct(F.transform("v", lambda x: x["counter"])))
    kind = (F.when(F.size("v") < F.col("owners"), "missing")
            .when(values > 1, "value").when(counters > 1, "counter"))
    w = Window.partitionBy("cache", "partition")
    rows = (grouped.withColumn("kind", kind).where(F.col("kind").isNotNull())
            .withColumn("total", F.count(F.lit(1)).over(w))
            .withColumn("rank", F.row_number().over(w.orderBy("key")))
            .where(F.col("rank") <= max(1, max_keys))   # rank 1 carries the total
            .collect())
    by_part: dict[tuple[str, int], dict] = {}
    for s in div:
        by_part[(s.cache, s.partition)] = {
            "cache": s.cache, "partition": s.partition, "keys": [], "keys_total": 0,
            "owners": {n: {"entries": r.entries, "digest": r.digest}
                       for n, r in sorted(s.replicas.items()) if r.error is None}}
    for r in sorted(rows, key=lambda r: (r["cache"], r["partition"], r["rank"])):
        d = by_part[(r["cache"], r["partition"])]
        d["keys_total"] = r["total"]
        if r["rank"] > max_keys:
            continue
        nodes: dict[str, dict | None] = {n: None for n in d["owners"]}
        for v in r["v"]:
            nodes[v["node"]] = {"value_hash": v["value_hash"], "counter": v["counter"],
                                "tombstone": v["tombstone"]}
        d["keys"].append({"key": render_key(bytes(r["key"])), "key_hex": bytes(r["key"]).hex(),
                          "kind": r["kind"], "nodes": nodes})
    return [by_part[(s.cache, s.partition)] for s in div]
