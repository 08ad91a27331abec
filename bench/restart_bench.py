"""A node's return after a SIGKILL: what its catch-up costs with delta fetches and with
whole-file copies, in one run (``bench/rebalance_bench.py --restart`` runs this).

For each copy mode (``delta``: the node's ``[rebalance] delta`` on, its default;
``full``: off), interleaved ``--repeat`` times, on a fresh 3-node cluster of real
processes (ferry/localcluster.py): load ``--entries`` of ``--value-size`` bytes, let a
checkpoint pass, start ``--writers`` writer threads, SIGKILL n3, keep writing for
``--outage`` seconds, restart n3 and wait until every partition is OWNING on its owners
and in sync again. Measured per run: seconds from the restart to settled, the moves n3
made and how (full / delta), bytes on the wire, pages sent against the partitions'
pages, writes acknowledged during the outage; the raw loopback sendfile rate of this
machine is measured in the same run (``floor``) and the catch-up's wire bytes are
put against it.

Prints ONE JSON object.

    .venv/bin/python bench/restart_bench.py --entries 200000 --value-size 1024 --repeat 2
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from ferry.localcluster import LocalCluster, LocalNode  # noqa: E402
from devio import device_stat, device_written  # noqa: E402
from rebalance_bench import Writers  # noqa: E402


POLL_S = 0.05          # how often the settled check asks a node for the cluster's status
FG_WINDOW_S = 5.0      # the outage's last seconds that the catch-up's writes are put against


def one_run(root: str, copy: str, args: argparse.Namespace) -> dict[str, object]:
    with LocalCluster(root, partitions=args.partitions, backups=1, checkpoint_interval=1.0,
                      log_level="INFO") as c:
        with open(c.config) as f:
            text = f.read()
        with open(c.config, "w") as f:      # the copy mode of every node
            extra = "".join(f"\n{kv}" for kv in args.rebalance)      # --rebalance KEY=VALUE
            f.write(text.replace("[rebalance]", f"[rebalance]\ndelta = {str(copy == 'delta').lower()}{extra}", 1))
        c.start(3)
        c.load(args.entries, value_size=args.value_size)
        time.sleep(2.5)                       # a checkpoint covers the load
        victim = c.nodes[2]
        with Writers(c, args.writers, args.value_size, base=args.entries + 1, timed=True) as w:
            time.sleep(1.0)
            victim.kill()
            killed_wall = time.time()
            acked0 = w.acked
            time.sleep(args.outage)
            during = w.acked - acked0
            dev = device_stat(root)
            d0 = device_written(dev)
            t0, t0_wall = time.monotonic(), time.time()
            victim.start(wait=True)
            serving = time.monotonic() - t0
            # asked every 50 ms (the default 0.3 s would add up to 0.3 s to a 2-4 s figure)
            c.wait_all_owning(timeout=600, poll=POLL_S)
            seconds = time.monotonic() - t0
            after = w.acked - acked0 - during
            written = victim_write_bytes(victim)
            d1 = device_written(dev)
        # what the writers felt: the outage's last seconds (failover long done), the
        # node's start (restart -> serving) and its catch-up (serving -> settled)
        fg = {"outage_last_s": writes_window(w.latencies, t0 - min(FG_WINDOW_S, args.outage / 2), t0),
              "node_start": writes_window(w.latencies, t0, t0 + serving),
              "catch_up": writes_window(w.latencies, t0 + serving, t0 + seconds)}
        moves = [m for m in c.moves_done() if m["to"] == victim.id and m["finished"] > killed_wall]
    kinds: dict[str, int] = {}
    for m in moves:
        k = str((m.get("copy") or {}).get("mode", m.get("mode")))
        kinds[k] = kinds.get(k, 0) + 1
    pages = sum(int((m.get("copy") or {}).get("pages", 0)) for m in moves)
    sent = sum(int((m.get("copy") or {}).get("pages_sent", 0)) for m in moves
               if (m.get("copy") or {}).get("mode") == "delta")
    # where the time went: the node's own start, then the moves (stage seconds summed
    # over the moves; the moves may overlap, so the sum can exceed the wall time)
    stages: dict[str, float] = {}
    fetch: dict[str, float] = {}        # the transfer's own stages (base, manifest, ...)
    for m in moves:
        for k, v in (m.get("stage_seconds") or {}).items():
            stages[k] = round(stages.get(k, 0.0) + float(v), 3)
        for k, v in (m.get("transfer_stages") or {}).items():
            fetch[k] = round(fetch.get(k, 0.0) + float(v), 3)
    last = max((float(m["finished"]) for m in moves), default=t0_wall) - t0_wall
    return {"copy": copy, "seconds_restart_to_settled": round(seconds, 2),
            "seconds_to_serving": round(serving, 2),
            "seconds_to_last_owning": round(last, 2),
            "stage_seconds_summed": stages,
            "transfer_stage_seconds_summed": fetch,
            "move_windows": sorted((round(float(m["finished"]) - float(m["seconds_to_owning"]) - t0_wall, 2),
                                    round(float(m["finished"]) - t0_wall, 2)) for m in moves),
            "moves": len(moves),
            "moves_by_copy": kinds, "wire_bytes": sum(int(m["wire_bytes"]) for m in moves),
            "partition_bytes": sum(int(m["bytes"]) for m in moves), "pages": pages,
            "delta_pages_sent": sent, "writes_during_outage": during,
            "writes_after_restart": after,
            "move_seconds_max": max((float(m["seconds_to_owning"]) for m in moves), default=0.0),
            "victim_write_bytes": written,
            "device_write_bytes": d1 - d0 if d0 >= 0 and d1 >= 0 else -1,
            "foreground": fg}


def victim_write_bytes(node: LocalNode) -> int:
    """Bytes the restarted node's process has dirtied since its start (its
    ``/proc/<pid>/io`` write_bytes: recovery, base copies, temp files, indexes, WALs,
    checkpoints), or -1 where that is not readable. Counted a page-cache folio at a
    time, so larger than what reached the disk where the kernel uses large folios
    (bench/devio.py); ``device_write_bytes`` is the disk's own count, from the restart
    to settled, of every process on it."""
    import psutil
    if node.proc is None:
        return -1
    try:
        return int(psutil.Process(node.proc.pid).io_counters().write_bytes)
    except (psutil.Error, OSError):
        return -1


def writes_window(lat: list[tuple[float, float]], lo: float, hi: float) -> dict[str, float | int]:
    """Acknowledged puts that ended in [lo, hi): how many per second, p50/p99/max ms."""
    xs = sorted(d for t, d in lat if lo <= t < hi)
    if not xs:
        return {"puts": 0, "puts_per_s": 0.0}

    def q(f: float) -> float:
        return round(xs[min(len(xs) - 1, int(f * len(xs)))] * 1e3, 2)
    return {"puts": len(xs), "puts_per_s": round(len(xs) / max(1e-9, hi - lo), 1),
            "p50_ms": q(0.50), "p99_ms": q(0.99), "max_ms": round(xs[-1] * 1e3, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=100000)
    ap.add_argument("--value-size", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--outage", type=float, default=10.0, help="seconds n3 stays down")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--work", default=None, help="folder for the clusters (default: a temp dir)")
    ap.add_argument("--rebalance", action="append", default=[], metavar="KEY=VALUE",
                    help="a [rebalance] setting of every node, as TOML (e.g. protect=false, "
                         "min_moves=8); repeatable")
    ap.add_argument("--keep", action="store_true",
                    help="keep each run's cluster folder (the nodes' logs) under --work")
    args = ap.parse_args()
    for kv in args.rebalance:
        if "=" not in kv:
            ap.error(f"--rebalance {kv!r}: expected KEY=VALUE")
    work = args.work or tempfile.mkdtemp(prefix="ferry-restart-bench-")
    os.makedirs(work, exist_ok=True)        # a given folder may not exist yet
    from rebalance_fg import floor_rate
    floor = floor_rate(work)
    runs: list[dict[str, object]] = []
    try:
        for i in range(args.repeat):
            for copy in ("delta", "full"):
                root = os.path.join(work, f"{copy}-{i}")
                r = one_run(root, copy, args)
                runs.append(r)
                if not args.keep:
                    shutil.rmtree(root, ignore_errors=True)
                print(json.dumps(r), file=sys.stderr, flush=True)
    finally:
        if args.work is None and not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    def med(copy: str, key: str) -> float:
        return statistics.median(float(r[key]) for r in runs if r["copy"] == copy)  # type: ignore[arg-type]
    out: dict[str, object] = {
        "entries": args.entries, "value_size": args.value_size, "partitions": args.partitions,
        "outage_s": args.outage, "writers": args.writers, "repeat": args.repeat,
        "rebalance_settings": args.rebalance, "floor_bytes_per_s": round(floor), "runs": runs}
    for copy in ("delta", "full"):
        out[copy] = {k: med(copy, k) for k in ("seconds_restart_to_settled", "seconds_to_serving",
                                                "seconds_to_last_owning", "wire_bytes", "victim_write_bytes", "device_write_bytes",
                                                "partition_bytes", "delta_pages_sent", "pages",
                                                "writes_during_outage")}
    d, f = out["delta"], out["full"]
    assert isinstance(d, dict) and isinstance(f, dict)
    out["full_over_delta_wire"] = round(f["wire_bytes"] / max(d["wire_bytes"], 1), 1)
    out["full_over_delta_seconds"] = round(f["seconds_restart_to_settled"]
                                           / max(d["seconds_restart_to_settled"], 1e-3), 2)
    # the time target: at most 3 x (changed bytes / raw rate) + 2 s
    changed = d["delta_pages_sent"] * 4096
    out["delta_target_seconds"] = round(3 * changed / floor + 2.0, 2)
    out["delta_wire_over_changed_pages"] = round(d["wire_bytes"] / max(changed, 1), 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
