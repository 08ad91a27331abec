"""Index rebuild throughput against per-entry write transactions and a bare scan.

One run, same machine, same data: a partition file of N entries with ~100-byte JSON
values and one index on an int field.

* ``scan``: read the partition file the way a rebuild does
  (``PartitionFileSource.scan_batches``: checkpoint.pagefile.iter_live_batches),
  nothing else; ``scan_entries``: the same file through ``pagefile.iter_entries``
  (one Entry tuple per entry, what other consumers use).
* ``scan_parse``: the scan plus the index work of the scan stage (JSON parse, field,
  key encoding) into a plain list: no sort, no LMDB.
* ``rebuild``: ``IndexStore.rebuild`` from the same file (scan + parse + sort + bulk
  load + ready marker), sort memory limited to 32 MiB, default ``workers`` (a second
  process only while a CPU is idle, see indexes/scanworker.py); ``rebuild_2proc``:
  the same with the scan forced onto two processes.
* ``rebuild_in_memory``: the same rebuild from an in-memory source: the index's own
  work without the file decoding.
* ``per_entry_txn``: ``IndexStore.apply`` of the same entries, one synced LMDB commit
  each (what maintaining the index entry by entry costs); timed on a sample, since at
  ~1 ms per commit the full N would take many minutes.
* peak RSS of a rebuild of N and of N/10 entries (each measured in its own process)
  shows the memory bound does not grow with the partition.

Every measure reports wall-clock rate and CPU-time rate (``process_time``): on a
shared, loaded machine the CPU rate is what the code costs, the wall rate what it got.
Shares (``time_split``) are of the rebuild's wall time.

``--value-size B`` (default 100): values of ~B bytes. Values too big to sit inline
(e.g. 65536, a move of a partition of 64 KiB JSON documents) go to overflow chains;
that file is written by a real ``PartitionStore`` (puts, then a checkpoint), so its
chains are laid out as a checkpoint lays them out, and N defaults to 4,000 (~256 MiB;
``--quick``: 1,000). Rates are also given in MB/s of value bytes (``*_mb_per_s``).
``install``: ``PartitionStore.install_partition`` of the file (its key-index scan).

Prints one JSON object. ``--quick``: N = 100,000 (< 30 s).

``--accel``: instead, the rebuild's per-value work with the C accelerator
(indexes/_ixaccel.c) against the pure-Python path (``FERRY_INDEX_ACCEL=0``) in the same
run, for 1 KiB and 16 KiB documents shaped like the cluster's
(ferry/localcluster.py ``value_of``: ``{"i", "city", "pad"}``) and one index on the
top-level field "city". Per size and path, each in its own process, alternated
(py, c, py, c) and the best CPU time of the two kept: ``feed`` (``feed_many`` over
the file's batches, already read) and ``rebuild`` (``IndexStore.rebuild`` from the
partition file in one process: scan + feed + sort + load), in microseconds per entry,
and the ratios python/c. N: 200,000 and 20,000 (``--quick``: 30,000 and 3,000).

``--load``: instead, the rebuild's sort + load stage, same documents and
sizes, with one index on "city" (``plain``) and with a unique index on "i" added
(``unique``). Per case, each in its own process, alternated, best of two:
``memory`` (the default budget: all keys in memory, one sort, putmulti streamed
from the buffer), ``external`` (a 1 MiB budget: sorted runs spilled and merged) and,
with ``--base DIR`` (a checkout whose ``indexes`` package is the code to compare
with, e.g. a ``git worktree`` of the previous commit), ``base`` (that code, default
budget). Per entry of the source: ``rebuild_us`` (CPU of the whole rebuild) and
``load_us`` (wall time of the load stage: sort + merge + LMDB), and ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

VALUE_BYTES = 100
CITIES = ["Oslo", "Lima", "Pune", "Kyiv", "Quito", "Accra", "Hanoi", "Perth"]
SORT_MEMORY = 32 << 20          # --quick: 4 MiB, so that its rebuild spills runs too


def value(i: int, rnd: random.Random) -> bytes:
    d = {"id": i, "name": f"user-{i:08d}", "age": rnd.randrange(100), "city": rnd.choice(CITIES),
         "pad": ""}
    raw = json.dumps(d, separators=(",", ":"))
    d["pad"] = "x" * max(0, VALUE_BYTES - len(raw))
    return json.dumps(d, separators=(",", ":")).encode()


def set_value_size(n: int) -> None:
    global VALUE_BYTES
    VALUE_BYTES = n


def write_store_file(path: str, partition: int, it) -> None:
    """A partition file with overflow chains, written by a real store (put + checkpoint)."""
    from checkpoint import PartitionStore
    d = path + ".store"
    s = PartitionStore.open(d, wal_sync="none", checkpoint_interval=None,
                            memory_budget=64 << 20)
    try:
        s.create_partition(partition)
        for k, v in it:
            s.put(partition, k, v)
        s.checkpoint()
        shutil.copyfile(s.partition_path(partition), path)
    finally:
        s.close()
        shutil.rmtree(d, ignore_errors=True)


def items(n: int, seed: int = 7):
    rnd = random.Random(seed)
    for i in range(n):
        yield b"user:%010d" % i, value(i, rnd)


def definitions():
    from indexes import IndexDefinition
    return [IndexDefinition("age", "age", type="int")]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# -- child measurements (one process each, so peak RSS belongs to one activity) ------
def child(kind: str, work: str, n: int, sample: int, sort_memory: int) -> dict:
    from indexes import EMPTY, IndexStore, MemorySource, PartitionFileSource
    data = os.path.join(work, "data")
    idx = os.path.join(work, f"idx-{kind}")
    shutil.rmtree(idx, ignore_errors=True)
    if kind == "baseline":
        with IndexStore.open(idx, definitions()):
            pass
        return {"peak_rss_mb": peak_rss_mb()}
    if kind == "install":
        from checkpoint import PartitionStore
        d = os.path.join(work, "install-store")
        shutil.rmtree(d, ignore_errors=True)
        s = PartitionStore.open(d, wal_sync="none", checkpoint_interval=None)
        try:
            src = os.path.join(work, "install.bin")
            shutil.copyfile(os.path.join(data, "part-0.bin"), src)
            t, c = time.perf_counter(), time.process_time()
            s.install_partition(0, src)
            el, cpu = time.perf_counter() - t, time.process_time() - c
        finally:
            s.close()
            shutil.rmtree(d, ignore_errors=True)
        return {"entries": n, "seconds": el, "rate": n / el, "cpu_rate": n / cpu}
    if kind in ("scan", "scan_entries", "scan_parse"):
        src = PartitionFileSource(data)
        with IndexStore.open(idx, definitions()) as s:
            t, c = time.perf_counter(), time.process_time()
            if kind == "scan":
                count = sum(len(b) for b in src.scan_batches(0))
            elif kind == "scan_entries":
                count = sum(1 for _ in src.scan(0))
            else:
                keys: list[bytes] = []
                count = sum(s.indexer.feed_many(b, keys.append, lambda k, d: None,
                                                lambda pk, bad: None)
                            for b in src.scan_batches(0))
            el, cpu = time.perf_counter() - t, time.process_time() - c
        return {"entries": count, "seconds": el, "rate": count / el, "cpu_rate": count / cpu,
                "peak_rss_mb": peak_rss_mb()}
    if kind in ("rebuild", "rebuild_small", "rebuild_2proc"):
        from indexes import scanworker
        p = 1 if kind == "rebuild_small" else 0
        # rebuild / rebuild_small: the default (workers=None: a second process only
        # for a file of 16 MiB or more while a CPU is idle); rebuild_2proc: the scan
        # forced onto 2 processes.
        workers = 2 if kind == "rebuild_2proc" else None
        shared = scanworker.plan(PartitionFileSource(data), p, workers)
        with IndexStore.open(idx, definitions()) as s:
            t, c = time.perf_counter(), time.process_time()
            res = s.rebuild(p, PartitionFileSource(data), memory_limit=sort_memory,
                            workers=workers)
            el, cpu = time.perf_counter() - t, time.process_time() - c
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu += kids.ru_utime + kids.ru_stime
        return {"entries": res.scanned, "seconds": el, "rate": res.scanned / el,
                "cpu_rate": res.scanned / cpu, "runs": res.runs, "peak_rss_mb": peak_rss_mb(),
                "worker_peak_rss_mb": kids.ru_maxrss / 1024.0,
                "processes": shared[2] if shared else 1}
    if kind == "rebuild_in_memory":
        src = MemorySource({0: dict(items(n))})
        with IndexStore.open(idx, definitions()) as s:
            t, c = time.perf_counter(), time.process_time()
            res = s.rebuild(0, src, memory_limit=sort_memory)
            el, cpu = time.perf_counter() - t, time.process_time() - c
        return {"entries": res.scanned, "seconds": el, "rate": res.scanned / el,
                "cpu_rate": res.scanned / cpu, "runs": res.runs}
    if kind == "per_entry_txn":
        with IndexStore.open(idx, definitions()) as s:
            s.rebuild(0, EMPTY)
            batch = list(items(sample))
            t = time.perf_counter()
            for k, v in batch:
                s.apply(0, k, None, v)
            el = time.perf_counter() - t
        return {"entries": sample, "seconds": el, "rate": sample / el}
    if kind == "accel":
        return accel_child(work)
    raise SystemExit(f"unknown child {kind}")


# -- --accel: C vs pure Python per-value work ----------------------------------------
ACCEL_SIZES = (1024, 16384)


def accel_child(work: str) -> dict:
    """feed and rebuild CPU microseconds per entry on ``work/data/part-0.bin`` with the
    accelerator the environment selects (FERRY_INDEX_ACCEL)."""
    from indexes import IndexDefinition, IndexStore, PartitionFileSource, accel
    src = PartitionFileSource(os.path.join(work, "data"))
    batches = list(src.scan_batches(0))
    n = sum(len(b) for b in batches)
    defs = [IndexDefinition("by_city", "city")]
    idx = os.path.join(work, "idx-accel")
    shutil.rmtree(idx, ignore_errors=True)
    with IndexStore.open(idx, defs) as s:
        keys: list[bytes] = []
        c = time.process_time()
        for b in batches:
            s.indexer.feed_many(b, keys.append, lambda k, d: None, lambda pk, bad: None)
        feed = time.process_time() - c
        del batches, keys
        c = time.process_time()
        res = s.rebuild(0, src, workers=1)
        rebuild = time.process_time() - c
        assert res.scanned == n and res.entries == n and res.bad == 0, res
        path = "c" if s.indexer.accelerated else "python"
    assert path == (accel.name() or "python")
    return {"entries": n, "path": path, "feed_us": feed / n * 1e6, "rebuild_us": rebuild / n * 1e6}


def accel_main(quick: bool) -> dict:
    from ferry.localcluster import value_of
    counts = {1024: 30_000 if quick else 200_000, 16384: 3_000 if quick else 20_000}
    out: dict = {"bench": "index_accel", "index": "by_city (top-level str)",
                 "documents": "ferry.localcluster.value_of", "sizes": {}}
    for size in ACCEL_SIZES:
        n = counts[size]
        work = tempfile.mkdtemp(prefix="ferry-index-accel-")
        try:
            os.makedirs(os.path.join(work, "data"))
            write = write_store_file if size > 2000 else write_partition_file_
            write(os.path.join(work, "data", "part-0.bin"), 0,
                  ((b"k%010d" % i, value_of(i, size)) for i in range(n)))
            runs: dict[str, list[dict]] = {"python": [], "c": []}
            for _ in range(2):
                for path, env in (("python", "0"), ("c", "1")):
                    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                                        "accel", "--work", work],
                                       capture_output=True, text=True, check=False,
                                       env=dict(os.environ, FERRY_INDEX_ACCEL=env))
                    if r.returncode != 0:
                        raise SystemExit(f"child accel ({path}) failed:\n{r.stderr}")
                    got = json.loads(r.stdout)
                    if got["path"] != path:
                        raise SystemExit(f"asked for the {path} path, ran {got['path']} "
                                         "(is indexes._ixaccel built?)")
                    runs[path].append(got)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        best = {p: {m: min(r[m] for r in rs) for m in ("feed_us", "rebuild_us")}
                for p, rs in runs.items()}
        out["sizes"][str(size)] = {
            "entries": n,
            "python_feed_us_per_entry": round(best["python"]["feed_us"], 3),
            "c_feed_us_per_entry": round(best["c"]["feed_us"], 3),
            "python_rebuild_us_per_entry": round(best["python"]["rebuild_us"], 3),
            "c_rebuild_us_per_entry": round(best["c"]["rebuild_us"], 3),
            "ratio_feed_python_vs_c": round(best["python"]["feed_us"] / best["c"]["feed_us"], 2),
            "ratio_rebuild_python_vs_c": round(best["python"]["rebuild_us"]
                                               / best["c"]["rebuild_us"], 2),
        }
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    out["cpus"] = os.cpu_count()
    return out


def load_child(work: str, unique: bool, memory: int | None) -> dict:
    """One rebuild of ``work/data/part-0.bin``: CPU of the whole rebuild and the wall
    time of its load stage (from the progress reports), per source entry."""
    from indexes import IndexDefinition, IndexStore, PartitionFileSource
    defs = [IndexDefinition("by_city", "city")]
    if unique:
        defs.append(IndexDefinition("by_i", "i", unique=True))
    src = PartitionFileSource(os.path.join(work, "data"))
    idx = os.path.join(work, "idx-load")
    shutil.rmtree(idx, ignore_errors=True)
    marks: dict[str, float] = {}

    def progress(p) -> None:
        marks.setdefault(p.stage, time.perf_counter())
    with IndexStore.open(idx, defs) as s:
        c = time.process_time()
        res = s.rebuild(0, src, workers=1, memory_limit=memory, progress=progress)
        cpu = time.process_time() - c
    n = res.scanned
    assert res.entries == n * len(defs) and res.bad == 0 and res.unique_conflicts == 0, res
    import indexes
    return {"entries": n, "runs": res.runs, "rebuild_us": cpu / n * 1e6,
            "code": os.path.dirname(os.path.dirname(os.path.abspath(indexes.__file__))),
            "load_us": (marks["ready"] - marks["load"]) / n * 1e6}


def load_main(quick: bool, base: str | None) -> dict:
    from ferry.localcluster import value_of
    counts = {1024: 30_000 if quick else 200_000, 16384: 3_000 if quick else 20_000}
    out: dict = {"bench": "index_load", "documents": "ferry.localcluster.value_of",
                 "base": base, "sizes": {}}
    configs = [("memory", ROOT, None), ("external", ROOT, 1 << 20)]
    if base:
        configs.insert(0, ("base", os.path.abspath(base), None))
    for size in ACCEL_SIZES:
        n = counts[size]
        work = tempfile.mkdtemp(prefix="ferry-index-load-")
        try:
            os.makedirs(os.path.join(work, "data"))
            write = write_store_file if size > 2000 else write_partition_file_
            write(os.path.join(work, "data", "part-0.bin"), 0,
                  ((b"k%010d" % i, value_of(i, size)) for i in range(n)))
            cases: dict = {}
            for variant in ("plain", "unique"):
                runs: dict[str, list[dict]] = {c: [] for c, _, _ in configs}
                for _ in range(2):
                    for name, code, memory in configs:
                        cmd = [sys.executable, os.path.abspath(__file__), "--child", "load",
                               "--work", work, "--code", code]
                        if variant == "unique":
                            cmd.append("--unique")
                        if memory:
                            cmd += ["--sort-memory", str(memory)]
                        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
                        if r.returncode != 0:
                            raise SystemExit(f"child load ({name}) failed:\n{r.stderr}")
                        got = json.loads(r.stdout)
                        if os.path.realpath(got["code"]) != os.path.realpath(code):
                            raise SystemExit(f"child {name} ran the indexes of {got['code']}, "
                                             f"not {code}")
                        runs[name].append(got)
                best = {c: {m: round(min(r[m] for r in rs), 3)
                            for m in ("rebuild_us", "load_us")} | {"runs": rs[0]["runs"]}
                        for c, rs in runs.items()}
                case = {"entries_per_value": 2 if variant == "unique" else 1, **best,
                        "ratio_load_external_vs_memory": round(
                            best["external"]["load_us"] / best["memory"]["load_us"], 2)}
                if base:
                    case["ratio_load_base_vs_memory"] = round(
                        best["base"]["load_us"] / best["memory"]["load_us"], 2)
                    case["ratio_rebuild_base_vs_memory"] = round(
                        best["base"]["rebuild_us"] / best["memory"]["rebuild_us"], 2)
                cases[variant] = case
            out["sizes"][str(size)] = {"entries": n, **cases}
        finally:
            shutil.rmtree(work, ignore_errors=True)
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    out["cpus"] = os.cpu_count()
    return out


def write_partition_file_(path: str, partition: int, it) -> None:
    from tests.indexes.pagegen import write_partition_file
    write_partition_file(path, partition, it)


def run_child(kind: str, work: str, n: int, sample: int, sort_memory: int) -> dict:
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", kind, "--work", work,
                        "--n", str(n), "--sample", str(sample), "--sort-memory", str(sort_memory),
                        "--value-size", str(VALUE_BYTES)],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"child {kind} failed:\n{r.stderr}")
    return json.loads(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100,000 entries (< 30 s)")
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--sample", type=int, default=None, help="entries for per_entry_txn")
    ap.add_argument("--sort-memory", type=int, default=None, help="bytes of sort buffer")
    ap.add_argument("--value-size", type=int, default=VALUE_BYTES,
                    help="bytes per value (> ~2 KiB: overflow chains, file written by a store)")
    ap.add_argument("--accel", action="store_true",
                    help="only the C accelerator vs pure Python comparison (1 KiB, 16 KiB)")
    ap.add_argument("--load", action="store_true",
                    help="only the sort + load stage: in memory, external, --base code")
    ap.add_argument("--base", default=None,
                    help="with --load: a checkout whose indexes package is compared")
    ap.add_argument("--code", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--unique", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--work", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    set_value_size(a.value_size)
    big = a.value_size > 2000          # past the inline limit of 4 KiB pages
    if big:
        n = a.n or (1_000 if a.quick else 4_000)
    else:
        n = a.n or (100_000 if a.quick else 1_000_000)
    sample = a.sample or (1_000 if a.quick else 10_000)
    mem = a.sort_memory or (4 << 20 if a.quick else SORT_MEMORY)
    if a.child == "load":
        if a.code and os.path.abspath(a.code) != ROOT:
            sys.path.insert(0, os.path.abspath(a.code))     # that checkout's indexes
        print(json.dumps(load_child(a.work, a.unique, a.sort_memory)))
        return
    if a.load:
        print(json.dumps(load_main(a.quick, a.base)))
        return
    if a.child:
        print(json.dumps(child(a.child, a.work, n, sample, mem)))
        return
    if a.accel:
        print(json.dumps(accel_main(a.quick)))
        return

    from tests.indexes.pagegen import write_partition_file
    work = tempfile.mkdtemp(prefix="ferry-index-bench-")
    try:
        os.makedirs(os.path.join(work, "data"))
        write = write_store_file if big else write_partition_file
        write(os.path.join(work, "data", "part-0.bin"), 0, items(n))
        write(os.path.join(work, "data", "part-1.bin"), 1, items(n // 10, seed=8))
        r = {k: run_child(k, work, n, sample, mem)
             for k in ("baseline", "scan", "scan_entries", "scan_parse", "rebuild",
                      "rebuild_2proc", "rebuild_small", "rebuild_in_memory", "per_entry_txn",
                      "install")}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = r["baseline"]["peak_rss_mb"]
    mb = VALUE_BYTES / 1e6           # value megabytes per entry
    out = {
        "bench": "index_rebuild",
        "entries": n,
        "value_bytes": VALUE_BYTES,
        "indexes": 1,
        "sort_memory_mb": mem >> 20,
        "rebuild_entries_per_s": round(r["rebuild"]["rate"]),
        "rebuild_in_memory_entries_per_s": round(r["rebuild_in_memory"]["rate"]),
        "rebuild_cpu_entries_per_s": round(r["rebuild"]["cpu_rate"]),
        "rebuild_processes": r["rebuild"]["processes"],
        "rebuild_2proc_entries_per_s": round(r["rebuild_2proc"]["rate"]),
        "rebuild_2proc_cpu_entries_per_s": round(r["rebuild_2proc"]["cpu_rate"]),
        "scan_entries_per_s": round(r["scan"]["rate"]),
        "scan_cpu_entries_per_s": round(r["scan"]["cpu_rate"]),
        "scan_iter_entries_per_s": round(r["scan_entries"]["rate"]),
        "scan_parse_entries_per_s": round(r["scan_parse"]["rate"]),
        "scan_parse_cpu_entries_per_s": round(r["scan_parse"]["cpu_rate"]),
        "scan_mb_per_s": round(r["scan"]["rate"] * mb, 1),
        "scan_cpu_mb_per_s": round(r["scan"]["cpu_rate"] * mb, 1),
        "rebuild_mb_per_s": round(r["rebuild"]["rate"] * mb, 1),
        "rebuild_cpu_mb_per_s": round(r["rebuild"]["cpu_rate"] * mb, 1),
        "scan_cpu_seconds": round(r["scan"]["entries"] / r["scan"]["cpu_rate"], 3),
        "rebuild_cpu_seconds": round(r["rebuild"]["entries"] / r["rebuild"]["cpu_rate"], 3),
        "install_seconds": round(r["install"]["seconds"], 3),
        "install_cpu_entries_per_s": round(r["install"]["cpu_rate"]),
        "per_entry_txn_entries_per_s": round(r["per_entry_txn"]["rate"], 1),
        "per_entry_txn_sample": sample,
        "ratio_rebuild_vs_per_entry_txn": round(r["rebuild"]["rate"] / r["per_entry_txn"]["rate"], 1),
        "ratio_in_memory_rebuild_vs_per_entry_txn": round(
            r["rebuild_in_memory"]["rate"] / r["per_entry_txn"]["rate"], 1),
        "scan_share_of_rebuild": round(r["scan"]["seconds"] / r["rebuild"]["seconds"], 3),
        # where the rebuild's time goes (each from its own run, so only roughly
        # additive; meaningful when the rebuild ran in one process)
        "time_split": {
            "scan": round(r["scan"]["seconds"] / r["rebuild"]["seconds"], 3),
            "parse_and_encode": round((r["scan_parse"]["seconds"] - r["scan"]["seconds"])
                                      / r["rebuild"]["seconds"], 3),
            "sort_load_commit": round(1 - r["scan_parse"]["seconds"]
                                      / r["rebuild"]["seconds"], 3),
        },
        "rebuild_seconds": round(r["rebuild"]["seconds"], 2),
        "rebuild_sorted_runs": r["rebuild"]["runs"],
        "peak_rss_mb": {"baseline": round(base, 1),
                        f"rebuild_{n}": round(r["rebuild"]["peak_rss_mb"], 1),
                        f"rebuild_{n // 10}": round(r["rebuild_small"]["peak_rss_mb"], 1),
                        "scan": round(r["scan"]["peak_rss_mb"], 1),
                        f"rebuild_{n}_2proc": round(r["rebuild_2proc"]["peak_rss_mb"], 1),
                        f"rebuild_{n}_2proc_worker": round(r["rebuild_2proc"]["worker_peak_rss_mb"], 1)},
        "targets": {"rebuild_entries_per_s": 300_000, "ratio_vs_per_entry_txn": 10},
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
