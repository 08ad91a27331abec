from __future__ import annotations

import json
import os
import subprocess

import psutil
import pytest
import xxhash

from ferry.cluster_demo import Pacing, _rows, raw_sendfile_rate, source_label, value_hash


def _environ(p: psutil.Process) -> dict[str, str]:
    try:
        return p.environ()
    except (psutil.Error, OSError):
        return {}


def _run_demo(py_env, python, tmp_path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    work = tmp_path / "demo"
    r = subprocess.run([python, "-m", "ferry", "demo", "--dir", str(work), "--json", "--keep",
                        "--entries", "20000", "--partitions", "8", *extra],
                       env=py_env, capture_output=True, text=True, timeout=600)
    assert r.stdout.strip(), r.stderr
    return r, json.loads(r.stdout.strip().splitlines()[-1])


def test_a_move_names_its_source_once_known_and_says_locating_before() -> None:
    doc = {"moves": [{"cache": "default", "partition": 3, "from": None, "to": "n4", "stage": "prepare"},
                     {"cache": "default", "partition": 5, "from": "n1", "to": "n4", "stage": "transfer",
                      "bytes": 10, "bytes_total": 40}],
           "partitions": [{"cache": "default", "partition": p, "primary": f"n{p % 3 + 1}",
                           "owners": [f"n{p % 3 + 1}", "n4"], "states": {f"n{p % 3 + 1}": "OWNING"}}
                          for p in range(8)]}
    rows, settled = _rows(doc, "->")
    assert [r.label for r in rows] == ["default/3 locating (primary n1) -> n4", "default/5 n1 -> n4"]
    # the key that tracks a move across polls does not change when its source becomes known
    assert [r.key for r in rows] == ["default/3 -> n4", "default/5 -> n4"]
    assert settled == (0, 8)
    assert source_label("n2", "n1") == "n2"             # the supplier picked, not the primary
    assert source_label(None, None) == "locating"
    assert all("?" not in r.label for r in rows)


def test_pacing_records_the_joining_nodes_limits_while_its_moves_run() -> None:
    pacing = Pacing("n4")

    def adm(node: str, limit: int, rate: int) -> dict:
        return {"node": node, "protect": True, "move_limit": limit, "max_moves": 8, "transfers": limit,
                "transfer_rate_limit": rate}
    move = {"cache": "default", "partition": 1, "to": "n4"}
    pacing.see({"moves": [], "admission": [adm("n4", 8, 0)]})            # no move yet: not counted
    pacing.see({"moves": [move], "admission": [adm("n1", 8, 0), adm("n4", 1, 31_250_000)]})
    pacing.see({"moves": [move], "admission": [adm("n4", 2, 125_000_000)]})
    pacing.see({"moves": [move], "admission": [adm("n4", 4, 0)]})
    assert pacing.summary() == {"node": "n4", "polls": 3, "protect": True, "move_limit": [1, 4],
                                "max_moves": 8, "transfers": [1, 4],
                                "receive_limit_mb_per_s": [31.2, 125.0], "polls_unlimited": 1}
    assert Pacing("n5").summary() is None


def test_raw_sendfile_rate_moves_the_bytes_and_leaves_nothing(tmp_path) -> None:
    r = raw_sendfile_rate(str(tmp_path), 3 * (1 << 20) + 123)
    assert r["method"] == "raw sendfile over loopback into a file (no fsync)"
    assert r["bytes"] == 3 * (1 << 20) + 123 and r["seconds"] > 0
    assert r["mb_per_s"] == pytest.approx(r["bytes"] / r["seconds"] / 1e6, rel=0.05)
    assert list(tmp_path.iterdir()) == []


def test_the_model_holds_the_validations_value_hash() -> None:
    # validation/expected.py: value_hash = xxh64(value, seed=42) as a signed 64-bit integer
    for v in (b"", b"x" * 65536, b'{"i": 1, "city": "oslo"}'):
        h = value_hash(v)
        assert -(1 << 63) <= h < (1 << 63)
        assert h % (1 << 64) == xxhash.xxh64_intdigest(v, seed=42)


def test_cluster_demo_rebalances_a_join_under_writes(py_env, python, tmp_path) -> None:
    r, s = _run_demo(py_env, python, tmp_path, "--no-validate", "--raw-mb", "16", "--tls")
    assert r.returncode == 0, r.stderr
    assert s["flow"].startswith("3-node cluster")
    # rendezvous hashing: a 4th node takes about a quarter of the 16 primaries+backups
    assert 3 <= s["partitions_moved"] <= 14
    assert s["bytes_moved"] > 0
    # the rates: the whole rebalance over its wall time, each move over its transfer
    # stage, and the raw sendfile of this run beside them
    assert s["rebalance_mb_per_s"] == pytest.approx(s["bytes_moved"] / s["rebalance_seconds"] / 1e6,
                                                    rel=0.05, abs=0.1)
    assert 0 < s["rebalance_seconds"] <= s["seconds_join_to_settled"]
    t = s["transfer_mb_per_s"]
    assert 0 < t["min"] <= t["median"] <= t["max"] and 1 <= s["moves_at_once"] <= s["partitions_moved"]
    assert s["raw"]["bytes"] == 16_000_000 and s["raw"]["mb_per_s"] > 0
    assert s["pacing"] is None or s["pacing"]["node"] == "n4"
    assert s["writes_during_move"] > 0
    # one row per move: where from, where to, seconds per stage in the order a move takes them
    assert len(s["moves"]) == s["partitions_moved"]
    assert set(s["seconds_to_owning"]) == {m["partition"] for m in s["moves"]}
    assert s["stages"] == ["prepare", "demand", "transfer", "install", "index rebuild", "replay",
                           "checkpoint wait"]
    for m in s["moves"]:
        assert m["to"] == "n4" and m["from"] in ("n1", "n2", "n3"), m
        assert set(m["stage_seconds"]) <= set(s["stages"]) and "transfer" in m["stage_seconds"], m
        assert m["bytes"] > 0 and m["seconds_to_owning"] > 0
    assert sum(m["bytes"] for m in s["moves"]) == s["bytes_moved"]
    assert s["entries"] == 20000 and s["value_size"] == 100 and s["load_entries_per_s"] > 0
    assert s["updates_replayed"] >= 0 and s["control_plane"]["controller"] in ("n1", "n2", "n3")
    assert s["invariants_ok"] is True and all(s["invariants"].values()), s["invariants"]
    assert s["live_validation"] == {"passed": None, "skipped": "--no-validate"}
    # --tls: the nodes' links are mutual TLS, each node's config names its certificate
    assert s["node_links"] == "mutual TLS"
    work = tmp_path / "demo"
    assert "[tls]" in (work / "n4.toml").read_text()
    assert not list(work.rglob("*.delta"))
    assert {p.name for p in work.iterdir() if (p / "node.id").exists()} == {"n1", "n2", "n3", "n4"}


@pytest.mark.slow
@pytest.mark.spark
def test_demo_with_spark_validation(py_env, python, tmp_path) -> None:
    # Mark every process of this demo (the Spark JVM inherits the environment), so the
    # check below finds this demo's JVM and not one of a parallel test.
    mark = f"demo-{os.getpid()}-{tmp_path.name}"
    # the default mode: the shared secret, which the live validation authenticates with
    r, s = _run_demo(py_env | {"FERRY_TEST_MARK": mark}, python, tmp_path)
    assert r.returncode == 0, r.stderr
    assert s["node_links"] == "shared secret"
    left = [p.pid for p in psutil.process_iter() if _environ(p).get("FERRY_TEST_MARK") == mark]
    assert left == [], f"processes of the demo still running after it exited: {left}"
    # first the running cluster, while the writer writes: every partition's copies
    # fetched through the transfer agents and compared at one counter
    live = s["live_validation"]
    assert live["passed"] is True, live
    assert live["partitions_checked"] == 8 and live["entries"] > 0
    assert sorted(live["counters"]) == sorted(f"default/{p}" for p in range(8))
    assert all(isinstance(c, int) and c > 0 for c in live["counters"].values()), live["counters"]
    assert live["divergent"] == live["corrupt_pages"] == live["unchecked"] == []
    assert live["writes_during"] > 0            # the cluster kept serving the writer
    assert 0 < live["spark_start_seconds"] < live["seconds"]
    # then the stopped nodes' files, against the model, in the same Spark session
    assert s["validation"]["passed"] is True, s["validation"]
    assert s["validation"]["partitions_checked"] == 8
    assert s["validation"]["divergent"] == []
    assert s["validation"]["corrupt_pages"] == []
    assert s["validation"]["spark_start_seconds"] == 0


@pytest.mark.slow
def test_demo_output_off_a_terminal_is_plain_text(py_env, python, tmp_path) -> None:
    """Without --json and with stdout/stderr captured: steps and stage lines on stderr,
    the summary table and checklist on stdout, no escape sequences, no live display."""
    r = subprocess.run([python, "-m", "ferry", "demo", "--dir", str(tmp_path / "demo"),
                        "--no-validate", "--entries", "20000", "--partitions", "8", "--raw-mb", "16"],
                       env=py_env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "\x1b[" not in r.stdout + r.stderr
    assert "> node n4 joins; rebalancing file-based under live writes" in r.stderr
    assert "> measuring this machine's raw rate: sendfile of 16 MB over loopback into a file" in r.stderr
    assert "Moves: seconds per stage" in r.stdout
    text = " ".join(r.stdout.split())
    assert "each move's bytes over its transfer stage" in text
    assert "raw sendfile over loopback into a file (no fsync), 16.0 MB in" in text
    assert "Spark validation  skipped (--no-validate)" in r.stdout
    assert r.stdout.rstrip().splitlines()[-1].endswith("all invariants hold")


def test_demo_refuses_a_non_empty_folder(py_env, python, tmp_path) -> None:
    (tmp_path / "x").write_text("keep me")
    r = subprocess.run([python, "-m", "ferry", "demo", "--dir", str(tmp_path)], env=py_env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "not empty" in r.stderr
    assert (tmp_path / "x").read_text() == "keep me"
