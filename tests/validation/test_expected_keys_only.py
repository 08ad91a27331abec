"""``--expected`` rows of ``key, value`` without a partition column: the partition is
derived with the cluster's own function (``node.partition_of``)."""
from __future__ import annotations

import json

import pytest

from node import partition_of
from validation import ExpectedFileError, validate
from validation_pages import write_node

pytestmark = pytest.mark.spark

PARTS = 4


def _folders(tmp_path, keys: int = 300) -> tuple[list[str], dict[str, str]]:
    """Two nodes holding keys placed by partition_of; returns (dirs, the data)."""
    data = {f"user-{i}": f"value-{i}" for i in range(keys)}
    parts: dict[int, list[tuple[bytes, bytes, int]]] = {p: [] for p in range(PARTS)}
    for k, v in data.items():
        p = partition_of(k.encode(), PARTS)
        parts[p].append((k.encode(), v.encode(), len(parts[p]) + 1))
    dirs = [write_node(str(tmp_path / n), "users", parts, node_id=n) for n in ("a", "b")]
    return dirs, data


def _expected(path, rows: dict[str, str | None]) -> str:
    with open(path, "w") as f:
        for k, v in rows.items():
            f.write(json.dumps({"key": k, "value": v}) + "\n")
    return str(path)


def test_rows_without_partition_are_placed_by_the_clusters_function(spark, tmp_path) -> None:
    dirs, data = _folders(tmp_path)
    res = validate(dirs, spark=spark, expected=_expected(tmp_path / "exp.jsonl", data))
    assert res["passed"], res
    assert res["expected"]["rows"] == len(data)
    wrong = dict(data, **{"user-7": "not-this"})
    res = validate(dirs, spark=spark, expected=_expected(tmp_path / "exp2.jsonl", wrong))
    assert not res["passed"]
    assert res["expected"]["wrong"] == 2          # on both owners
    kinds = {(x["kind"], x["key"], x["partition"]) for x in res["expected"]["examples"]}
    assert kinds == {("wrong", "user-7", partition_of(b"user-7", PARTS))}


def test_partition_count_given_explicitly(spark, tmp_path) -> None:
    dirs, data = _folders(tmp_path)
    # a wrong count places keys in the wrong partitions: every key is missing somewhere
    res = validate(dirs, spark=spark, expected=_expected(tmp_path / "e.jsonl", data), partitions=7)
    assert not res["passed"] and res["expected"]["missing"] > 0
    res = validate(dirs, spark=spark, expected=_expected(tmp_path / "e.jsonl", data),
                   partitions={"users": PARTS})
    assert res["passed"], res


def test_rows_of_an_unknown_cache_are_an_error(spark, tmp_path) -> None:
    dirs, _ = _folders(tmp_path)
    path = tmp_path / "e.jsonl"
    path.write_text(json.dumps({"cache": "nope", "key": "k", "value": "v"}) + "\n")
    with pytest.raises(ExpectedFileError, match="cache 'nope'"):
        validate(dirs, spark=spark, expected=str(path))
