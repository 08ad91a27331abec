"""Live validation benchmark: live mode against folder mode on the same data, and what
a live validation costs the foreground writers, in one run.

A 3-node cluster of real processes (ferry/localcluster.py: etcd, 16 partitions, one
backup) is loaded with ``--mib`` MiB of 1 KiB values; one Spark session (``local[2]``)
is started and warmed up on a one-entry folder. Then, in this order:

1. ``live``: a live validation of the running cluster, no other load (every partition
   fenced, every in-sync copy snapshotted and fetched through the transfer agents),
   run twice: the first query also sets up the live data source (``first_seconds``);
2. ``writers.idle``: ``--writers`` processes put 1 KiB values (overwrites of loaded
   keys, so the data keeps its size), each at ``--write-rate`` puts/s (0: as fast as
   it can), for ``--idle-seconds``; each put's latency is recorded;
3. ``writers.during`` and ``live_under_writes``: the same writers go on while a second
   live validation runs; the window is that validation's;
4. the nodes stop (checkpoint, exit) and ``folder``: folder mode reads the same
   node folders directly.

Figures: seconds and MB/s of partition-file bytes for each validation, ``ratio``
(live seconds / folder seconds, same data, same session), the writers' p50/p99/max
latency (ms) and throughput (puts/s) in each window and ``during / idle``. The rate
limit and parallelism of live mode are validation/live.py's defaults unless
``--rate``/``--parallel`` are given. ``load_avg_1m`` is read before and after: other
work on the machine moves every figure.

Prints ONE JSON object on stdout, and a short table on stderr.

    .venv/bin/python bench/validation_bench.py                 # 128 MiB
    .venv/bin/python bench/validation_bench.py --mib 1024      # the issue's 1 GiB
    .venv/bin/python bench/validation_bench.py --quick         # 16 MiB, a smoke run
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import sys
import tempfile
import time
from array import array
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "validation"))  # the fast page writer

from ferry.localcluster import LocalCluster, key_of  # noqa: E402
from validation import list_folders, validate  # noqa: E402
from validation.live import LiveSettings  # noqa: E402

VALUE = 1024
PARTS = 16
WARM_S = 1.0            # writers' first second is left out of the idle window


# -- foreground writers (one process each: their latency is not the bench's GIL) --------
def _writer(w: int, n: int, seeds: list[str], secret_file: str, entries: int, rate: float,
            stop: Event, out: Connection) -> None:
    """Put 1 KiB values to loaded keys of this writer's share until ``stop``; send back
    (start, latency) of each put as two arrays of doubles (monotonic seconds)."""
    from node.client import Client
    rng = random.Random(w)
    starts, lats = array("d"), array("d")
    pad = b"v" * (VALUE - 16)
    period = 1.0 / rate if rate > 0 else 0.0
    with Client(seeds, secret_file=secret_file, timeout=30.0) as c:
        out.send_bytes(b"")                    # ready: the windows start after every writer is
        nxt = time.monotonic()
        i = 0
        while not stop.is_set():
            if period:                         # open loop: the schedule, not the answers, paces
                nxt += period
                delay = nxt - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            k = rng.randrange(w, entries, n)
            t = time.monotonic()
            c.put("default", key_of(k), b"%016d" % i + pad)
            lats.append(time.monotonic() - t)
            starts.append(t)
            i += 1
    out.send_bytes(starts.tobytes())
    out.send_bytes(lats.tobytes())


class Writers:
    def __init__(self, cluster: LocalCluster, n: int, entries: int, rate: float) -> None:
        ctx = mp.get_context("spawn")        # never fork a process that runs a JVM gateway
        self.stop = ctx.Event()
        self.pipes: list[Connection] = []
        self.procs = []
        for w in range(n):
            recv, send = ctx.Pipe(duplex=False)
            self.pipes.append(recv)
            self.procs.append(ctx.Process(target=_writer, args=(w, n, cluster.seeds, cluster.secret_file,
                                                                 entries, rate, self.stop, send),
                                          daemon=True))
        self.starts, self.lats = array("d"), array("d")

    def start(self) -> float:
        """Start the writers; the time at which all of them are writing."""
        for p in self.procs:
            p.start()
        for pipe in self.pipes:
            pipe.recv_bytes()
        return time.monotonic()

    def finish(self) -> None:
        self.stop.set()
        for pipe, p in zip(self.pipes, self.procs):
            s, lt = array("d"), array("d")
            s.frombytes(pipe.recv_bytes())
            lt.frombytes(pipe.recv_bytes())
            self.starts.extend(s)
            self.lats.extend(lt)
            p.join(30)

    def window(self, t0: float, t1: float) -> dict:
        """Latency (ms) and throughput of the puts that started in [t0, t1)."""
        lat = sorted(x for s, x in zip(self.starts, self.lats) if t0 <= s < t1)
        if not lat:
            return {"puts": 0, "seconds": round(t1 - t0, 2)}

        def q(f: float) -> float:
            return round(lat[min(len(lat) - 1, int(f * len(lat)))] * 1e3, 2)
        return {"puts": len(lat), "seconds": round(t1 - t0, 2),
                "puts_per_s": round(len(lat) / (t1 - t0), 1),
                "p50_ms": q(0.50), "p99_ms": q(0.99), "max_ms": round(lat[-1] * 1e3, 2)}


# -- validations -------------------------------------------------------------------------
def file_bytes(dirs: list[str]) -> int:
    return sum(f.size for f in list_folders(dirs))


def timed(what: str, run: Callable[[], dict], nbytes: int) -> tuple[dict, dict]:
    t = time.monotonic()
    res = run()
    s = time.monotonic() - t
    assert res["passed"], f"{what}: {json.dumps(res)[:2000]}"
    return res, {"seconds": round(s, 2), "bytes": nbytes, "mb_per_s": round(nbytes / s / 1e6, 1),
                 "entries": res["entries"], "partitions": res["partitions_checked"]}


def counters(res: dict) -> tuple[int, int]:
    ats = [p["counter"] for p in res["live"]["partitions"]]
    return min(ats), max(ats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=128, help="MiB of 1 KiB values loaded (default 128)")
    ap.add_argument("--quick", action="store_true", help="16 MiB, 4 s idle window")
    ap.add_argument("--writers", type=int, default=3)
    ap.add_argument("--write-rate", type=float, default=100.0,
                    help="puts/s of each writer (0: closed loop, as fast as it can)")
    ap.add_argument("--idle-seconds", type=float, default=8.0)
    ap.add_argument("--rate", type=float, default=None, help="live mode bytes/s (default: live.py's)")
    ap.add_argument("--parallel", type=int, default=None, help="live mode partitions at once")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    mib = 16 if a.quick else a.mib
    idle_s = 4.0 if a.quick else a.idle_seconds
    entries = mib * 1024 * 1024 // VALUE
    load0 = os.getloadavg()[0]
    root = tempfile.mkdtemp(prefix="ferry-live-validation-bench-", dir=a.dir)
    spark = None
    try:
        from validation.session import start, stop_gateway
        from validation_pages import write_partition
        tiny = os.path.join(root, "tiny")
        os.makedirs(tiny)
        write_partition(os.path.join(tiny, "part-0.bin"), 0, [(b"k", b"v", 1)])
        with LocalCluster(os.path.join(root, "cluster"), partitions=PARTS, backups=1,
                          checkpoint_interval=2.0, log_level="WARNING") as c:
            c.start(3)
            t = time.monotonic()
            c.load(entries, value_size=VALUE, threads=4)
            load_s = time.monotonic() - t
            dirs = [n.data for n in c.nodes]
            live_kw: dict = {"seeds": c.seeds, "secret_file": c.secret_file}
            if a.rate is not None:
                live_kw["rate"] = a.rate or None
            if a.parallel is not None:
                live_kw["parallel"] = a.parallel
            settings = LiveSettings(**live_kw)
            t = time.monotonic()
            spark = start(a.master)
            validate([tiny], spark=spark)
            startup_s = time.monotonic() - t

            # the first live query also plans and registers the live data source:
            # reported apart, the second is the figure (folder mode is warm too)
            _, first = timed("live (first)", lambda: validate([], spark=spark, live=settings),
                             file_bytes(dirs))
            res, live = timed("live", lambda: validate([], spark=spark, live=settings), file_bytes(dirs))
            live["counters"] = counters(res)
            live["first_seconds"] = first["seconds"]
            w = Writers(c, a.writers, entries, a.write_rate)
            t_w = w.start()
            time.sleep(WARM_S + idle_s)
            t_v0 = time.monotonic()
            res, under = timed("live under writes", lambda: validate([], spark=spark, live=settings),
                               file_bytes(dirs))
            t_v1 = time.monotonic()
            under["counters"] = counters(res)
            w.finish()
        # the nodes stopped gracefully: their folders hold what they held
        _, folder = timed("folder", lambda: validate(dirs, spark=spark), file_bytes(dirs))
        idle, during = w.window(t_w + WARM_S, t_w + WARM_S + idle_s), w.window(t_v0, t_v1)
        out = {
            "bench": "live_validation", "mib": mib, "entries": entries, "value_size": VALUE,
            "nodes": 3, "partitions": PARTS, "copies": 2, "master": a.master,
            "live_rate": settings.rate, "live_parallel": settings.parallel,
            "load_s": round(load_s, 1), "startup_s": round(startup_s, 1),
            "live": live, "folder": folder,
            "ratio_live_over_folder_s": round(live["seconds"] / folder["seconds"], 2),
            "live_under_writes": under,
            "writers": {"processes": a.writers, "rate_each": a.write_rate, "idle": idle,
                        "during": during, "ratio_during_over_idle": ratios(idle, during)},
            "load_avg_1m": [round(load0, 1), round(os.getloadavg()[0], 1)],
            "cpus": os.cpu_count(),
        }
        print(json.dumps(out))
        table(out)
    finally:
        if spark is not None:
            spark.stop()
            stop_gateway()
        shutil.rmtree(root, ignore_errors=True)


def ratios(idle: dict, during: dict) -> dict:
    return {k: round(during[k] / idle[k], 2) if idle.get(k) and k in during else None
            for k in ("p50_ms", "p99_ms", "max_ms", "puts_per_s")}


def table(o: dict) -> None:
    p = lambda *x: print(*x, file=sys.stderr)  # noqa: E731
    p(f"{o['mib']} MiB of {o['value_size']} B values, {o['nodes']} nodes x {o['partitions']} partitions x "
      f"{o['copies']} copies, Spark {o['master']}, load avg {o['load_avg_1m']}")
    p(f"{'validation':<22}{'s':>8}{'MB':>9}{'MB/s':>8}")
    for k in ("live", "live_under_writes", "folder"):
        v = o[k]
        p(f"{k:<22}{v['seconds']:>8}{v['bytes'] / 1e6:>9.1f}{v['mb_per_s']:>8}")
    p(f"live / folder seconds: {o['ratio_live_over_folder_s']}")
    wr = o["writers"]
    p(f"{'writers':<22}{'puts/s':>8}{'p50 ms':>9}{'p99 ms':>8}{'max ms':>9}")
    for k in ("idle", "during"):
        v = wr[k]
        p(f"{k:<22}{v.get('puts_per_s', '-'):>8}{v.get('p50_ms', '-'):>9}{v.get('p99_ms', '-'):>8}"
          f"{v.get('max_ms', '-'):>9}")
    r = wr["ratio_during_over_idle"]
    p(f"{'during / idle':<22}{r['puts_per_s']:>8}{r['p50_ms']:>9}{r['p99_ms']:>8}{r['max_ms']:>9}")


if __name__ == "__main__":
    main()
