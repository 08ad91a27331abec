"""Rebalancing benchmark: the same cluster and data rebalanced file-based and
message-based in one run, without and with a concurrent write load.

For each mode (``files``, then ``messages``): a 3-node cluster of real processes
(node/localcluster.py) is loaded with the same deterministic entries; then a 4th node
joins with no other load, and a 5th joins while writers keep writing. Measured per
join: seconds from the join to every partition OWNING on its ideal owners, bytes the
moves received (files: bytes on the wire; messages: key + value bytes, a lower bound
of the wire), CPU seconds of the joining node (demander) and of the others
(suppliers), writes acknowledged during the move. Ratios are messages / files.

Prints ONE JSON object.

    .venv/bin/python bench/rebalance_bench.py --quick     # ~4 MiB of entries
    .venv/bin/python bench/rebalance_bench.py             # 256 MiB
    .venv/bin/python bench/rebalance_bench.py --entries 16384 --value-size 65536   # 1 GiB
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from node.localcluster import LocalCluster, key_of, value_of  # noqa: E402


def metric(cluster: LocalCluster, node, name: str) -> float:
    from node.wire import Pool, load_secret
    pool = Pool(load_secret(cluster.secret_file), role="client")
    try:
        text = pool.call(node.address, "metrics", timeout=10.0)
    finally:
        pool.close()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


class Writers:
    """``n`` threads putting new keys until stopped; counts acknowledgements."""

    def __init__(self, cluster: LocalCluster, n: int, value_size: int, base: int) -> None:
        self.cluster, self.value_size, self.base = cluster, value_size, base
        self.stop = threading.Event()
        self.acked = 0
        self.threads = [threading.Thread(target=self._run, args=(i, n), daemon=True) for i in range(n)]

    def _run(self, t: int, n: int) -> None:
        i = self.base + t
        with self.cluster.client() as c:
            while not self.stop.is_set():
                try:
                    c.put("default", key_of(i), value_of(i, self.value_size))
                    self.acked += 1
                except Exception:
                    pass
                i += n

    def __enter__(self) -> "Writers":
        for th in self.threads:
            th.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for th in self.threads:
            th.join(60)


def join_and_wait(cluster: LocalCluster, node_id: str, writers: int, value_size: int,
                  timeout: float) -> dict[str, float]:
    before = {n.id: n.cpu_seconds() for n in cluster.nodes}
    t0 = time.monotonic()
    if writers:
        ctx = Writers(cluster, writers, value_size, base=10**8 + hash(node_id) % 1000 * 10**5)
    else:
        ctx = None
    if ctx:
        ctx.__enter__()
    try:
        new = cluster.add_node(node_id, wait=False)
        cluster.wait_all_owning(timeout=timeout)
        seconds = time.monotonic() - t0
    finally:
        if ctx:
            ctx.__exit__()
    sup = sum(n.cpu_seconds() - before.get(n.id, 0.0) for n in cluster.nodes if n is not new)
    return {"seconds_to_owning": round(seconds, 2),
            "bytes_moved": int(metric(cluster, new, "ferry_node_move_bytes_total")),
            "partitions_moved": int(metric(cluster, new, "ferry_node_moves_done_total")),
            "cpu_demander_s": round(new.cpu_seconds(), 2),
            "cpu_suppliers_s": round(sup, 2),
            "writes_during_move": ctx.acked if ctx else 0,
            "writes_per_s": round((ctx.acked if ctx else 0) / seconds, 1),
            **replay_figures(cluster, new)}


def replay_figures(cluster: LocalCluster, node) -> dict[str, float]:
    """Files mode: temp-WAL updates replayed and the replay rate (updates / second of
    the replay stage, summed over the moves)."""
    n = metric(cluster, node, "ferry_node_replayed_updates_total")
    secs = metric(cluster, node, 'ferry_node_move_stage_seconds_sum{stage="replay"}')
    return {"replayed": int(n), "replay_per_s": round(n / secs, 1) if secs > 0 else None}


def run_mode(root: str, mode: str, args: argparse.Namespace) -> dict[str, object]:
    out: dict[str, object] = {}
    with LocalCluster(os.path.join(root, mode), partitions=args.partitions, mode=mode,
                      concurrency=4, checkpoint_interval=2.0, log_level="WARNING") as c:
        c.start(3)
        t0 = time.monotonic()
        c.load(args.entries, value_size=args.value_size, threads=args.threads)
        out["load_seconds"] = round(time.monotonic() - t0, 1)
        out["join_idle"] = join_and_wait(c, "n4", 0, args.value_size, args.timeout)
        out["join_under_writes"] = join_and_wait(c, "n5", args.writers, args.value_size, args.timeout)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small data (about 4 MiB), < 1 min")
    ap.add_argument("--entries", type=int, default=None)
    ap.add_argument("--value-size", type=int, default=None)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--threads", type=int, default=16, help="loading clients")
    ap.add_argument("--writers", type=int, default=2, help="writers during the second join")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--dir", default=None, help="work folder (default: a temp dir under /work or /tmp)")
    args = ap.parse_args()
    if args.entries is None:
        args.entries = 1000 if args.quick else 16384
    if args.value_size is None:
        args.value_size = 4096 if args.quick else 16384
    root = args.dir or tempfile.mkdtemp(prefix="ferry-rebalance-bench-")
    try:
        res = {m: run_mode(root, m, args) for m in ("files", "messages")}
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    ratios = {}
    for phase in ("join_idle", "join_under_writes"):
        f, m = res["files"][phase], res["messages"][phase]
        ratios[phase] = {
            "time_messages_over_files": round(m["seconds_to_owning"] / max(f["seconds_to_owning"], 1e-6), 2),
            "demander_cpu_messages_over_files": round(m["cpu_demander_s"] / max(f["cpu_demander_s"], 1e-6), 2),
            "supplier_cpu_messages_over_files": round(m["cpu_suppliers_s"] / max(f["cpu_suppliers_s"], 1e-6), 2),
        }
    print(json.dumps({
        "bench": "rebalance", "quick": args.quick, "entries": args.entries,
        "value_size": args.value_size, "data_bytes": args.entries * args.value_size,
        "partitions": args.partitions, "backups": 1, "nodes": "3 -> 4 (idle) -> 5 (under writes)",
        "files": res["files"], "messages": res["messages"], "ratios": ratios,
        "target": "files >= 10x faster to OWNING than messages",
        "loaded_machine": os.getloadavg()[0],
    }))


if __name__ == "__main__":
    main()
