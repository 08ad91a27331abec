"""A real LocalCluster at many partitions: time from empty to settled, idle CPU, a join.

    python bench/cluster_scale.py [--partitions 4096] [--caches 4] [--idle-s 20] [--json]

Starts 3 node processes (initial members, backups 1) with CACHES caches of PARTITIONS
partitions each, on an embedded etcd, and reports: seconds from the start until every
partition has its 2 ideal owners OWNING and in sync with the ideal primary leading;
each node's CPU while idle (20 s, after 5 s of quiet) and RSS; then a 4th node joins
and the seconds until everything is settled again, the moves it took and whether any
partition was resynced (a copy sent back to MOVING), with the CPU seconds each process
(the nodes with their index workers, and etcd) spent during the join and per move.
No data is loaded: this measures the control plane and the per-move fixed costs, not
the transfer of bytes. ``--idle-s 0`` skips the idle window (and its 5 s of quiet). The
join is polled every ``--poll-s`` seconds: each poll reads the whole map from the
controller's node, whose CPU counts in the join's.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psutil  # noqa: E402

from ferry.localcluster import LocalCluster  # noqa: E402


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--partitions", type=int, default=4096, help="partitions per cache")
    ap.add_argument("--caches", type=int, default=4)
    ap.add_argument("--idle-s", type=float, default=20.0, help="idle CPU window (0: none)")
    ap.add_argument("--join-timeout", type=float, default=1800.0)
    ap.add_argument("--poll-s", type=float, default=1.0,
                    help="seconds between the join's status polls (each reads the whole map)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="ferry-cluster-scale-")
    out: dict[str, object] = {"partitions": a.partitions * a.caches, "caches": a.caches, "nodes": 3,
                              "backups": 1, "cpus": os.cpu_count()}
    with LocalCluster(root, partitions=a.partitions, backups=1, caches=a.caches, wal_sync="none") as c:
        t0 = time.monotonic()
        c.start(3)
        out["settle_s"] = round(time.monotonic() - t0, 1)
        procs = [psutil.Process(n.proc.pid) for n in c.nodes if n.proc is not None]
        if a.idle_s > 0:
            time.sleep(5)
            cpu0 = [p.cpu_times() for p in procs]
            t1 = time.monotonic()
            time.sleep(a.idle_s)
            cpu1 = [p.cpu_times() for p in procs]
            dt = time.monotonic() - t1
            out["idle_cpu_pct"] = [round(100 * ((y.user + y.system) - (x.user + x.system)) / dt, 1)
                                   for x, y in zip(cpu0, cpu1)]
        out["rss_mb"] = [round(p.memory_info().rss / 2**20) for p in procs]
        if not a.json:
            print(json.dumps(out), flush=True)
        etcd = [psutil.Process(m.proc.pid) for m in getattr(c.etcd, "members", [])
                if getattr(m, "proc", None) is not None] if c.etcd is not None else []
        ecpu0 = sum(_cpu(p) for p in etcd)
        ncpu0 = [n.cpu_seconds() for n in c.nodes]
        t0 = time.monotonic()
        n4 = c.add_node(wait=False)
        ncpu0.append(0.0)                 # the joining node: from its start
        c.wait_all_owning(timeout=a.join_timeout, poll=a.poll_s)
        join_s = time.monotonic() - t0
        out["join_s"] = round(join_s, 1)
        ncpu = [round(n.cpu_seconds() - x, 1) for n, x in zip(c.nodes, ncpu0)]
        ecpu = round(sum(_cpu(p) for p in etcd) - ecpu0, 1)
        # a node keeps its last 4,096 finished moves (moves_done): count them in its log
        with open(n4.log, errors="replace") as f:
            logged = sum(1 for line in f if "stage=owning" in line and " bytes" in line)
        moves = max(logged, len([m for m in c.moves_done() if m.get("to") == n4.id]))
        out["join_moves"] = moves
        out["join_moves_per_s"] = round(moves / join_s, 1)
        out["join_cpu_s"] = {n.id: x for n, x in zip(c.nodes, ncpu)} | {"etcd": ecpu}
        out["join_ms_per_move"] = round(1000 * join_s / max(moves, 1), 1)
        out["join_cpu_ms_per_move"] = {"nodes": round(1000 * sum(ncpu) / max(moves, 1), 1),
                                       "joining": round(1000 * ncpu[-1] / max(moves, 1), 1),
                                       "etcd": round(1000 * ecpu / max(moves, 1), 1)}
        out["load_avg_1m"] = round(os.getloadavg()[0], 1)
        resyncs = 0
        for log in glob.glob(os.path.join(root, "n*.log")):
            with open(log, errors="replace") as f:
                resyncs += sum(1 for line in f if "OWNING -> MOVING" in line)
        out["resyncs"] = resyncs
    print(json.dumps(out))


if __name__ == "__main__":
    main()
