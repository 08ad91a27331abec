"""The foreground phase of bench/rebalance_bench.py (``--foreground``): what writers feel
during a rebalance, and how close the rebalance gets to the hardware floor.

Per run, on a fresh 3-node cluster loaded with ``--entries`` x ``--value-size``:

1. the **floor**: a raw loopback sendfile into a file with fsync (bench/transfer_bench.py's
   ``raw_sendfile``, 256 MiB, best of 2), measured right before the cluster starts;
2. ``rebalance.protect`` set on or off (a cluster setting, live);
3. ``--fg-writers`` writer **processes** (not threads: the GIL would make the writers
   their own bottleneck) put new keys with ``--value-size`` values, one put at a time,
   each recording (wall time of the answer, latency);
4. after a warm-up, ``--idle-seconds`` of writes alone (**before**), then a 4th node joins
   (**during**: first move started -> last move OWNING, as the joining node stamped
   them), then ``--idle-seconds`` once the cluster has settled (**after**).

Reported: p50/p99/max latency and puts/s per window, during/before ratios, seconds from
the join to the last OWNING and its ratio to the floor (bytes the joining node received /
floor rate), the moves' stage times, and what the joining node's protection did.
"""
from __future__ import annotations

import array
import multiprocessing
import os
import statistics
import threading
import time
from typing import TYPE_CHECKING

from node.control import Etcd
from ferry.localcluster import LocalCluster, key_of, value_of
from node.settings import put as put_setting
from node.wire import Pool

if TYPE_CHECKING:
    from transfer.tls import TlsFiles

FLOOR_BYTES = 256 << 20


def floor_rate(work: str) -> float:
    """Bytes/s of a raw loopback sendfile into a file with fsync (best of 2)."""
    from transfer_bench import make_file, raw_sendfile   # bench/ is on sys.path (the script's dir)
    src, dst = os.path.join(work, "floor.src"), os.path.join(work, "floor.dst")
    make_file(src, FLOOR_BYTES)
    try:
        best = min(raw_sendfile(src, dst)["seconds"] for _ in range(2))
    finally:
        for f in (src, dst):
            if os.path.exists(f):
                os.unlink(f)
    return FLOOR_BYTES / best


def writer_main(seeds: list[str], secret_file: str, idx: int, value_size: int,
                stop: "multiprocessing.synchronize.Event", out_path: str, keys: bool = False,
                tls: "TlsFiles | None" = None) -> None:
    """One writer process: new keys, one put at a time, until ``stop``; then its samples
    (answer wall time, latency seconds[, the key's number with ``keys``]) as doubles
    into ``out_path``. ``tls``: a client certificate (mutual TLS) instead of the secret."""
    from node.client import Client
    samples = array.array("d")
    i = 2_000_000_000 + idx * 10_000_000
    value = value_of(i, value_size)
    with Client(seeds, secret_file=secret_file, timeout=60, tls=tls) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            c.put("default", key_of(i), value)
            samples.append(time.time())
            samples.append(time.perf_counter() - t0)
            if keys:
                samples.append(i)
            i += 1
    with open(out_path, "wb") as f:
        samples.tofile(f)


def read_samples(paths: list[str], width: int = 2) -> list[tuple[float, ...]]:
    """The writers' samples: tuples of ``width`` (3 for writers started with ``keys``)."""
    out: list[tuple[float, ...]] = []
    for p in paths:
        a = array.array("d")
        with open(p, "rb") as f:
            a.frombytes(f.read())
        out += list(zip(*(a[k::width] for k in range(width))))
    return out


def window(samples: list[tuple[float, float]], lo: float, hi: float) -> dict[str, float | int | None]:
    lat = sorted(s for t, s in samples if lo <= t < hi)
    span = max(hi - lo, 1e-6)
    if not lat:
        return {"seconds": round(span, 2), "puts": 0, "puts_per_s": 0.0, "p50_ms": None,
                "p99_ms": None, "max_ms": None}
    q = lambda f: round(lat[min(len(lat) - 1, int(f * len(lat)))] * 1e3, 2)   # noqa: E731
    return {"seconds": round(span, 2), "puts": len(lat), "puts_per_s": round(len(lat) / span, 1),
            "p50_ms": q(0.50), "p99_ms": q(0.99), "max_ms": round(lat[-1] * 1e3, 2)}


def stage_table(moves: list[dict]) -> dict[str, dict[str, float]]:
    """Per stage: mean and max seconds over the moves (they overlap; no sum)."""
    out: dict[str, list[float]] = {}
    for m in moves:
        for k, v in (m.get("stage_seconds") or {}).items():
            out.setdefault(k, []).append(v)
    return {k: {"mean": round(statistics.mean(v), 3), "max": round(max(v), 3)} for k, v in out.items()}


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine from /proc/stat ((0, 0) elsewhere)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = v[3] + (v[4] if len(v) > 4 else 0)          # idle + iowait
    return sum(v) - idle, sum(v)


def busy_fraction(a: tuple[int, int], b: tuple[int, int]) -> float | None:
    """Share of the machine's CPU time (all cores) that was busy between two readings."""
    return round((b[0] - a[0]) / (b[1] - a[1]), 3) if b[1] > a[1] else None


def watch_admission(pool: Pool, address: str, stop: threading.Event, seen: list[dict]) -> None:
    while not stop.is_set():
        try:
            seen.append(pool.call(address, "admission", timeout=2.0))
        except Exception:            # the node is starting
            pass
        stop.wait(0.1)


def run(root: str, protect: bool, args: "object", run_no: int, tls: bool = False) -> dict[str, object]:
    """One run; ``tls``: the nodes' links and the writers' connections mutual TLS
    (``LocalCluster(tls=True)``; etcd plain in both modes), else the shared secret."""
    work = os.path.join(root, f"fg-{'on' if protect else 'off'}{'-tls' if tls else ''}-{run_no}")
    os.makedirs(work, exist_ok=True)
    out: dict[str, object] = {"protect": protect, "links": "mutual TLS" if tls else "shared secret",
                              "loadavg_before": os.getloadavg()}
    floor = floor_rate(work)
    out["floor_bytes_per_s"] = round(floor)
    with LocalCluster(os.path.join(work, "c"), partitions=args.partitions, mode="files",
                      concurrency=args.concurrency, checkpoint_interval=2.0, log_level="WARNING",
                      page_size=args.page_size, tls=tls, etcd_tls=False) as c:
        c.start(3)
        t0 = time.monotonic()
        c.load(args.entries, value_size=args.value_size, threads=args.threads)
        out["load_seconds"] = round(time.monotonic() - t0, 1)
        etcd = Etcd(c.control_plane)
        put_setting(etcd, "/ferry/default", "rebalance.protect", "on" if protect else "off")
        for kv in getattr(args, "fg_setting", []):
            name, _, value = kv.partition("=")
            put_setting(etcd, "/ferry/default", name, value)
        out["settings"] = list(getattr(args, "fg_setting", []))
        time.sleep(1.0)
        mp = multiprocessing.get_context("spawn")
        stop = mp.Event()
        paths = [os.path.join(work, f"writer-{i}.bin") for i in range(args.fg_writers)]
        procs = [mp.Process(target=writer_main, args=(c.seeds, c.secret_file, i, args.value_size, stop, p),
                            kwargs={"tls": c.client_tls})
                 for i, p in enumerate(paths)]
        for p in procs:
            p.start()
        pool = c.pool()
        seen: list[dict] = []
        wstop = threading.Event()
        try:
            time.sleep(args.warmup_seconds)
            idle_lo, tk_idle_lo = time.time(), cpu_ticks()
            time.sleep(args.idle_seconds)
            idle_hi, tk_idle_hi = time.time(), cpu_ticks()
            cpu0 = {n.id: n.cpu_seconds() for n in c.nodes}
            new = c.add_node("n4", wait=False)
            watcher = threading.Thread(target=watch_admission, args=(pool, new.address, wstop, seen),
                                       daemon=True)
            watcher.start()
            c.wait_all_owning(timeout=args.timeout)
            settled, tk_settled = time.time(), cpu_ticks()
            wstop.set()
            cpu = {n.id: round(n.cpu_seconds() - cpu0.get(n.id, 0.0), 2) for n in c.nodes}
            time.sleep(1.0)
            after_lo, tk_after_lo = time.time(), cpu_ticks()
            time.sleep(args.idle_seconds)
            after_hi, tk_after_hi = time.time(), cpu_ticks()
        finally:
            stop.set()
            wstop.set()
            for p in procs:
                p.join(60)
        moves = [m for m in pool.call(new.address, "moves_done", timeout=10.0) if m["finished"] >= idle_hi]
        pool.close()
    samples = read_samples(paths)
    first = min(m["finished"] - m["seconds_to_owning"] for m in moves)
    last = max(m["finished"] for m in moves)
    moved = sum(int(m.get("wire_bytes") or m.get("bytes") or 0) for m in moves)
    floor_s = moved / floor
    before, during, after = (window(samples, idle_lo, idle_hi), window(samples, first, last),
                             window(samples, after_lo, after_hi))
    limits = [a["move_limit"] for a in seen if isinstance(a, dict)]
    lat = [a["latency_ms"] for a in seen if isinstance(a, dict) and a.get("latency_ms") is not None]
    out.update({
        "bytes_moved": moved, "partitions_moved": len(moves),
        "floor_seconds": round(floor_s, 3),
        "seconds_from_join": round(last - first, 3),
        "seconds_from_join_polled": round(settled - first, 3),
        "ratio_to_floor": round((last - first) / floor_s, 2) if floor_s > 0 else None,
        "writers": {"before": before, "during": during, "after": after},
        "p99_during_over_idle": round(during["p99_ms"] / before["p99_ms"], 2)
        if during["p99_ms"] and before["p99_ms"] else None,
        "throughput_during_over_idle": round(during["puts_per_s"] / before["puts_per_s"], 2)
        if before["puts_per_s"] else None,
        "stage_seconds": stage_table(moves),
        "cpu_seconds_during": cpu,
        # the whole machine's busy share: before, from the join's launch to settled, after
        "machine_cpu_busy": {"before": busy_fraction(tk_idle_lo, tk_idle_hi),
                             "join": busy_fraction(tk_idle_hi, tk_settled),
                             "after": busy_fraction(tk_after_lo, tk_after_hi)},
        "admission": {"move_limit_min": min(limits) if limits else None,
                      "move_limit_max": max(limits) if limits else None,
                      "latency_ms_max": max(lat) if lat else None,
                      "target_ms": next((a["target_ms"] for a in reversed(seen)
                                         if isinstance(a, dict) and a.get("target_ms")), None)},
        "loadavg_after": os.getloadavg(),
    })
    return out


def summary(runs: list[dict]) -> dict[str, object]:
    """Medians over the runs of one setting."""
    def med(get) -> float | None:   # type: ignore[no-untyped-def]
        vals = [v for v in (get(r) for r in runs) if isinstance(v, (int, float))]
        return round(statistics.median(vals), 3) if vals else None
    out: dict[str, object] = {"runs": len(runs)}
    for k in ("seconds_from_join", "floor_seconds", "ratio_to_floor", "p99_during_over_idle",
              "throughput_during_over_idle", "bytes_moved"):
        out[k] = med(lambda r, k=k: r.get(k))
    for w in ("before", "during", "after"):
        out[w] = {f: med(lambda r, w=w, f=f: r["writers"][w].get(f))
                  for f in ("p50_ms", "p99_ms", "max_ms", "puts_per_s")}
    stages = sorted({s for r in runs for s in r["stage_seconds"]})
    out["stage_seconds_mean"] = {s: med(lambda r, s=s: r["stage_seconds"].get(s, {}).get("mean"))
                                 for s in stages}
    return out


__all__ = ["run", "summary", "floor_rate", "writer_main", "read_samples"]
