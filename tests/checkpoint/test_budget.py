"""Page memory stays within its budget for a partition ten times larger than it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from checkpoint import PartitionStore
from checkpoint.memory import MIN_PAGES

# Beside page memory and the key index: scan / checkpoint batches (1/32 of the budget),
# page bookkeeping, C-heap slack.  Measured ~0.4 MiB with a 2 MiB budget (the baseline
# is an empty store already open; docs/benchmarks.md, `bench/rss_probe.py`).
FIXED_OVERHEAD = 2 << 20
# the probe is a bench helper (bench/checkpoint_bench.py runs it too), not part of checkpoint/
PROBE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                     "bench", "rss_probe.py")


@pytest.mark.slow
def test_partition_ten_times_the_budget_keeps_rss_near_budget(tmp_path, py_env) -> None:
    # 20x rather than 10x so that "not cached" below stays meaningful next to the
    # fixed overhead, which does not shrink with the budget
    budget, data = 2 << 20, 40 << 20
    out = subprocess.run([sys.executable, PROBE, str(tmp_path / "s"),
                          str(budget), str(data), "900"],
                         env=py_env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["file_bytes"] >= 10 * budget and r["scanned"] == r["entries"]
    assert r["memory"]["resident_pages"] <= r["memory"]["capacity_pages"]
    assert r["memory"]["evictions"] > 0
    growth = r["peak_rss"] - r["baseline_rss"]
    # the per-key index is allowed (O(keys), counted, documented) but compact
    assert r["index_bytes"] <= 43 * r["entries"], json.dumps(r)
    assert growth < 1.5 * budget + r["index_bytes"] + FIXED_OVERHEAD, json.dumps(r)
    assert growth < 0.8 * r["file_bytes"], json.dumps(r)   # the partition is not cached


def test_writers_wait_instead_of_exceeding_dirty_limit(tmp_path) -> None:
    s = PartitionStore.open(str(tmp_path / "s"), page_size=1024, memory_budget=MIN_PAGES * 1024,
                            checkpoint_interval=None, wal_sync="none")
    peak = 0
    for i in range(5000):
        s.put(0, b"k%d" % i, bytes(300))
        peak = max(peak, s.mem.pressure, len(s.mem.pages))
    assert peak <= MIN_PAGES + 2          # a put may add a page or two past the wait line
    assert s.last_stats is not None       # pressure checkpoints ran in the background
    assert sum(1 for _ in s.scan(0)) == 5000
    s.close()
