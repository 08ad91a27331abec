"""``Model.expected_file()`` writes what ``ferry validate --expected`` reads: key,
partition (as the nodes place keys), value (null = removed), cache; keys in doubt are
left out. The slow test feeds a real run's file and data directories to the Spark job."""
from __future__ import annotations

import glob
import json
import os

import pytest

from node.assignment import partition_of

import dataclasses

from cluster_sim import WorkloadSpec, load_scenario, run
from cluster_sim.workload import Model, Op


def test_expected_file_has_the_columns_the_validator_reads(tmp_path) -> None:
    m = Model()
    m.ack(Op(0, 0, b"a", b'{"v":1}'))
    m.ack(Op(0, 1, b"b", b'{"v":2}'))
    m.ack(Op(0, 2, b"b", None))                 # removed: must be absent
    m.ack(Op(0, 3, b"c", b'{"v":3}'))
    m.unsure(Op(0, 4, b"c", b'{"v":4}'))        # in doubt: left out
    path = str(tmp_path / "expected.jsonl")
    assert m.expected_file(path, 8, cache="default") == 2
    rows = [json.loads(line) for line in open(path)]
    assert rows == [
        {"key": "a", "partition": partition_of(b"a", 8), "value": '{"v":1}', "cache": "default"},
        {"key": "b", "partition": partition_of(b"b", 8), "value": None, "cache": "default"},
    ]
    m.expected_file(path, 8)                    # no cache: the column is left out
    assert "cache" not in json.loads(open(path).readline())


def test_run_writes_the_expected_file_of_its_model(tmp_path) -> None:
    s = dataclasses.replace(load_scenario("join"), events=(), roles={},
                            workload=WorkloadSpec(ops=40))
    path = str(tmp_path / "exp.jsonl")
    res = run(s, seed=5, workdir=str(tmp_path), expected=path)
    assert res.passed, res.problems
    rows = [json.loads(line) for line in open(path)]
    assert len(rows) == len({r["key"] for r in rows}) > 0
    assert all(r["partition"] == partition_of(r["key"].encode(), 8) and r["cache"] == "default"
               for r in rows)


pyspark = pytest.importorskip("pyspark", reason="pyspark is needed for the Spark validator")


@pytest.mark.slow
def test_spark_validator_accepts_a_run_and_its_expected_file(tmp_path) -> None:
    from validation import validate
    path = str(tmp_path / "exp.jsonl")
    res = run(load_scenario("join"), seed=3, workdir=str(tmp_path), keep=True, expected=path)
    assert res.passed, res.problems
    dirs = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(res.dir, "data", "*", "node.id")))
    assert len(dirs) == 3
    out = validate(dirs, master="local[1]", expected=path)
    assert out["expected"]["rows"] == sum(1 for _ in open(path))
    assert {k: out["expected"][k] for k in ("missing", "wrong", "extra")} == \
        {"missing": 0, "wrong": 0, "extra": 0}, out["expected"]["examples"]
