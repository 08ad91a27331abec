"""The restart benchmarks' bookkeeping (bench/restart_bench.py, and the delta and store
reopen benches it points to): the foreground windows it reports are computed from the
writers' own acknowledgements, and a bad ``--rebalance`` setting is refused before any
cluster starts."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from restart_bench import writes_window  # noqa: E402


def test_a_window_counts_only_the_puts_that_ended_in_it() -> None:
    # 100 puts ending at t = 10.00 .. 10.99, latencies 1 .. 100 ms; one outside each end
    lat = [(10.0 + i / 100, (i + 1) / 1000) for i in range(100)] + [(9.99, 5.0), (11.0, 7.0)]
    w = writes_window(lat, 10.0, 11.0)
    assert w["puts"] == 100
    assert w["puts_per_s"] == 100.0
    assert w["p50_ms"] == 51.0 and w["p99_ms"] == 100.0 and w["max_ms"] == 100.0


def test_an_empty_window_says_so() -> None:
    assert writes_window([(1.0, 0.5)], 2.0, 3.0) == {"puts": 0, "puts_per_s": 0.0}


def test_a_setting_without_a_value_is_refused_before_any_cluster_starts() -> None:
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "restart_bench.py"),
                          "--rebalance", "protect"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "--rebalance 'protect': expected KEY=VALUE" in out.stderr


def test_the_delta_bench_fetches_every_way_and_reports_them(tmp_path) -> None:
    import json
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "delta_bench.py"), "--dir",
                          str(tmp_path), "--entries", "1500", "--changed", "10", "--rounds", "3"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    assert [r["way"] for r in doc["rounds"]] == ["copy", "clone", "adopt"]
    for r in doc["rounds"]:
        assert r["mode"] == "delta" and 1 <= r["pages_sent"] <= 2 * 10 + 1, r
        assert r["seconds"] > 0 and r["write_bytes"] >= 0
        assert r["device_write_bytes"] >= -1      # -1: no block device under --dir (tmpfs)
    keys = {"seconds", "cpu_seconds", "device_write_bytes", "write_bytes", "pages_sent"}
    assert set(doc["copy"]) == set(doc["clone"]) == set(doc["adopt"]) == keys
    assert os.listdir(tmp_path) == []            # its stores are removed


def test_the_reopen_bench_measures_both_ways_on_one_store(tmp_path) -> None:
    import json
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "store_reopen_bench.py"),
                          "--dir", str(tmp_path), "--partitions", "3", "--entries", "3000",
                          "--checkpoint-every", "500", "--after", "40", "--changed", "20",
                          "--rounds", "2"], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    rec, snap = r["recovery"], r["snapshot_open"]
    assert rec["hint_lsn"] and rec["wal_bytes_kept"] > 0
    assert len(rec["seconds"]["hint"]) == len(rec["seconds"]["no_hint"]) == 2
    assert len(snap["seconds"]["flush"]) == len(snap["seconds"]["checkpoint"]) == 2
    # the flush writes its own partition's pages; the reference every partition's
    assert max(snap["pages_written"]["flush"]) < min(snap["pages_written"]["checkpoint"])
    assert os.listdir(tmp_path) == []                # its stores are removed
