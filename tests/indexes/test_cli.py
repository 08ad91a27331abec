"""``ferry index rebuild`` / ``ferry index verify``."""
from __future__ import annotations

import json
import os
import subprocess

from click.testing import CliRunner

from indexes import IndexStore
from indexes.cli import index
from pagegen import write_partition_file

from idx_helpers import doc


def _data(tmp_path) -> tuple[str, str]:
    data = tmp_path / "data"
    data.mkdir()
    for p in (0, 2):
        write_partition_file(str(data / f"part-{p}.bin"), p,
                             [(b"k%d" % i, doc(age=i % 10, email=f"e{i}")) for i in range(500)])
    return str(data), str(tmp_path / "idx")


def test_rebuild_then_verify_json(tmp_path) -> None:
    data, idx = _data(tmp_path)
    defs = tmp_path / "defs.json"
    defs.write_text(json.dumps([{"name": "email", "field": "email", "unique": True}]))
    r = CliRunner().invoke(index, ["rebuild", "--data", data, "--index", idx,
                                   "--def", "age=age:type=int", "--defs", str(defs), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert [p["partition"] for p in out["partitions"]] == [0, 2]
    assert all(p["entries"] == 1000 for p in out["partitions"])
    from indexes import accel
    assert out["value_path"] == (accel.name() or "python")
    # Definitions are stored: verify needs none.
    r = CliRunner().invoke(index, ["verify", "--data", data, "--index", idx, "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["ok"] and [p["expected"] for p in rep["partitions"]] == [1000, 1000]

    with IndexStore.open(idx) as s:                       # make the index lie
        s.apply(2, b"k1", doc(age=1, email="e1"), doc(age=9, email="e1"))
        s.apply(0, b"ghost", None, doc(age=3, email="ghost"))
    r = CliRunner().invoke(index, ["verify", "--data", data, "--index", idx, "--json",
                                   "--structure"])
    assert r.exit_code == 1
    rep = json.loads(r.output)
    p0, p2 = rep["partitions"]
    assert p0["extra_count"] == 2 and p0["extra"][0]["key"] == "ghost"
    assert p2["wrong"] == [{"index": "age", "key": "k1", "indexed": 9, "expected": 1}]
    assert rep["structure"] == []
    r = CliRunner().invoke(index, ["verify", "--data", data, "--index", idx])
    assert r.exit_code == 1 and "DIFFERS" in r.output


def test_corrupt_index_is_a_clear_error_and_reset_rebuilds(tmp_path) -> None:
    data, idx = _data(tmp_path)
    args = ["--data", data, "--index", idx]
    assert CliRunner().invoke(index, ["rebuild", *args, "--def", "age=age"]).exit_code == 0
    with open(os.path.join(idx, "data.mdb"), "r+b") as f:
        f.write(b"\xde\xad" * 8192)
    r = CliRunner().invoke(index, ["verify", *args])
    assert r.exit_code == 1 and "corrupt" in r.output and "--reset-corrupt" in r.output
    r = CliRunner().invoke(index, ["rebuild", *args, "--def", "age=age", "--reset-corrupt"])
    assert r.exit_code == 0, r.output
    assert CliRunner().invoke(index, ["verify", *args]).exit_code == 0


def test_bad_definition_and_missing_definitions(tmp_path) -> None:
    data, idx = _data(tmp_path)
    r = CliRunner().invoke(index, ["rebuild", "--data", data, "--index", idx, "--def", "nofield"])
    assert r.exit_code == 1 and "name=field.path" in r.output
    r = CliRunner().invoke(index, ["rebuild", "--data", data, "--index", idx])
    assert r.exit_code == 1 and "no index definitions" in r.output


def test_ferry_command_runs_the_group(tmp_path, py_env, python) -> None:
    data, idx = _data(tmp_path)
    r = subprocess.run([python, "-m", "ferry", "index", "rebuild", "--data", data, "--index", idx,
                        "--def", "age=age", "-p", "2"], env=py_env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "partition 2: 500 entries" in r.stderr
