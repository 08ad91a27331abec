"""Control-plane benchmark: failover time and the write path's latency.

``failover``: a 3-node cluster (backups 1) under a writer; the primary of partition 0 is
SIGKILLed; measured: seconds from the kill to the next acknowledged write of a key of
partition 0 (the client retries until it is), against the lease TTL (target: within
2 TTLs). Repeated ``--repeat`` times on fresh clusters.

``latency``: a 3-node cluster, ``--writers`` threads putting 1 KiB values for
``--seconds``; p50/p99/max of each acknowledged put and throughput. ``--tree DIR`` runs
the same measurement against another checkout (e.g. the commit before the control plane
moved to etcd: ``git worktree add /tmp/before c79c93a``), so before and after are
measured on the same machine, interleaved (``--interleave``). The control plane must not
be on the per-write path: the target is within 10%.

Prints ONE JSON object.

    .venv/bin/python bench/control_plane_bench.py failover --repeat 3
    .venv/bin/python bench/control_plane_bench.py latency --tree /tmp/before --interleave 3
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _failover_once(root: str, ttl: int) -> dict[str, float]:
    from node import partition_of
    from ferry.localcluster import LocalCluster
    c = LocalCluster(root, partitions=8, backups=1, lease_ttl=ttl)
    try:
        c.start(3)
        key = next(f"k{i}" for i in range(10000) if partition_of(f"k{i}".encode(), 8) == 0)
        cl = c.client(timeout=60)
        cl.put("default", key, "0")
        doc = c.status()
        prim = doc["partitions"][0]["primary"]
        victim = next(n for n in c.nodes if n.id == prim)
        stop = threading.Event()

        def other_writes() -> None:        # load on the other partitions meanwhile
            w = c.client(timeout=60)
            i = 0
            while not stop.is_set():
                try:
                    w.put("default", f"bg{i}", "x")
                except Exception:
                    pass
                i += 1
        t = threading.Thread(target=other_writes, daemon=True)
        t.start()
        time.sleep(0.5)
        t_kill = time.monotonic()
        victim.kill()
        cl.put("default", key, "1")          # retried by the client until acknowledged
        took = time.monotonic() - t_kill
        stop.set()
        t.join(5)
        return {"seconds": round(took, 3), "ttls": round(took / ttl, 2)}
    finally:
        c.stop()


def failover(args: argparse.Namespace) -> dict:
    runs = []
    for i in range(args.repeat):
        d = tempfile.mkdtemp(prefix="ferry-failover-")
        try:
            runs.append(_failover_once(d, args.ttl))
        finally:
            shutil.rmtree(d, ignore_errors=True)
    secs = [r["seconds"] for r in runs]
    return {"bench": "failover", "lease_ttl_s": args.ttl, "runs": runs,
            "median_seconds": statistics.median(secs), "max_seconds": max(secs),
            "max_ttls": round(max(secs) / args.ttl, 2),
            "target_met": max(secs) <= 2 * args.ttl}


LATENCY_CHILD = r'''
import json, os, statistics, sys, tempfile, threading, time, shutil
sys.path.insert(0, sys.argv[1])
from ferry.localcluster import LocalCluster
writers, seconds = int(sys.argv[2]), float(sys.argv[3])
root = tempfile.mkdtemp(prefix="ferry-lat-")
c = LocalCluster(root, partitions=16, backups=1)
try:
    c.start(3)
    lat, lock = [], threading.Lock()
    stop = threading.Event()
    val = b"v" * 1024
    def w(t):
        cl = c.client(timeout=30)
        mine, i = [], 0
        while not stop.is_set():
            t0 = time.perf_counter()
            cl.put("default", f"w{t}-{i}", val)
            mine.append(time.perf_counter() - t0)
            i += 1
        with lock:
            lat.extend(mine)
    ts = [threading.Thread(target=w, args=(t,)) for t in range(writers)]
    for t in ts: t.start()
    time.sleep(seconds)
    stop.set()
    for t in ts: t.join()
    lat.sort()
    q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))]
    print(json.dumps({"puts": len(lat), "puts_per_s": round(len(lat) / seconds, 1),
                      "p50_ms": round(q(0.5) * 1e3, 3), "p99_ms": round(q(0.99) * 1e3, 3),
                      "max_ms": round(lat[-1] * 1e3, 3)}))
finally:
    c.stop()
    shutil.rmtree(root, ignore_errors=True)
'''


def latency(args: argparse.Namespace) -> dict:
    trees = {"this": ROOT}
    if args.tree:
        trees["other"] = os.path.abspath(args.tree)
    runs: dict[str, list[dict]] = {k: [] for k in trees}
    for _ in range(args.interleave):
        for name, tree in trees.items():
            env = dict(os.environ, PYTHONPATH=tree)
            r = subprocess.run([sys.executable, "-c", LATENCY_CHILD, tree, str(args.writers),
                                str(args.seconds)], capture_output=True, text=True, env=env, cwd=tree)
            if r.returncode != 0:
                raise SystemExit(f"latency run on {tree} failed:\n{r.stderr[-3000:]}")
            runs[name].append(json.loads(r.stdout.strip().splitlines()[-1]))
    out: dict = {"bench": "latency", "writers": args.writers, "seconds": args.seconds, "runs": runs}
    for name, rs in runs.items():
        out[name] = {k: statistics.median(r[k] for r in rs) for k in ("puts_per_s", "p50_ms", "p99_ms", "max_ms")}
    if "other" in out:
        out["ratio_this_vs_other"] = {k: round(out["this"][k] / out["other"][k], 3)
                                      for k in ("puts_per_s", "p50_ms", "p99_ms")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("failover")
    f.add_argument("--repeat", type=int, default=3)
    f.add_argument("--ttl", type=int, default=3)
    lt = sub.add_parser("latency")
    lt.add_argument("--tree", help="another checkout to measure in the same run")
    lt.add_argument("--writers", type=int, default=8)
    lt.add_argument("--seconds", type=float, default=10.0)
    lt.add_argument("--interleave", type=int, default=3)
    args = ap.parse_args()
    doc = failover(args) if args.cmd == "failover" else latency(args)
    doc["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform(),
                      "python": platform.python_version()}
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
