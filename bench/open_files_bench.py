"""Open files budget benchmark: a store of many partitions with a small budget of open
descriptors (``PartitionStore.open(open_files=...)``, checkpoint/files.py) against the
same store with a budget above what it ever needs (every file stays open, as before
the budget existed).

Per budget, in one process per trial (trials of the two budgets alternate):
- create        ``create_partition`` of every partition (an fsynced file each)
- put           one put per partition (no checkpoint runs meanwhile), puts/s
- checkpoint    of every partition (fresh pages), then of an overwrite of each
                (in-place pages): seconds, files fsynced in groups before the end
- get (cold)    reopen the store (page memory empty), one get per partition in a
                random order: each loads its page from the file (OS cache warm), so
                with the small budget nearly every get opens the file again; then
                the same gets again, every page resident (no file touched)
- scan          every partition
- open          the reopen itself (recovery: one scan per file)
- fds           peak descriptors of the process over the one at start, sampled
                every millisecond, and the cache's own peak

usage: python bench/open_files_bench.py [--partitions N] [--budget B] [--trials T]
                                        [--wal-sync none|group]   (one JSON object)
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

UNLIMITED = 1 << 20      # a budget no run reaches: every file stays open


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class _Sampler:
    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _fds())
            time.sleep(0.001)

    def __enter__(self) -> _Sampler:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


def trial(directory: str, n: int, budget: int, wal_sync: str) -> dict:
    from checkpoint import PartitionStore
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * n + 256                   # the unlimited budget: two per partition
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    kw = dict(page_size=4096, checkpoint_interval=None, wal_sync=wal_sync, open_files=budget)
    out: dict = {"budget": budget}
    base = _fds()
    with _Sampler() as sampler:
        s = PartitionStore.open(directory, memory_budget=256 << 20, **kw)
        t = time.perf_counter()
        for p in range(n):
            s.create_partition(p)
        out["create_s"] = time.perf_counter() - t
        t = time.perf_counter()
        for p in range(n):
            s.put(p, b"key", b"v%d" % p * 20)
        out["put_per_s"] = n / (time.perf_counter() - t)
        t = time.perf_counter()
        st = s.checkpoint()
        out["checkpoint_fresh_s"] = time.perf_counter() - t
        out["checkpoint_fresh_early_fsyncs"] = st.early_fsyncs
        for p in range(n):
            s.put(p, b"key", b"w%d" % p * 20)
        t = time.perf_counter()
        st = s.checkpoint()
        out["checkpoint_inplace_s"] = time.perf_counter() - t
        out["checkpoint_files"] = st.files
        s.close()
        t = time.perf_counter()
        s = PartitionStore.open(directory, memory_budget=max(8 << 20, 2 * n * 4096), **kw)
        out["open_s"] = time.perf_counter() - t
        order = list(range(n))
        random.Random(1).shuffle(order)
        t = time.perf_counter()
        for p in order:
            s.get(p, b"key")
        out["get_cold_us"] = (time.perf_counter() - t) / n * 1e6
        t = time.perf_counter()
        for p in order:
            s.get(p, b"key")
        out["get_resident_us"] = (time.perf_counter() - t) / n * 1e6
        t = time.perf_counter()
        for p in order:
            for _ in s.scan(p):
                pass
        out["scan_us"] = (time.perf_counter() - t) / n * 1e6
        st = s.stats()
        out["cache_peak"] = st["open_files_peak"]
        out["file_opens"] = st["file_opens"]
        s.close()
    out["fds_peak_over_start"] = sampler.peak - base
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=5000)
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--wal-sync", default="none")
    ap.add_argument("--child", nargs=3, metavar=("DIR", "N", "BUDGET"))
    a = ap.parse_args()
    if a.child:
        print(json.dumps(trial(a.child[0], int(a.child[1]), int(a.child[2]), a.wal_sync)))
        return
    runs: dict[str, list[dict]] = {"small": [], "unlimited": []}
    for _ in range(a.trials):
        for name, budget in (("small", a.budget), ("unlimited", UNLIMITED)):
            d = tempfile.mkdtemp(prefix="ferry-openfiles-", dir=os.environ.get("TMPDIR", "/tmp"))
            try:
                r = subprocess.run([sys.executable, __file__, "--wal-sync", a.wal_sync,
                                    "--child", d, str(a.partitions), str(budget)],
                                   capture_output=True, text=True, check=True)
                runs[name].append(json.loads(r.stdout))
            finally:
                shutil.rmtree(d, ignore_errors=True)
    summary = {}
    for name, rs in runs.items():
        summary[name] = {k: statistics.median(r[k] for r in rs) for k in rs[0]
                         if isinstance(rs[0][k], (int, float))}
    print(json.dumps({"partitions": a.partitions, "budget": a.budget, "trials": a.trials,
                      "wal_sync": a.wal_sync, "median": summary, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
