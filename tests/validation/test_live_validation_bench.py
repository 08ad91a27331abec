"""The live validation benchmark's own figures hold together (bench/validation_bench.py
--quick: real node processes, real local Spark): what docs/benchmarks.md quotes comes
out of this script, so its bookkeeping is tested, not its speed."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [pytest.mark.slow, pytest.mark.spark]


def test_quick_run_reports_consistent_figures(tmp_path) -> None:
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "validation_bench.py"), "--quick",
                          "--idle-seconds", "2", "--dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["entries"] == doc["mib"] * 1024 * 1024 // doc["value_size"]
    runs = [doc["live"], doc["live_under_writes"], doc["folder"]]
    # the same data each time: every key on both copies, every partition checked
    for r in runs:
        assert r["entries"] == doc["copies"] * doc["entries"] and r["partitions"] == doc["partitions"]
        assert r["bytes"] > doc["copies"] * doc["entries"] * doc["value_size"]
        # (the JSON rounds: seconds to 0.01, rates to 0.1)
        assert r["mb_per_s"] == pytest.approx(r["bytes"] / r["seconds"] / 1e6, rel=0.02, abs=0.1)
    assert doc["ratio_live_over_folder_s"] == pytest.approx(
        doc["live"]["seconds"] / doc["folder"]["seconds"], rel=0.02)
    # live runs name the counters they compared at; the writers moved them on in between
    lo, hi = doc["live"]["counters"]
    lo2, hi2 = doc["live_under_writes"]["counters"]
    assert 0 < lo <= hi and lo2 <= hi2 and hi2 > hi
    w = doc["writers"]
    for phase in ("idle", "during"):
        v = w[phase]
        assert v["puts"] > 0 and v["p50_ms"] <= v["p99_ms"] <= v["max_ms"]
        assert v["puts_per_s"] == pytest.approx(v["puts"] / v["seconds"], rel=0.02)
    # the "during" window is the live validation under writes
    assert w["during"]["seconds"] == pytest.approx(doc["live_under_writes"]["seconds"], abs=0.05)
    assert w["ratio_during_over_idle"]["p99_ms"] == pytest.approx(
        w["during"]["p99_ms"] / w["idle"]["p99_ms"], rel=0.02)
    assert "live / folder seconds" in out.stderr and "during / idle" in out.stderr
