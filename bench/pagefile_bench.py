"""Page decoder accelerator: the C bulk path (checkpoint/_pageaccel.c) vs the pure-Python
decoder of checkpoint/pagefile.py, in the same run, on the same files.

Two partition files written by a real ``PartitionStore`` (puts, one checkpoint): 1 KiB
values (inline entries) and 64 KiB values (overflow chains of 17 pages at 4 KiB). For
each, interleaved pure/accelerated, best and median of ``--repeat`` runs of:

- ``page_keys``: ``iter_page_keys`` (the install-time key scan of ``Partition._scan``),
- ``live``: ``iter_live_batches`` consumed whole (the index rebuild's scan),
- ``check``: ``check_pages`` over the whole file already in memory (the page check a
  receiver can run on what it got), reported without the file read.

The files are in the page cache (read once before timing), so the figures are CPU
cost. Prints ONE JSON object; ratios are pure seconds / accelerated seconds.

    python bench/pagefile_bench.py [--quick] [--mb 64] [--repeat 5]
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

from checkpoint import accel as switch  # noqa: E402
from checkpoint import PartitionStore, pagefile  # noqa: E402


def build(path: str, value_bytes: int, total: int) -> int:
    """A partition of ``total`` bytes of values written by a real store; returns entries."""
    d = path + ".store"
    s = PartitionStore.open(d, wal_sync="none", checkpoint_interval=None,
                            memory_budget=128 << 20)
    rnd = random.Random(value_bytes)
    n = max(1, total // value_bytes)
    try:
        s.create_partition(1)
        for i in range(n):
            s.put(1, b"user:%010d" % i, rnd.randbytes(value_bytes))
        s.checkpoint()
        shutil.copyfile(s.partition_path(1), path)
    finally:
        s.close()
        shutil.rmtree(d, ignore_errors=True)
    return n


def page_keys(path: str) -> int:
    return sum(len(keys) for _i, _t, _u, keys in pagefile.iter_page_keys(path))


def live(path: str) -> int:
    return sum(len(b) for b in pagefile.iter_live_batches(path))


def check(data: bytes, ps: int) -> int:
    bad, _reason = pagefile.check_pages(data, 0, ps)
    assert bad is None
    return len(data) // ps


def timed(fn, accel) -> tuple[float, int]:
    saved = switch.page
    switch.page = accel
    try:
        t = time.perf_counter()
        got = fn()
        return time.perf_counter() - t, got
    finally:
        switch.page = saved


def measure(path: str, repeat: int, accel) -> dict:
    size = os.path.getsize(path)
    mb = size / 1e6
    with open(path, "rb") as f:
        data = f.read()
    ps = pagefile.read_meta(path).page_size
    ops = {"page_keys": lambda: page_keys(path), "live": lambda: live(path),
           "check": lambda: check(data, ps)}
    out: dict = {"file_mb": round(mb, 1), "page_size": ps}
    for name, fn in ops.items():
        times: dict[str, list[float]] = {"pure": [], "accel": []}
        counts = set()
        for _ in range(repeat):                       # interleaved: same minutes, same load
            for mode, mod in (("pure", None), ("accel", accel)):
                dt, got = timed(fn, mod)
                times[mode].append(dt)
                counts.add(got)
        assert len(counts) == 1, f"{name}: pure and accelerated counts differ: {counts}"
        row: dict = {"items": counts.pop()}
        for mode in ("pure", "accel"):
            best, med = min(times[mode]), statistics.median(times[mode])
            row[f"{mode}_best_s"] = round(best, 4)
            row[f"{mode}_median_s"] = round(med, 4)
            row[f"{mode}_mb_s"] = round(mb / best, 1)
        row["ratio_best"] = round(min(times["pure"]) / min(times["accel"]), 2)
        row["ratio_median"] = round(statistics.median(times["pure"]) /
                                    statistics.median(times["accel"]), 2)
        out[name] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="16 MB partitions, 3 repeats")
    ap.add_argument("--mb", type=int, default=64, help="size of each partition's values")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the partition files go (default: tmp)")
    args = ap.parse_args()
    mb, repeat = (16, 3) if args.quick else (args.mb, args.repeat)
    accel = switch.page
    if accel is None:
        print(json.dumps({"error": "checkpoint._pageaccel is not built or FERRY_PAGE_ACCEL=0"}))
        sys.exit(2)
    work = tempfile.mkdtemp(prefix="pagefile-bench-", dir=args.dir)
    result: dict = {"bench": "pagefile", "quick": args.quick, "accelerator": pagefile.accelerator(),
                    "loadavg_start": os.getloadavg()[0], "partitions": {}}
    try:
        for label, vbytes in (("values_1k", 1024), ("values_64k", 65536)):
            path = os.path.join(work, f"part-{vbytes}.bin")
            t = time.perf_counter()
            n = build(path, vbytes, mb << 20)
            row = {"entries": n, "build_s": round(time.perf_counter() - t, 2)}
            row.update(measure(path, repeat, accel))
            result["partitions"][label] = row
            os.unlink(path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["loadavg_end"] = os.getloadavg()[0]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
