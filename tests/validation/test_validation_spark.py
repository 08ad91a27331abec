"""The validation job on real partition files in real (local) Spark: one session
for the module; each test builds its own small node folders."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from validation import ExpectedFileError, validate
from validation.report import JSON_KEYS
from validation_pages import entries, write_node

pytestmark = pytest.mark.spark

PARTS = 6  # more partition files per node than the session's 2 cores


def two_nodes(tmp_path, n: int = 200, change=None) -> list[str]:
    """Nodes a and b holding the same PARTS partitions of cache ``users``;
    ``change(node, p, rows)`` may edit a node's rows before they are written."""
    dirs = []
    for node in ("a", "b"):
        parts = {}
        for p in range(PARTS):
            rows = entries(p, n)
            if change:
                rows = change(node, p, rows)
            parts[p] = rows
        dirs.append(write_node(str(tmp_path / node), "users", parts, node_id=f"node-{node}"))
    return dirs


def test_identical_replicas_pass(spark, tmp_path) -> None:
    dirs = two_nodes(tmp_path)
    write_node(dirs[0], "orders", {0: entries(0, 50)})   # single owner: checked, not compared
    res = validate(dirs, spark=spark)
    assert list(res) == [k for k in JSON_KEYS if k != "expected"]
    assert res["passed"] is True
    assert res["partitions_checked"] == PARTS + 1
    assert res["entries"] == 2 * PARTS * 200 + 50
    assert res["divergent"] == [] and res["corrupt_pages"] == []
    assert res["seconds"] > 0


def test_one_changed_value_is_reported_as_that_key(spark, tmp_path) -> None:
    def change(node, p, rows):
        if node == "b" and p == 3:
            rows[117] = (rows[117][0], b"CHANGED", rows[117][2])
        return rows
    res = validate(two_nodes(tmp_path, change=change), spark=spark)
    assert res["passed"] is False
    (d,) = res["divergent"]
    assert (d["cache"], d["partition"], d["keys_total"]) == ("users", 3, 1)
    (k,) = d["keys"]
    assert (k["key"], k["kind"]) == ("k3-117", "value")
    assert k["nodes"]["node-a"]["value_hash"] != k["nodes"]["node-b"]["value_hash"]
    assert k["nodes"]["node-a"]["counter"] == k["nodes"]["node-b"]["counter"] == 118


def test_missing_entry_and_counter_and_tombstone_differences(spark, tmp_path) -> None:
    def change(node, p, rows):
        if node == "b" and p == 1:
            rows[10] = (rows[10][0], rows[10][1], 999)    # same value, other counter
            rows[20] = (rows[20][0], None, rows[20][2])   # removed on b only
            del rows[5]                                   # missing on b
        if node == "b" and p == 4:
            rows = []                                     # b lost the whole partition
        return rows
    res = validate(two_nodes(tmp_path, change=change), spark=spark)
    d, empty = res["divergent"]
    assert (empty["partition"], empty["keys_total"]) == (4, 200)
    assert empty["owners"]["node-b"]["entries"] == 0
    assert {k["kind"] for k in empty["keys"]} == {"missing"}
    assert d["partition"] == 1 and d["keys_total"] == 3
    kinds = {k["key"]: k["kind"] for k in d["keys"]}
    assert kinds == {"k1-5": "missing", "k1-10": "counter", "k1-20": "value"}
    missing = next(k for k in d["keys"] if k["kind"] == "missing")
    assert missing["nodes"]["node-b"] is None and missing["nodes"]["node-a"]["counter"] == 6
    assert d["owners"]["node-a"]["entries"] == 200 and d["owners"]["node-b"]["entries"] == 199


@pytest.mark.slow
def test_differing_keys_are_capped_and_counted(spark, tmp_path) -> None:
    def change(node, p, rows):
        if node == "b" and p == 0:
            rows = [(k, v + b"!", c) for k, v, c in rows[:50]] + rows[50:]
        return rows
    res = validate(two_nodes(tmp_path, change=change), spark=spark, max_keys=7)
    (d,) = res["divergent"]
    assert d["keys_total"] == 50 and len(d["keys"]) == 7
    assert [k["key"] for k in d["keys"]] == sorted(k["key"] for k in d["keys"])


def test_corrupt_page_is_reported_and_job_continues(spark, tmp_path) -> None:
    dirs = two_nodes(tmp_path, n=400)
    path = os.path.join(dirs[1], "caches", "users", "part-2.bin")
    with open(path, "r+b") as f:           # flip one byte inside data page 2
        f.seek(2 * 4096 + 1000)
        b = f.read(1)
        f.seek(2 * 4096 + 1000)
        f.write(bytes([b[0] ^ 0xFF]))
    garbage = os.path.join(dirs[1], "caches", "users", "part-4.bin")
    with open(garbage, "wb") as f:         # not a partition file at all
        f.write(b"\x00" * 100)
    res = validate(dirs, spark=spark)
    assert res["passed"] is False
    pages = {(p["node"], p["partition"], p["page"]): p for p in res["corrupt_pages"]}
    assert set(pages) == {("node-b", 2, 2), ("node-b", 4, 0)}
    assert pages[("node-b", 2, 2)]["offset"] == 2 * 4096
    assert "CRC" in pages[("node-b", 2, 2)]["reason"]
    # the rest of the files were still read and compared
    assert res["partitions_checked"] == PARTS
    assert {d["partition"] for d in res["divergent"]} == {2, 4}
    lost = next(d for d in res["divergent"] if d["partition"] == 2)
    owners = lost["owners"]
    assert lost["keys_total"] == owners["node-a"]["entries"] - owners["node-b"]["entries"] > 0
    assert all(k["kind"] == "missing" for k in lost["keys"])


def _expected_rows(n: int = 200) -> list[dict]:
    return [{"cache": "users", "partition": p, "key": k.decode(), "value": v.decode()}
            for p in range(PARTS) for k, v, _c in entries(p, n)]


def test_expected_file_mismatches(spark, tmp_path) -> None:
    dirs = two_nodes(tmp_path)
    rows = _expected_rows()
    rows = [r for r in rows if r["key"] != "k0-1"]                 # data has it: extra
    for r in rows:
        if r["key"] == "k2-2":
            r["value"] = "other"                                   # wrong
    rows.append({"cache": "users", "partition": 4, "key": "k4-new", "value": "x"})  # missing
    rows.append({"cache": "users", "partition": 5, "key": "k5-3", "value": None})   # must be gone
    path = tmp_path / "expected.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    res = validate(dirs, spark=spark, expected=str(path))
    e = res["expected"]
    assert res["passed"] is False and res["divergent"] == []
    # counts are (owner, key) pairs: two owners each
    assert (e["missing"], e["extra"], e["wrong"]) == (2, 4, 2)
    assert e["rows"] == len(rows)
    got = {(x["kind"], x["key"], x["node"]) for x in e["examples"]}
    assert got == {("missing", "k4-new", "node-a"), ("missing", "k4-new", "node-b"),
                   ("extra", "k0-1", "node-a"), ("extra", "k0-1", "node-b"),
                   ("extra", "k5-3", "node-a"), ("extra", "k5-3", "node-b"),
                   ("wrong", "k2-2", "node-a"), ("wrong", "k2-2", "node-b")}


@pytest.mark.slow
def test_expected_value_hash_and_parquet_match(spark, tmp_path) -> None:
    """The documented value_hash (xxh64, seed 42, signed) equals Spark's xxhash64,
    and Parquet with binary keys/values works like JSON lines."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import xxhash

    dirs = two_nodes(tmp_path)
    rows = _expected_rows()

    def signed(h: int) -> int:
        return h - (1 << 64) if h >= 1 << 63 else h
    hashed = [{"partition": r["partition"], "key": r["key"],
               "value_hash": signed(xxhash.xxh64_intdigest(r["value"].encode(), seed=42))}
              for r in rows]      # no cache column: the data holds one cache
    jl = tmp_path / "hashed.jsonl"
    jl.write_text("\n".join(json.dumps(r) for r in hashed))
    res = validate(dirs, spark=spark, expected=str(jl))
    assert res["passed"] is True, res["expected"]
    assert res["expected"]["rows"] == len(rows)

    table = pa.table({"cache": [r["cache"] for r in rows],
                      "partition": pa.array([r["partition"] for r in rows], pa.int32()),
                      "key": pa.array([r["key"].encode() for r in rows], pa.binary()),
                      "value": pa.array([r["value"].encode() for r in rows], pa.binary())})
    pq.write_table(table.slice(1), tmp_path / "exp.parquet")   # first row dropped: extra
    res = validate(dirs, spark=spark, expected=str(tmp_path / "exp.parquet"))
    e = res["expected"]
    assert (e["missing"], e["extra"], e["wrong"]) == (0, 2, 0)


@pytest.mark.parametrize("content, message", [
    # (rows without a partition column are placed by node.partition_of:
    # tests/validation/test_expected_keys_only.py)
    ('{"cache": "other", "key": "a", "value": "b"}\n', "cache 'other'"),
    ('{"partition": 1, "value": "b"}\n', "no key column"),
    ('{"partition": 1, "key": "a"}\n', "no value column"),
])
def test_bad_expected_file_is_a_clear_error(spark, tmp_path, content, message) -> None:
    dirs = two_nodes(tmp_path, n=5)
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ExpectedFileError, match=message):
        validate(dirs, spark=spark, expected=str(path))
    with pytest.raises(ExpectedFileError, match="does not exist"):
        validate(dirs, spark=spark, expected=str(tmp_path / "nope.jsonl"))


@pytest.mark.slow
def test_report_and_parquet_export(spark, tmp_path) -> None:
    def change(node, p, rows):
        return rows[:-1] if node == "a" and p == 5 else rows
    dirs = two_nodes(tmp_path, n=30, change=change)
    out = tmp_path / "export"
    html = tmp_path / "r.html"
    res = validate(dirs, spark=spark, report=str(html), export=str(out))
    assert [d["partition"] for d in res["divergent"]] == [5]
    text = html.read_text()
    assert "<h2>cache users</h2>" in text and "DIVERGENT" in text and "k5-29" in text
    assert sorted(os.listdir(out / "cache=users")) == [f"partition={p}" for p in range(PARTS)]
    back = spark.read.parquet(str(out))
    assert back.count() == res["entries"]
    row = back.where("cache = 'users' AND partition = 1 AND key = CAST('k1-7' AS BINARY) "
                     "AND node = 'node-a'").collect()
    assert [bytes(r["value"]) for r in row] == [b"v7"]
    shutil.rmtree(out)


# --- nodes written through the real store API (checkpoint.PartitionStore) ---------

def store_node(data_dir: str, node_id: str, cache: str = "users",
               n: int = 150, parts: int = 4) -> str:
    from checkpoint import PartitionStore

    os.makedirs(data_dir, exist_ok=True)
    with open(os.path.join(data_dir, "node.id"), "w") as f:
        f.write(node_id)
    store = PartitionStore.open(os.path.join(data_dir, "caches", cache), checkpoint_interval=None)
    try:
        for p in range(parts):
            for i in range(n):
                # every 50th value spans overflow pages
                value = (b"big-%d-" % i) * 2000 if i % 50 == 0 else b"value-%d" % i
                store.put(p, b"key-%d-%d" % (p, i), value)
        store.remove(1, b"key-1-3")
        store.checkpoint()
    finally:
        store.close()
    return data_dir


def test_store_replicas_one_value_changed_through_the_store(spark, tmp_path) -> None:
    from checkpoint import PartitionStore

    a = store_node(str(tmp_path / "a"), "node-a")
    b = store_node(str(tmp_path / "b"), "node-b")
    res = validate([a, b], spark=spark)
    assert res["passed"] is True, res
    assert res["partitions_checked"] == 4

    store = PartitionStore.open(os.path.join(b, "caches", "users"), checkpoint_interval=None)
    try:
        store.put(2, b"key-2-77", b"changed on b only")
        store.checkpoint()
    finally:
        store.close()
    res = validate([a, b], spark=spark)
    assert res["passed"] is False
    (d,) = res["divergent"]
    assert (d["partition"], d["keys_total"]) == (2, 1)
    assert [(k["key"], k["kind"]) for k in d["keys"]] == [("key-2-77", "value")]


def test_bad_files_cost_a_bounded_report_and_never_fail_the_job(spark, tmp_path) -> None:
    """A crafted meta page over a sparse file (each page corrupt), a partition number
    past the int column, a name that is not the partition's: findings, job goes on."""
    from checkpoint.layout import encode_meta, seal
    from validation.source import MAX_LISTED
    dirs = two_nodes(tmp_path)
    folder = os.path.join(dirs[1], "caches", "users")
    meta = encode_meta(1, 4096, 50_000, 1)
    seal(meta)
    with open(os.path.join(folder, "part-1.bin"), "wb") as f:
        f.write(meta)
        f.truncate(50_000 * 4096)                  # 200 MB sparse
    for name in ("part-99999999999.bin", "part-03.bin"):
        shutil.copy(os.path.join(folder, "part-0.bin"), os.path.join(folder, name))
    res = validate(dirs, spark=spark)
    assert res["passed"] is False and res["partitions_checked"] == PARTS
    crafted = [p for p in res["corrupt_pages"] if p["partition"] == 1]
    assert len(crafted) == MAX_LISTED + 1 and crafted[-1]["count"] == 49_999 - MAX_LISTED
    names = {p["partition"]: p["reason"] for p in res["corrupt_pages"] if p["page"] == -1}
    assert "is above 2147483647" in names[99999999999]
    assert "not the name of partition 3's file" in names[3]
    assert {d["partition"] for d in res["divergent"]} == {1}   # part-3.bin still compared alike
    assert len(json.dumps(res)) < 100_000
