"""Validation benchmark: the Spark job on local[2] against a single-process Python
scan-and-digest of the same partition files, plus the job's fixed start-up cost.

Prints ONE JSON object. Data: 2 node folders x 16 partitions of cache ``bench``;
node b's files are hard links to node a's (identical replicas; the job decodes both,
so the page cache, not the disk, serves the second read in both measurements).
Entries: 100-byte values, 12-byte keys. Figures:

- ``startup_s``: session start + the first (warm-up) validation of a tiny folder;
- ``spark``: the full job (digests and owner comparison) on the big folders, in
  entries/s and MB/s of partition files read;
- ``python``: one process reads every file with ``checkpoint.pagefile.iter_entries``
  and computes the same kind of order-independent digest per file (xxh64);
- ``ratio``: Spark throughput / Python throughput (same run, same files).

    .venv/bin/python bench/validation_scan_bench.py [--quick] [--entries N] [--dir DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "validation"))  # the fast page writer

from checkpoint.pagefile import iter_entries  # noqa: E402
from validation import list_folders, validate  # noqa: E402
from validation_pages import write_partition  # noqa: E402

PARTS = 16
VALUE = 100


def build(root: str, total: int) -> list[str]:
    """Two node folders holding ``total`` entries between them."""
    a = os.path.join(root, "a", "caches", "bench")
    b = os.path.join(root, "b", "caches", "bench")
    os.makedirs(a)
    os.makedirs(b)
    per = total // 2 // PARTS
    pad = b"x" * (VALUE - 12)
    for p in range(PARTS):
        rows = ((b"k%02d-%08d" % (p, i), b"%012d" % i + pad, i + 1) for i in range(per))
        write_partition(os.path.join(a, f"part-{p}.bin"), p, rows)
        os.link(os.path.join(a, f"part-{p}.bin"), os.path.join(b, f"part-{p}.bin"))
    return [os.path.join(root, "a"), os.path.join(root, "b")]


def python_scan(dirs: list[str]) -> tuple[int, float]:
    """Single-process reference: decode every file, digest its entries."""
    import xxhash

    pack = struct.Struct("<qq?").pack
    n = 0
    t = time.perf_counter()
    for f in list_folders(dirs):
        x = s = 0
        for e in iter_entries(f.path):
            vh = 0 if e.value is None else xxhash.xxh64_intdigest(e.value, seed=42)
            h = xxhash.xxh64_intdigest(e.key + pack(vh - (1 << 63), e.counter, e.tombstone))
            x ^= h
            s += h & 0xFFFFFFFF
            n += 1
    return n, time.perf_counter() - t


def rates(n: int, nbytes: int, seconds: float) -> dict:
    return {"seconds": round(seconds, 2), "entries_per_s": round(n / seconds),
            "mb_per_s": round(nbytes / seconds / 1e6, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="500k entries")
    ap.add_argument("--entries", type=int, default=None)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    total = a.entries or (500_000 if a.quick else 5_000_000)
    root = tempfile.mkdtemp(prefix="ferry-validation-bench-", dir=a.dir)
    try:
        t = time.perf_counter()
        dirs = build(root, total)
        tiny = os.path.join(root, "tiny")
        os.makedirs(tiny)
        write_partition(os.path.join(tiny, "part-0.bin"), 0, [(b"k", b"v", 1)])
        build_s = time.perf_counter() - t
        nbytes = sum(f.size for f in list_folders(dirs))

        from validation.session import start
        t = time.perf_counter()
        spark = start("local[2]")
        validate([tiny], spark=spark)
        startup = time.perf_counter() - t
        try:
            t = time.perf_counter()
            res = validate(dirs, spark=spark)
            spark_s = time.perf_counter() - t
        finally:
            spark.stop()
        assert res["passed"], res
        n_py, py_s = python_scan(dirs)
        assert n_py == res["entries"], (n_py, res["entries"])
        out = {
            "bench": "validation", "entries": res["entries"], "bytes": nbytes,
            "partitions": res["partitions_checked"], "files": 2 * PARTS,
            "master": "local[2]", "build_s": round(build_s, 1),
            "startup_s": round(startup, 2),
            "spark": rates(res["entries"], nbytes, spark_s),
            "python": rates(n_py, nbytes, py_s),
            "ratio": round(py_s / spark_s, 2),
            "load_avg_1m": round(os.getloadavg()[0], 1),
        }
        print(json.dumps(out))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
