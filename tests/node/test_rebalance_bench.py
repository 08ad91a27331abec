"""The rebalance benchmark's own figures hold together (bench/rebalance_bench.py
--quick, both modes, real node processes): what docs/benchmarks.md quotes comes out of
this script, so its bookkeeping is tested, not only its speed."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.slow


def test_quick_run_reports_consistent_figures(tmp_path):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "rebalance_bench.py"), "--quick",
                          "--replay-writers", "2", "--dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["data_bytes"] == doc["entries"] * doc["value_size"]
    for mode in ("files", "messages"):
        for phase in ("join_idle", "join_under_writes"):
            j = doc[mode][phase]
            assert j["partitions_moved"] > 0 and j["bytes_moved"] > 0
            # one timeline row per move of this join, each inside the measured window
            assert len(j["timeline"]) == j["partitions_moved"]
            assert j["timeline"][0]["start"] == 0.0
            assert all(0 <= r["start"] <= r["end"] <= j["seconds_from_join"] + 0.01 for r in j["timeline"])
            assert j["seconds_per_move_max"] <= j["seconds_from_join"] + 0.01
            # the nodes' own OWNING stamps end no later than the status poll saw it settled
            assert j["seconds_from_join"] <= j["seconds_from_join_polled"] + 0.01
            assert j["seconds_from_join_polled"] <= j["seconds_to_owning"] + 0.01
            # stage means are over this join's moves: every stage a move of it went through
            assert set(j["stage_seconds_mean"]) <= set().union(*(r["stage_seconds"] for r in j["timeline"]))
            # the joining node's protection gauges over the join: [t, level, moves, rate limit]
            prot = j["protection"]
            ts = [x[0] for x in prot["samples"]]
            assert ts == sorted(ts) and all(len(x) == 4 and x[2] >= 0 and x[3] >= 0 for x in prot["samples"])
            assert 0 <= prot["seconds_paced"] <= len(ts) * 0.25 + 1e-9
            # the node takes over a second to start: its gauges were read at least once
            assert prot["samples"] and prot["level_max"] > 0
        assert doc[mode]["join_under_writes"]["writes_during_move"] > 0
    for phase in ("join_idle", "join_under_writes"):
        r = doc["ratios"][phase]
        f, m = doc["files"][phase], doc["messages"][phase]
        assert r["time_from_join_messages_over_files"] == round(
            m["seconds_from_join"] / f["seconds_from_join"], 2)
    rp = doc["files"]["replay_one_partition"]
    assert rp["writes"] > 0 and rp["moves_with_buffered_updates"] == 1
    assert rp["replayed"] <= rp["buffered"]


def test_repeat_reports_medians_of_interleaved_runs(tmp_path):
    # four clusters: the smallest data that still moves partitions in both joins (what
    # is checked here is how runs are ordered and combined, not what they measure)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "rebalance_bench.py"), "--quick",
                          "--repeat", "2", "--replay-writers", "0", "--entries", "200",
                          "--value-size", "1024", "--partitions", "8", "--dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["repeat"] == 2
    # interleaved: files 1, messages 1, files 2, ...
    order = [ln.split()[2] + ln.split()[4] for ln in out.stderr.splitlines() if ln.startswith("rebalance bench:")]
    assert order == ["files1/2", "messages1/2", "files2/2", "messages2/2"]
    for mode in ("files", "messages"):
        runs = doc["runs"][mode]
        assert len(runs) == 2
        for phase in ("join_idle", "join_under_writes"):
            for k in ("seconds_from_join", "cpu_demander_s", "bytes_moved"):
                assert doc[mode][phase][k] == round(statistics.median(r[phase][k] for r in runs), 2)
    f, m = doc["files"]["join_idle"], doc["messages"]["join_idle"]
    assert doc["ratios"]["join_idle"]["time_from_join_messages_over_files"] == round(
        m["seconds_from_join"] / f["seconds_from_join"], 2)
