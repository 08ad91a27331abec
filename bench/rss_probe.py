"""Peak-RSS probe for a partition much larger than the page-memory budget (used by
the budget test and the benchmark; run in a fresh process so the peak is its own).

usage: python bench/rss_probe.py DIR BUDGET_BYTES DATA_BYTES VALUE_SIZE
(with the checkout on PYTHONPATH)
prints one JSON object.
"""
from __future__ import annotations

import json
import random
import resource
import sys
import time


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _peak_rss() -> int:
    """This process's own RSS high-water mark (VmHWM). Not ``ru_maxrss``: Linux carries
    ru_maxrss across exec, so a probe started from a big parent (a pytest worker that
    ran Spark tests) would report the parent's peak as its own."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main() -> None:
    directory, budget, data, vsize = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    from checkpoint import PartitionStore
    import_rss = _rss_now()
    s = PartitionStore.open(directory, memory_budget=budget, checkpoint_interval=None,
                            wal_sync="none", wal_segment_size=8 << 20)
    # The baseline is the interpreter with an EMPTY store open (its modules imported,
    # its WAL and checkpointer thread started): what remains is what grows with the
    # data - page memory (O(budget)), the key index (O(keys)) and transient buffers.
    base = _rss_now()
    n = data // vsize
    value = bytes(vsize)
    t0 = time.perf_counter()
    for i in range(n):
        s.put(0, b"key-%012d" % i, value)
    t_put = time.perf_counter() - t0
    s.checkpoint()
    rnd = random.Random(1)
    for _ in range(5000):
        assert s.get(0, b"key-%012d" % rnd.randrange(n)) == value
    t0 = time.perf_counter()
    scanned = sum(1 for _ in s.scan(0))
    t_scan = time.perf_counter() - t0
    stats = s.stats()
    index_bytes = s.parts[0].index.nbytes     # the whole key index (two flat arrays)
    file_bytes = s.parts[0].page_count * s.page_size
    s.close()
    peak = _peak_rss()
    print(json.dumps({"budget": budget, "file_bytes": file_bytes, "entries": n,
                      "scanned": scanned, "import_rss": import_rss, "baseline_rss": base, "peak_rss": peak,
                      "index_bytes": index_bytes, "puts_per_s": n / t_put,
                      "scan_entries_per_s": scanned / t_scan, "memory": stats}))


if __name__ == "__main__":
    main()
