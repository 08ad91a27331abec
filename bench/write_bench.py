"""Page write path: ``PartitionStore.apply_many(logged=False)`` (the temp-WAL replay's
apply) with the C page writer (checkpoint/_writeaccel.c) vs pure Python, in the same
run, on the same updates.

For 1 KiB values (inline entries) and 16 KiB values (overflow chains of 5 pages at
4 KiB), a store (4 KiB pages, 64 MiB page memory: the node's defaults) whose page memory
is already full (another partition: 80 MB of values, not timed) gets ``--mb`` of values as new keys in batches of 512 (``insert``), then the same keys again
with new values (``overwrite``: old entries replaced, old chains freed and their pages
reused). The background checkpointer runs as it does under a replay. C and Python
runs alternate; best and median of ``--repeat``. Reported per mode: records/s (wall),
microseconds of CPU per record in the applying thread (the write path itself; the
checkpointer's thread is not counted) and the ratios pure / C.

Prints ONE JSON object.

    python bench/write_bench.py [--quick] [--mb 96] [--repeat 5] [--dir /tmp]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from checkpoint import PartitionStore  # noqa: E402
from checkpoint import page as pg  # noqa: E402

BATCH = 512          # updates per apply_many call (the replay's batches are of this order)
BUDGET = 64 << 20    # page memory (the node's default)
# filler of page memory before each timed run: 1.25x the budget in 16 KiB values
WARM = [(b"warm:%08d" % i, bytes([i % 251]) * 16384, i + 1) for i in range(BUDGET * 5 // 4 // 16384)]


def updates(value_bytes: int, total: int, seed: int) -> list[tuple[bytes, bytes, int]]:
    rnd = random.Random(seed)
    n = max(1, total // value_bytes)
    keys = [b"user:%010d" % i for i in range(n)]
    rnd.shuffle(keys)
    return [(k, rnd.randbytes(value_bytes), 0) for k in keys]


def one_run(base: str, first: list, second: list, use_c: bool) -> dict:
    """Apply ``first`` (new keys) then ``second`` (the same keys) to a fresh store."""
    d = tempfile.mkdtemp(dir=base)
    switch = getattr(pg, "use_accelerator", None)   # absent in a checkout before it (A/B)
    if switch is not None:
        switch(use_c)
    s = PartitionStore.open(d, page_size=4096, memory_budget=BUDGET, wal_sync="none",
                            checkpoint_interval=None)
    out = {}
    try:
        # A node's page memory is full (other partitions): fill it first, so the timed
        # runs evict and reuse buffers as they would there (not time a fresh heap).
        s.apply_many(1, WARM, logged=False)
        s.checkpoint()           # its pages clean (evictable), as a node's are between loads
        s.create_partition(0)
        counter = 0
        for mode, ups in (("insert", first), ("overwrite", second)):
            t, c = time.perf_counter(), time.thread_time()
            for lo in range(0, len(ups), BATCH):
                chunk = [(k, v, counter + 1 + j) for j, (k, v, _) in enumerate(ups[lo:lo + BATCH])]
                counter += len(chunk)
                s.apply_many(0, chunk, logged=False)
            out[mode] = (time.perf_counter() - t, time.thread_time() - c)
    finally:
        s.close(checkpoint=False)
        shutil.rmtree(d, ignore_errors=True)
        if switch is not None:
            switch(True)
    return out


def measure(base: str, value_bytes: int, total: int, repeat: int, have_c: bool) -> dict:
    first = updates(value_bytes, total, 1)
    second = [(k, v[::-1], 0) for k, v, _ in first[::-1]]
    n = len(first)
    runs: dict[str, dict[str, list]] = {"c": {}, "python": {}}
    for _ in range(repeat):
        for path in (("c", "python") if have_c else ("python",)):
            for mode, (wall, cpu) in one_run(base, first, second, path == "c").items():
                runs[path].setdefault(mode, []).append((wall, cpu))
    res: dict = {"records": n, "value_bytes": value_bytes}
    for mode in ("insert", "overwrite"):
        row: dict = {}
        for path, by_mode in runs.items():
            got = by_mode.get(mode)
            if not got:
                continue
            walls, cpus = [w for w, _ in got], [c for _, c in got]
            row[path] = {"records_per_s_best": round(n / min(walls)),
                         "records_per_s_median": round(n / statistics.median(walls)),
                         "us_cpu_per_record_median": round(statistics.median(cpus) / n * 1e6, 2),
                         "mb_per_s_median": round(n * value_bytes / statistics.median(walls) / 1e6, 1)}
        if "c" in row:
            pw = statistics.median(w for w, _ in runs["python"][mode])
            cw = statistics.median(w for w, _ in runs["c"][mode])
            row["ratio_wall_median"] = round(pw / cw, 2)
            row["ratio_cpu_median"] = round(row["python"]["us_cpu_per_record_median"]
                                            / row["c"]["us_cpu_per_record_median"], 2)
        res[mode] = row
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="24 MB of values, 3 repeats")
    ap.add_argument("--mb", type=int, default=96, help="MB of values per size and mode")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the stores go (default: temp dir)")
    a = ap.parse_args()
    mb, repeat = (24, 3) if a.quick else (a.mb, a.repeat)
    have_c = getattr(pg, "_accel", None) is not None
    base = tempfile.mkdtemp(prefix="write-bench-", dir=a.dir)
    try:
        results = {f"{size >> 10}KiB": measure(base, size, mb << 20, repeat, have_c)
                   for size in (1024, 16384)}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps({"bench": "write", "quick": a.quick, "mb_per_size": mb, "repeat": repeat,
                      "page_size": 4096, "memory_budget": BUDGET, "batch": BATCH,
                      "accelerator": pg.accelerator() if have_c else None, "loadavg": os.getloadavg()[0],
                      "results": results}, indent=1))


if __name__ == "__main__":
    main()
