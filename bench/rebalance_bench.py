"""Rebalancing benchmark: the same cluster and data rebalanced file-based and
message-based in one run, without and with a concurrent write load.

For each mode (``files``, then ``messages``): a 3-node cluster of real processes
(ferry/localcluster.py) is loaded with the same deterministic entries; then a 4th node
joins with no other load, and a 5th joins while writers keep writing. Measured per
join: seconds from the join to every partition OWNING on its ideal owners, bytes the
moves received (files: bytes on the wire; messages: key + value bytes, a lower bound
of the wire), CPU seconds of the joining node (demander) and of the others
(suppliers), writes acknowledged during the move. A node's CPU includes its child
processes (the index scan workers). Ratios are messages / files, both
from the process launch (``seconds_to_owning``) and from the join (``seconds_from_join``:
first move started -> last partition OWNING, as the nodes stamped them;
``seconds_from_join_polled``: -> this script's status poll saw the cluster settled). Files mode only, a third phase: a plan moves one
partition while writers write only its keys; the temp-WAL replay rate against the
rate those updates went into the temp WAL (``replay_one_partition``).

``--foreground`` runs only the foreground phase instead (bench/rebalance_fg.py): 8 writer
processes while a 4th node joins, their p50/p99/max and puts/s before, during and after,
the join against a raw sendfile floor measured in the same run, protection on and off
interleaved (``--protect on|off|both``); ``--tls on|off|both``: the nodes' links and the
writers mutual TLS, the shared secret, or both interleaved in the same run.

``--index-transfer rebuild,ship`` runs only idle joins (files mode) instead, one per
value of ``[rebalance] index_transfer``, interleaved ``--repeat`` times in the same
run: seconds to OWNING and CPU of the joining node and the suppliers for each.

``--restart`` runs bench/restart_bench.py instead (its own flags): a node SIGKILLed
under writes and restarted, its catch-up by delta fetches against whole-file copies.

``--repeat N`` runs each mode N times on fresh clusters, the modes interleaved, and
reports the median of each figure (ratios of the medians; every run under ``runs``):
on a machine whose speed drifts, one run per mode is not a measurement.

Prints ONE JSON object.

    .venv/bin/python bench/rebalance_bench.py --quick     # ~4 MiB of entries, < 1 min
    .venv/bin/python bench/rebalance_bench.py             # 256 MiB
    .venv/bin/python bench/rebalance_bench.py --entries 16384 --value-size 65536   # 1 GiB
    .venv/bin/python bench/rebalance_bench.py --modes messages   # one mode (e.g. an older tree's baseline)
    .venv/bin/python bench/rebalance_bench.py --entries 1048576 --value-size 1024 --repeat 3 --replay-writers 0
    .venv/bin/python bench/rebalance_bench.py --index-transfer rebuild,ship --entries 1048576 --value-size 256 --repeat 3
    .venv/bin/python bench/rebalance_bench.py --foreground --entries 200000 --value-size 1024 --repeat 3
    .venv/bin/python bench/rebalance_bench.py --foreground --protect on --tls both   # TLS vs the secret
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from ferry.localcluster import LocalCluster, key_of, value_of  # noqa: E402
from node.admission import QUIET_S  # noqa: E402


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
    """``n`` threads putting new keys until stopped; counts acknowledgements. With
    ``partition``: only keys of that partition (the replay phase). With ``timed``:
    each acknowledged request's (monotonic end, seconds) goes to ``latencies``."""

    def __init__(self, cluster: LocalCluster, n: int, value_size: int, base: int,
                 partition: int | None = None, batch: int = 1, timed: bool = False) -> None:
        self.cluster, self.value_size, self.base = cluster, value_size, base
        self.partition, self.batch, self.timed = partition, batch, timed
        self.stop = threading.Event()
        self.acked = 0
        self.latencies: list[tuple[float, float]] = []   # list.append is atomic: no lock
        self.threads = [threading.Thread(target=self._run, args=(i, n), daemon=True) for i in range(n)]

    def _run(self, t: int, n: int) -> None:
        from node.assignment import partition_of
        i = self.base + t
        with self.cluster.client() as c:
            while not self.stop.is_set():
                ids: list[int] = []
                while len(ids) < self.batch:
                    if self.partition is None or \
                            partition_of(key_of(i), self.cluster.partitions) == self.partition:
                        ids.append(i)
                    i += n
                try:
                    t0 = time.monotonic()
                    if self.batch == 1:
                        c.put("default", key_of(ids[0]), value_of(ids[0], self.value_size))
                    else:   # one put_batch request: the partition's temp WAL takes them all
                        c.put_many("default", [(key_of(j), value_of(j, self.value_size)) for j in ids],
                                   batch=self.batch)
                    self.acked += len(ids)
                    if self.timed:
                        t1 = time.monotonic()
                        self.latencies.append((t1, t1 - t0))
                except Exception:
                    pass

    def __enter__(self) -> "Writers":
        for th in self.threads:
            th.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for th in self.threads:
            th.join(60)


DISK_FIELDS = ("writes", "write_sectors", "write_ms", "flushes", "flush_ms")


def disk_counters() -> dict[str, int]:
    """Writes, 512-byte sectors written, ms spent writing, flushes (fsync's cache flushes)
    and ms spent flushing, summed over the whole disks in /proc/diskstats (Linux; empty
    elsewhere). The machine's, not the cluster's: meaningful on an otherwise idle machine."""
    out = dict.fromkeys(DISK_FIELDS, 0)
    try:
        with open("/proc/diskstats") as f:
            rows = [line.split() for line in f]
    except OSError:
        return {}
    for r in rows:
        if len(r) < 20 or r[2].startswith(("loop", "ram")) or r[2][-1].isdigit() and not r[2].startswith("nvme"):
            continue              # whole disks only (a partition's counts are in its disk's)
        out["writes"] += int(r[7])
        out["write_sectors"] += int(r[9])
        out["write_ms"] += int(r[10])
        out["flushes"] += int(r[18])
        out["flush_ms"] += int(r[19])
    return out


class LevelSampler:
    """The joining node's foreground-protection gauges every ``every`` seconds while
    it joins: ``ferry_node_rebalance_level`` (the AIMD level, in moves),
    ``..._move_limit`` and ``..._transfer_rate_limit_bps`` (0: no limit). A node
    that is not up yet is skipped. ``figures()``: the samples as [t, level, moves,
    rate], and the seconds spent paced (a receive rate limit in force)."""

    NAMES = ("ferry_node_rebalance_level", "ferry_node_rebalance_move_limit",
             "ferry_node_rebalance_transfer_rate_limit_bps")

    def __init__(self, cluster: LocalCluster, node_id: str, every: float = 0.25) -> None:
        self.cluster, self.node_id, self.every = cluster, node_id, every
        self.samples: list[list[float]] = []
        self.stop = threading.Event()
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "LevelSampler":
        self.thread.start()
        return self

    def _run(self) -> None:
        from node.wire import Pool, load_secret
        pool = Pool(load_secret(self.cluster.secret_file), role="client")
        try:
            while not self.stop.wait(self.every):
                node = next((n for n in self.cluster.nodes if n.id == self.node_id), None)
                if node is None:
                    continue
                try:
                    text = pool.call(node.address, "metrics", timeout=2.0)
                except Exception:       # noqa: BLE001 (not up yet, or busy: the next sample)
                    continue
                vals = {name: 0.0 for name in self.NAMES}
                for line in text.splitlines():
                    name, _, val = line.rpartition(" ")
                    if name in vals:
                        vals[name] = float(val)
                self.samples.append([round(time.monotonic() - self.t0, 2)] + [vals[n] for n in self.NAMES])
        finally:
            pool.close()

    def figures(self) -> dict[str, object]:
        self.stop.set()
        self.thread.join(5)
        paced = sum(self.every for s in self.samples if s[3] > 0)
        return {"seconds_paced": round(paced, 2), "level_max": max((s[1] for s in self.samples), default=0.0),
                "samples": [[s[0], s[1], int(s[2]), int(s[3])] for s in self.samples]}


def join_and_wait(cluster: LocalCluster, node_id: str, writers: int, value_size: int,
                  timeout: float) -> dict[str, float]:
    before = {n.id: n.cpu_seconds() for n in cluster.nodes}
    levels = LevelSampler(cluster, node_id).start()
    disk0 = disk_counters()
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
    disk1 = disk_counters()
    per_node = {n.id: round(n.cpu_seconds() - before.get(n.id, 0.0), 2) for n in cluster.nodes}
    sup = sum(n.cpu_seconds() - before.get(n.id, 0.0) for n in cluster.nodes if n is not new)
    # this join's moves only: those that finished after it began (a window opened a
    # second early also took the previous join's last moves into the stage means)
    moves = moves_since(cluster, time.time() - (time.monotonic() - t0))
    return {"seconds_to_owning": round(seconds, 2),
            **from_join(cluster, t0, seconds),
            "bytes_moved": int(metric(cluster, new, "ferry_node_move_bytes_total")),
            "partitions_moved": int(metric(cluster, new, "ferry_node_moves_done_total")),
            "cpu_demander_s": round(new.cpu_seconds(), 2),
            "cpu_suppliers_s": round(sup, 2),
            "cpu_per_node_s": per_node,
            "disk": {k: disk1[k] - disk0[k] for k in disk1 if k in disk0},
            "writes_during_move": ctx.acked if ctx else 0,
            "writes_per_s": round((ctx.acked if ctx else 0) / seconds, 1),
            **replay_figures(cluster, new),
            "catchup": catchup_figures(moves),
            "stage_seconds_mean": stage_means(moves),
            "protection": levels.figures()}


def stage_means(moves: list[dict]) -> dict[str, float]:
    """Mean seconds per stage over the moves (where a move's time goes; the moves
    overlap, so these do not add up to the wall time)."""
    tot: dict[str, float] = {}
    for m in moves:
        for k, v in (m.get("stage_seconds") or {}).items():
            tot[k] = tot.get(k, 0.0) + v
    return {k: round(v / len(moves), 3) for k, v in tot.items()} if moves else {}


def moves_since(cluster: LocalCluster, t0_wall: float) -> list[dict]:
    return [m for m in cluster.moves_done() if m["finished"] >= t0_wall]


def from_join(cluster: LocalCluster, t0: float, seconds: float) -> dict[str, object]:
    """The same end point measured from the first move's start instead of the process
    launch: the joining node's interpreter start, imports and recovery (about 1-2 s
    here, the same in both modes) are not rebalancing. Moves start within milliseconds
    of the join being admitted, so this is "from the join".

    ``seconds_from_join``: first move start -> last move OWNING, both as the moving
    nodes recorded them (a move's ``finished`` is stamped when its partition turns
    OWNING). ``seconds_from_join_polled``: first move start -> the moment this script's
    status poll (every 0.3 s, and a status call takes tens of ms on a busy cluster)
    saw the whole cluster settled, old owners evicted included; it carries up to ~0.4 s
    of polling slack, the same in both modes, which weighs on the short file-mode
    figure. ``timeline``: per move, start and end from the first start, and stages."""
    end_wall = time.time() - (time.monotonic() - t0 - seconds)
    moves = moves_since(cluster, end_wall - seconds)
    if not moves:
        return {"seconds_from_join": None}
    starts = [m["finished"] - m["seconds_to_owning"] for m in moves]
    first = min(starts)
    last = max(m["finished"] for m in moves)
    timeline = sorted(({"partition": m["partition"], "from": m.get("from"),
                        "start": round(s - first, 3), "end": round(m["finished"] - first, 3),
                        "stage_seconds": m.get("stage_seconds")}
                       for m, s in zip(moves, starts)), key=lambda r: r["start"])
    return {"seconds_from_join": round(last - first, 2),
            "seconds_from_join_polled": round(end_wall - first, 2),
            "seconds_per_move_max": round(max(m["seconds_to_owning"] for m in moves), 2),
            "timeline": timeline}


def replay_figures(cluster: LocalCluster, node) -> dict[str, float]:
    """Files mode: temp-WAL updates replayed and the replay rate (updates / second of
    the replay stage, summed over the moves)."""
    n = metric(cluster, node, "ferry_node_replayed_updates_total")
    secs = metric(cluster, node, 'ferry_node_move_stage_seconds_sum{stage="replay"}')
    return {"replayed": int(n), "replay_per_s": round(n / secs, 1) if secs > 0 else None}


def catchup_figures(moves: list[dict]) -> dict[str, object]:
    """Replay vs ingest over the files-mode moves that buffered anything: the replay
    rate (records / second of replay, pooled) against the rate at which updates went
    into the partition's temp WAL before the replay (per partition: one replay catches
    up one partition; mean over the moves)."""
    mv = [m for m in moves if m.get("mode") == "files" and m.get("buffered")]
    if not mv:
        return {"moves_with_buffered_updates": 0}
    replayed = sum(m["replayed"] for m in mv)
    replay_s = sum(m["replayed"] / m["replay_rate"] for m in mv if m["replay_rate"] > 0)
    ingest = [m["ingest_rate"] for m in mv if m["ingest_rate"] > 0]
    replay_rate = replayed / replay_s if replay_s > 0 else None
    ingest_rate = sum(ingest) / len(ingest) if ingest else None
    return {"moves_with_buffered_updates": len(mv), "buffered": sum(m["buffered"] for m in mv),
            "replayed": replayed, "replay_per_s": round(replay_rate, 1) if replay_rate else None,
            "ingest_per_s_per_partition": round(ingest_rate, 1) if ingest_rate else None,
            "replay_over_ingest": round(replay_rate / ingest_rate, 1)
            if replay_rate and ingest_rate else None,
            "per_move": [{k: m.get(k) for k in ("partition", "buffered", "replayed", "replay_rate",
                                               "ingest_rate", "ingest_rate_during_replay", "replay_cpu_s",
                                               "replay_from_disk",
                                               "stage_seconds")}
                         for m in mv]}


def set_transfer_rate(cluster: LocalCluster, rate: int) -> None:
    """``[transfer] rate_limit`` (bytes/s, 0 = none) on every node, live: they share
    node.toml, which each node watches (written elsewhere, renamed into place)."""
    text = re.sub(r"\nrate_limit = \d+", "", open(cluster.config).read())
    if rate:
        text = text.replace("[transfer]\n", f"[transfer]\nrate_limit = {rate}\n", 1)
    with open(cluster.config + ".tmp", "w") as f:
        f.write(text)
    os.replace(cluster.config + ".tmp", cluster.config)
    time.sleep(0.5)           # the watchdog applies it within milliseconds; be generous


def replay_phase(cluster: LocalCluster, writers: int, value_size: int, timeout: float,
                 batch: int, partition_bytes: int, transfer_s: float = 2.0) -> dict[str, object]:
    """Files mode: a plan moves ONE partition to a node that does not hold it while
    ``writers`` threads write only that partition's keys in ``put_batch`` requests of
    ``batch`` entries (a heavy load for one partition), so its temp WAL takes the whole
    write load. The file transfer is slowed to take about 2 s (live ``rate_limit``) so
    that updates made after the supplier's snapshot pile up for the replay (else a
    small partition is installed before any of them arrives). Reports the replay
    against that ingest."""
    doc = cluster.status()
    alive = [n["id"] for n in doc["nodes"] if n["alive"]]
    part = doc["partitions"][0]
    p, primary = part["partition"], part["primary"]
    target = next(n for n in alive if n not in part["states"])
    t0, t0_wall = time.monotonic(), time.time()
    src = next(n for n in cluster.nodes if n.id == primary)
    with Writers(cluster, writers, value_size, base=2 * 10**8, partition=p, batch=batch) as w:
        time.sleep(0.5)       # the write load runs before the move starts
        try:   # the partition has grown since the load (earlier writers, and these)
            partition_bytes = os.path.getsize(os.path.join(src.data, "caches", "default", f"part-{p}.bin"))
        except OSError:
            pass
        # sized from the file as the move is about to snapshot it (+25% for the writes
        # until then): a rate taken before the writers started made a small partition's
        # transfer crawl once they had grown it (--quick: 70 s instead of ~1 s)
        set_transfer_rate(cluster, max(int(partition_bytes * 1.25 / transfer_s), 64 << 10))
        from node.control import Etcd                 # a plan in etcd, applied by the controller
        from node.reassign import Move
        from node.reassign_ops import execute
        execute(Etcd(cluster.control_plane), "/ferry/default", "replay-bench",
                [Move("default", p, (primary, target))])
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:     # the plan reaches the map first
                if cluster.status()["partitions"][p]["owners"] == [primary, target]:
                    break
                time.sleep(0.1)
            cluster.wait_all_owning(timeout=timeout)
        finally:
            set_transfer_rate(cluster, 0)
        seconds = time.monotonic() - t0
        acked = w.acked
    moves = [m for m in moves_since(cluster, t0_wall) if m["partition"] == p]
    return {"partition": p, "to": target, "seconds": round(seconds, 2), "writes": acked,
            "writes_per_s": round(acked / seconds, 1), **catchup_figures(moves)}


def set_rebalance(config: str, key: str, value: str) -> None:
    """Put ``key = value`` (a TOML value) in the ``[rebalance]`` table of a node config."""
    with open(config) as f:
        text = f.read()
    assert "\n[rebalance]\n" in text, config
    text = text.replace("\n[rebalance]\n", f"\n[rebalance]\n{key} = {value}\n", 1)
    with open(config, "w") as f:
        f.write(text)


def run_index_transfer(root: str, how: str, args: argparse.Namespace, run: int) -> dict[str, object]:
    """One idle join (files mode) with ``[rebalance] index_transfer = how``: seconds to
    OWNING, CPU of the joining node and of the suppliers, each move's index stage."""
    out: dict[str, object] = {"index_transfer": how, "loadavg_before": os.getloadavg()}
    with LocalCluster(os.path.join(root, f"ix-{how}-{run}"), partitions=args.partitions, mode="files",
                      concurrency=args.concurrency, checkpoint_interval=2.0, log_level="INFO",
                      index_workers=args.index_workers, index_offload=args.index_offload,
                      page_size=args.page_size,
                      stream_index=None if args.stream_index is None else args.stream_index == "on") as c:
        set_rebalance(c.config, "index_transfer", json.dumps(how))
        c.start(3)
        t0 = time.monotonic()
        c.load(args.entries, value_size=args.value_size, threads=args.threads)
        out["load_seconds"] = round(time.monotonic() - t0, 1)
        time.sleep(QUIET_S + 0.5)
        j = join_and_wait(c, "n4", 0, args.value_size, args.timeout)
        log = open(os.path.join(c.root, "n4.log"), errors="replace").read()
        j["index_shipped"] = log.count("shipped index loaded")
        j["index_refused"] = log.count("rebuilding from the file")
        out["join_idle"] = j
    out["loadavg_after"] = os.getloadavg()
    return out


def run_mode(root: str, mode: str, args: argparse.Namespace, run: int = 0) -> dict[str, object]:
    out: dict[str, object] = {"loadavg_before": os.getloadavg()}
    floor = 0.0
    if args.floor:           # the raw sendfile-into-file rate, right before this run's cluster
        from rebalance_fg import floor_rate
        os.makedirs(os.path.join(root, f"{mode}-{run}"), exist_ok=True)
        floor = floor_rate(os.path.join(root, f"{mode}-{run}"))
        out["floor_bytes_per_s"] = round(floor)
    with LocalCluster(os.path.join(root, f"{mode}-{run}"), partitions=args.partitions, mode=mode,
                      concurrency=args.concurrency, checkpoint_interval=2.0, log_level="WARNING",
                      index_workers=args.index_workers, index_offload=args.index_offload,
                      page_size=args.page_size,
                      stream_index=None if args.stream_index is None else args.stream_index == "on") as c:
        c.start(3)
        t0 = time.monotonic()
        c.load(args.entries, value_size=args.value_size, threads=args.threads)
        out["load_seconds"] = round(time.monotonic() - t0, 1)
        # an idle join means a quiet cluster: the nodes' foreground protection treats a
        # write seen within QUIET_S as load, so the join waits that long after the load
        time.sleep(QUIET_S + 0.5)
        out["join_idle"] = join_and_wait(c, "n4", 0, args.value_size, args.timeout)
        out["join_under_writes"] = join_and_wait(c, "n5", args.writers, args.value_size, args.timeout)
        if mode == "files" and args.replay_writers:
            out["replay_one_partition"] = replay_phase(c, args.replay_writers, args.value_size,
                                                       args.timeout, args.replay_batch,
                                                       args.entries * args.value_size // args.partitions,
                                                       transfer_s=1.0 if args.quick else 2.0)
    if floor:
        for phase in ("join_idle", "join_under_writes"):
            j = out[phase]
            floor_s = j["bytes_moved"] / floor
            j["floor_seconds"] = round(floor_s, 3)
            j["ratio_to_floor"] = round(j["seconds_from_join"] / floor_s, 2) \
                if j.get("seconds_from_join") and floor_s > 0 else None
    out["loadavg_after"] = os.getloadavg()
    return out


MEDIAN_FIGURES = {
    "join": ("seconds_to_owning", "seconds_from_join", "seconds_from_join_polled",
             "seconds_per_move_max", "bytes_moved", "partitions_moved", "cpu_demander_s",
             "cpu_suppliers_s", "writes_during_move", "writes_per_s", "floor_seconds",
             "ratio_to_floor"),
    "replay_one_partition": ("seconds", "writes", "writes_per_s", "replay_per_s",
                             "ingest_per_s_per_partition", "replay_over_ingest"),
}


def medians(runs: list[dict]) -> dict[str, object]:
    """One mode's runs as one record of the same shape: each figure the median over the
    runs that have it (joins and the replay phase; per-move detail stays in ``runs``)."""
    def med(rows: list[dict], keys: tuple[str, ...]) -> dict[str, object]:
        out: dict[str, object] = {}
        for k in keys:
            vals = [r[k] for r in rows if isinstance(r.get(k), (int, float))]
            if vals:
                out[k] = round(statistics.median(vals), 2)
        return out

    out: dict[str, object] = {"load_seconds": med(runs, ("load_seconds",)).get("load_seconds")}
    for phase in ("join_idle", "join_under_writes"):
        out[phase] = med([r[phase] for r in runs], MEDIAN_FIGURES["join"])
    rp = [r["replay_one_partition"] for r in runs if "replay_one_partition" in r]
    if rp:
        out["replay_one_partition"] = med(rp, MEDIAN_FIGURES["replay_one_partition"])
    return out


def main() -> None:
    if "--restart" in sys.argv[1:]:      # a node's return after SIGKILL: bench/restart_bench.py
        sys.argv.remove("--restart")
        import restart_bench
        restart_bench.main()
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small data (about 4 MiB), < 1 min")
    ap.add_argument("--entries", type=int, default=None)
    ap.add_argument("--value-size", type=int, default=None)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--threads", type=int, default=16, help="loading clients")
    ap.add_argument("--writers", type=int, default=2, help="writers during the second join")
    ap.add_argument("--concurrency", type=int, default=4,
                    help="[transfer] concurrency of the nodes: transfers at once per node (moves at "
                         "once: this many in the messages mode, twice as many in the files mode, "
                         "whose index rebuilds overlap other moves' transfers)")
    ap.add_argument("--replay-writers", type=int, default=4,
                    help="writers on one partition while a plan moves it (files mode; 0: skip)")
    ap.add_argument("--replay-batch", type=int, default=32, help="entries per put_batch of those writers")
    ap.add_argument("--index-workers", type=int, default=None,
                    help="[rebalance] index_workers of the nodes (files mode; default: the "
                         "node's default; 0: index rebuilds in the node's process, as before)")
    ap.add_argument("--index-offload", choices=("idle", "always"), default=None,
                    help="[rebalance] index_offload of the nodes (files mode; default: the node's "
                         "default, idle)")
    ap.add_argument("--page-size", type=int, default=None,
                    help="[checkpoint] page_size of the nodes (default: the node's, 4096); a page "
                         "holds whole small entries, so it sets how full the moved file's pages are")
    ap.add_argument("--stream-index", choices=("on", "off"), default=None,
                    help="[rebalance] stream_index of the nodes (default: the node's default, off)")
    ap.add_argument("--index-transfer", default=None, metavar="HOW[,HOW]",
                    help="instead of the modes: idle joins (files mode) with [rebalance] "
                         "index_transfer = each of these (rebuild, ship, auto), interleaved "
                         "--repeat times in the same run; seconds to OWNING and CPU per value")
    ap.add_argument("--modes", default="files,messages",
                    help="comma-separated modes to run (ratios need both; one mode alone: "
                         "e.g. the messages baseline of an older tree)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per mode, each on a fresh cluster, modes interleaved; with more "
                         "than one, `files` and `messages` hold the medians of each figure and "
                         "the ratios are of the medians (every run is under `runs`)")
    ap.add_argument("--foreground", action="store_true",
                    help="only the foreground phase: writer processes' latency and throughput "
                         "before/during/after a join, and the join against the sendfile floor")
    ap.add_argument("--protect", choices=("on", "off", "both"), default="both",
                    help="--foreground: rebalance.protect of the runs (both: interleaved)")
    ap.add_argument("--tls", choices=("on", "off", "both"), default="off",
                    help="--foreground: the nodes' links and the writers mutual TLS (on), the shared "
                         "secret (off), or both interleaved in the same run (runs keyed PROTECT+tls)")
    ap.add_argument("--fg-writers", type=int, default=8, help="--foreground: writer processes")
    ap.add_argument("--fg-setting", action="append", default=[], metavar="NAME=VALUE",
                    help="--foreground: a live cluster setting put before the writers start "
                         "(repeatable; e.g. transfer.rate_limit=40000000)")
    ap.add_argument("--idle-seconds", type=float, default=5.0,
                    help="--foreground: the before and after windows")
    ap.add_argument("--warmup-seconds", type=float, default=3.0)
    ap.add_argument("--floor", action="store_true",
                    help="measure the raw loopback sendfile-into-file rate (256 MiB, best of 2) "
                         "right before each run's cluster; the joins then report floor_seconds "
                         "(bytes moved / that rate) and ratio_to_floor (--foreground always does)")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--dir", default=None, help="work folder (default: a temp dir under /work or /tmp)")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat takes 1 or more")
    if args.foreground:
        foreground(ap, args)
        return
    if args.entries is None:
        args.entries = 1000 if args.quick else 16384
    if args.value_size is None:
        args.value_size = 4096 if args.quick else 16384
    root = args.dir or tempfile.mkdtemp(prefix="ferry-rebalance-bench-")
    if args.index_transfer:
        index_transfer_bench(ap, args, root)
        return
    try:
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        bad = [m for m in modes if m not in ("files", "messages")]
        if bad or not modes:
            ap.error(f"--modes takes files and/or messages (got {args.modes!r})")
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        for i in range(args.repeat):         # interleaved: a drift of the machine's speed
            for m in modes:                  # falls on both modes alike
                runs[m].append(run_mode(root, m, args, i))
                print(f"rebalance bench: {m} run {i + 1}/{args.repeat} done", file=sys.stderr)
        res = {m: r[0] if len(r) == 1 else medians(r) for m, r in runs.items()}
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    ratios = {}
    for phase in ("join_idle", "join_under_writes") if len(res) == 2 else ():
        f, m = res["files"][phase], res["messages"][phase]
        fj, mj = f.get("seconds_from_join"), m.get("seconds_from_join")
        ratios[phase] = {
            "time_messages_over_files": round(m["seconds_to_owning"] / max(f["seconds_to_owning"], 1e-6), 2),
            "time_from_join_messages_over_files": round(mj / max(fj, 1e-6), 2) if fj and mj else None,
            "time_from_join_polled_messages_over_files": round(
                m["seconds_from_join_polled"] / max(f["seconds_from_join_polled"], 1e-6), 2)
            if fj and mj else None,
            "demander_cpu_messages_over_files": round(m["cpu_demander_s"] / max(f["cpu_demander_s"], 1e-6), 2),
            "supplier_cpu_messages_over_files": round(m["cpu_suppliers_s"] / max(f["cpu_suppliers_s"], 1e-6), 2),
        }
    print(json.dumps({
        "bench": "rebalance", "quick": args.quick, "entries": args.entries,
        "value_size": args.value_size, "data_bytes": args.entries * args.value_size,
        "partitions": args.partitions, "backups": 1, "concurrency": args.concurrency, "index_workers": args.index_workers,
        "index_offload": args.index_offload, "page_size": args.page_size, "nodes": "3 -> 4 (idle) -> 5 (under writes)",
        "repeat": args.repeat, "stream_index": args.stream_index, "floor": args.floor,
        "files": res.get("files"), "messages": res.get("messages"), "ratios": ratios,
        **({"runs": runs} if args.repeat > 1 else {}),
        "target": "files >= 10x faster to OWNING than messages; replay >= 5x the ingest rate",
        "replay_over_ingest": (res.get("files") or {}).get("replay_one_partition", {}).get("replay_over_ingest"),
        "loaded_machine": os.getloadavg()[0],
    }))


def index_transfer_bench(ap: argparse.ArgumentParser, args: argparse.Namespace, root: str) -> None:
    hows = [h.strip() for h in args.index_transfer.split(",") if h.strip()]
    if not hows or any(h not in ("rebuild", "ship", "auto") for h in hows):
        ap.error(f"--index-transfer takes rebuild, ship and/or auto (got {args.index_transfer!r})")
    runs: dict[str, list[dict]] = {h: [] for h in hows}
    try:
        for i in range(args.repeat):           # interleaved: a drift falls on each alike
            for h in hows:
                runs[h].append(run_index_transfer(root, h, args, i))
                print(f"rebalance bench: index_transfer={h} run {i + 1}/{args.repeat} done",
                      file=sys.stderr)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    keys = ("seconds_to_owning", "seconds_from_join", "cpu_demander_s", "cpu_suppliers_s",
            "bytes_moved", "partitions_moved", "index_shipped", "index_refused")
    summary = {h: {k: round(statistics.median([r["join_idle"][k] for r in rs]), 2) for k in keys
                   if all(isinstance(r["join_idle"].get(k), (int, float)) for r in rs)}
               for h, rs in runs.items()}
    print(json.dumps({
        "bench": "rebalance-index-transfer", "entries": args.entries, "value_size": args.value_size,
        "data_bytes": args.entries * args.value_size, "partitions": args.partitions,
        "concurrency": args.concurrency, "repeat": args.repeat, "nodes": "3 -> 4 (idle join)",
        "median": summary, "runs": runs, "loaded_machine": os.getloadavg()[0]}))


def foreground(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    import rebalance_fg
    if args.entries is None:
        args.entries = 20000 if args.quick else 200000
    if args.value_size is None:
        args.value_size = 1024
    protects = [True, False] if args.protect == "both" else [args.protect == "on"]
    tlss = [False, True] if args.tls == "both" else [args.tls == "on"]
    settings = [(p, t) for p in protects for t in tlss]

    def label(p: bool, t: bool) -> str:
        return ("on" if p else "off") + ("+tls" if t else "")
    root = args.dir or tempfile.mkdtemp(prefix="ferry-rebalance-fg-")
    runs: dict[str, list[dict]] = {label(p, t): [] for p, t in settings}
    try:
        for i in range(args.repeat):         # interleaved: on, off, on, off ... (each secret, then tls)
            for p, t in settings:
                r = rebalance_fg.run(root, p, args, i, tls=t)
                runs[label(p, t)].append(r)
                print(f"rebalance bench (foreground): protect {'on' if p else 'off'}, "
                      f"{r['links']}, run {i + 1}/"
                      f"{args.repeat}: join {r['seconds_from_join']} s ({r['ratio_to_floor']}x floor), "
                      f"p99 {r['writers']['before']['p99_ms']} -> {r['writers']['during']['p99_ms']} ms, "
                      f"puts/s {r['writers']['before']['puts_per_s']} -> {r['writers']['during']['puts_per_s']}",
                      file=sys.stderr)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({
        "bench": "rebalance_foreground", "entries": args.entries, "value_size": args.value_size,
        "partitions": args.partitions, "backups": 1, "concurrency": args.concurrency,
        "writers": args.fg_writers, "nodes": "3 -> 4", "repeat": args.repeat, "tls": args.tls,
        "summary": {k: rebalance_fg.summary(v) for k, v in runs.items()}, "runs": runs,
        "target": "protect on: p99 during <= 2x idle p99, puts/s during >= 80% of idle; "
                  "join <= 1.3x the floor",
        "cpus": os.cpu_count(), "loadavg": os.getloadavg(),
    }))


if __name__ == "__main__":
    main()
