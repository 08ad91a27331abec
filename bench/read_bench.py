"""Read path benchmark: latency and throughput of ``get`` on a 3-node cluster, against
the RPC floor measured in the same run.

A :class:`ferry.localcluster.LocalCluster` of 3 node processes (16 partitions, backups
1, ``wal.sync = group``) is loaded with ``--keys`` entries of ``--value-size`` bytes.
Then ``--readers`` client threads (one ``node.Client`` each) run each phase for
``--seconds``:

- ``ping``: the ``ping`` RPC to the primary of a random key (the floor: one
  authenticated round trip, no read);
- ``get``: ``Client.get`` of random keys, the default consistency (linearizable where
  the tree has it: the primary checks its lease and the keys with an update in flight);
- ``get_stale``: ``Client.get(..., consistency="stale")`` (any OWNING copy), where the
  tree has it;
- ``get_under_writes``: ``get`` while 2 more threads put new values of the same keys
  (reads meet keys with an update in flight);
- ``put``: ``Client.put`` of random keys (what the read path's bookkeeping costs the
  write path: request ids, the keys in flight).

Reported per phase: operations, ops/s, p50/p99/max in ms, and the ratio of p50 to the
ping floor. On a shared machine the cluster phases move with its load; ``server`` (also
run by default) is the steady part: the node's own update path in one process, no
network (a real UpdatePath, NodeContext and store with ``wal.sync = none``, the backup
a stand-in that answers ``applied``), CPU microseconds per ``op_get`` (a key held by
nobody, and one with an update not acknowledged where the tree tracks them) and per
``op_put``, best of 5 rounds of ``--server-ops`` calls each. ``--tree DIR`` runs the same measurement in another checkout (e.g. the
commit before a change: ``git worktree add /tmp/before HEAD~3``), interleaved
``--repeat`` times with this tree (the order alternating); the median of each figure
is reported, and this tree's over the other's.

Prints ONE JSON object.

    .venv/bin/python bench/read_bench.py --quick
    .venv/bin/python bench/read_bench.py --tree /tmp/before --repeat 3
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One whole measurement in a child process whose sys.path starts with the tree under
# test, so the nodes AND the client are that tree's code.
CHILD = r'''
import inspect, json, random, shutil, sys, tempfile, threading, time
sys.path.insert(0, sys.argv[1])
from ferry.localcluster import LocalCluster
from node import partition_of
keys_n, size, readers, seconds = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
root = tempfile.mkdtemp(prefix="ferry-readbench-")
c = LocalCluster(root, partitions=16, backups=1)
KEYS = [b"rk-%06d" % i for i in range(keys_n)]

def quantiles(lat, n, secs, floor=None):
    lat.sort()
    q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))] * 1e3
    out = {"ops": n, "ops_per_s": round(n / secs, 1), "p50_ms": round(q(0.5), 3),
           "p99_ms": round(q(0.99), 3), "max_ms": round(lat[-1] * 1e3, 3)}
    if floor:
        out["p50_over_ping"] = round(out["p50_ms"] / floor, 2)
    return out

def phase(op, threads, background=None):
    stop, lock, lat = threading.Event(), threading.Lock(), []
    def run(t):
        cl = c.client(timeout=30)
        rnd = random.Random(t)
        mine = []
        try:
            cl.refresh()
            while not stop.is_set():
                k = rnd.choice(KEYS)
                t0 = time.perf_counter()
                op(cl, k, rnd)
                mine.append(time.perf_counter() - t0)
        finally:
            cl.close()
            with lock:
                lat.extend(mine)
    bg_stop = threading.Event()
    bgs = []
    if background is not None:
        def bg(t):
            cl = c.client(timeout=30)
            rnd = random.Random(1000 + t)
            while not bg_stop.is_set():
                background(cl, rnd.choice(KEYS), rnd)
            cl.close()
        bgs = [threading.Thread(target=bg, args=(t,)) for t in range(2)]
        for t in bgs: t.start()
        time.sleep(0.3)
    ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    t0 = time.perf_counter()
    for t in ts: t.start()
    time.sleep(seconds)
    stop.set()
    for t in ts: t.join()
    secs = time.perf_counter() - t0
    bg_stop.set()
    for t in bgs: t.join()
    return lat, len(lat), secs

def ping(cl, k, rnd):
    p = partition_of(k, cl.map.caches["default"].partitions)
    cl.pool.call(cl.map.address(cl.map.primary("default", p)), "ping")

def get(cl, k, rnd):
    cl.get("default", k)

def get_stale(cl, k, rnd):
    cl.get("default", k, consistency="stale")

def put(cl, k, rnd):
    cl.put("default", k, b"%08d" % rnd.randrange(10**8) + b"v" * (size - 8))

try:
    c.start(3)
    with c.client(timeout=60) as cl:
        cl.put_many("default", ((k, b"v" * size) for k in KEYS))
    out = {}
    lat, n, secs = phase(ping, readers)
    out["ping"] = quantiles(lat, n, secs)
    floor = out["ping"]["p50_ms"]
    phases = [("get", get, None)]
    from node import Client
    if "consistency" in inspect.signature(Client.get).parameters:
        phases.append(("get_stale", get_stale, None))
    phases += [("get_under_writes", get, put), ("put", put, None)]
    for name, op, bg in phases:
        lat, n, secs = phase(op, readers, bg)
        out[name] = quantiles(lat, n, secs, floor)
    print(json.dumps(out))
finally:
    c.stop()
    shutil.rmtree(root, ignore_errors=True)
'''


# The update path alone, in one process: what the read path and its bookkeeping cost
# the node, without the network and the other processes.
SERVER_CHILD = r'''
import json, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
n = int(sys.argv[2])
from node.cluster_map import ClusterMap, Member, PartRecord
from node.config import CacheConfig, NodeConfig
from node.context import Events, MapHolder, MoveTable, NodeContext, PartitionLocks, Replication
from node.control import Session
from node.metrics import Metrics
from node.states import State, StateTable
from node.storage import CacheData
from node.updates import UpdatePath

class Grant:
    def grant(self, ttl):
        return 1, 3600

class Backup:
    def call(self, address, method, timeout=None, **args):
        return "applied"

cache = CacheConfig(name="default", partitions=1, backups=1)
cfg = NodeConfig(id="n1", data=tempfile.mkdtemp(prefix="ferry-readpath-"), caches=(cache,), wal_sync="none")
data = CacheData(cfg, cache)
data.create(0)
states = StateTable(cfg.data)
states.set("default", 0, State.OWNING, reason="bench")
m = ClusterMap({"default": cache})
for i, node in enumerate(("n1", "n2"), 1):
    m.members[node] = Member(node, f"127.0.0.{i}:7001", order=i)
m.parts["default"][0] = PartRecord("n1", ("n1", "n2"), 3, False, 2)
session = Session(Grant(), ttl=3, margin=0.5)
session.grant()
ctx = NodeContext(cfg=cfg, id="n1", boot="bench", secret=b"s" * 32, metrics=Metrics(),
                  data={"default": data}, states=states, pool=Backup(), map=MapHolder(m),
                  plock=PartitionLocks(), events=Events(), repl=Replication(), moves=MoveTable(),
                  session=session)
ctx.events.joined.set()
up = UpdatePath(ctx, None)
keys = [b"k%06d" % i for i in range(1000)]
for k in keys:
    up.op_put("default", k, b"v" * 256)

def rounds(fn):
    best = None
    for _ in range(5):
        t = time.thread_time()
        for i in range(n):
            fn(keys[i % len(keys)])
        us = (time.thread_time() - t) / n * 1e6
        best = us if best is None else min(best, us)
    return round(best, 2)

out = {"get_us": rounds(lambda k: up.op_get("default", k)),
       "put_us": rounds(lambda k: up.op_put("default", k, b"w" * 256))}
if hasattr(up, "visible"):      # a key with an update not acknowledged: the held value
    up.visible.hold("default", 0, data, keys)
    out["get_held_us"] = rounds(lambda k: up.op_get("default", k))
print(json.dumps(out))
'''


def _child(tree: str, code: str, *argv: object) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    r = subprocess.run([sys.executable, "-c", code, tree, *map(str, argv)],
                       capture_output=True, text=True, env=env, cwd=tree)
    if r.returncode != 0:
        raise SystemExit(f"read bench in {tree} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def measure(tree: str, args: argparse.Namespace) -> dict:
    out = {"server": _child(tree, SERVER_CHILD, args.server_ops)}
    if not args.server_only:
        out.update(_child(tree, CHILD, args.keys, args.value_size, args.readers, args.seconds))
    return out


def median_of(runs: list[dict]) -> dict:
    """The median of every figure over the runs of one tree."""
    out: dict[str, dict] = {}
    for phase in runs[0]:
        if all(phase in r for r in runs):
            out[phase] = {k: round(statistics.median(r[phase][k] for r in runs), 3)
                          for k in runs[0][phase]}
    return out


def commit(tree: str) -> str:
    r = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() or "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=2000)
    ap.add_argument("--value-size", type=int, default=256)
    ap.add_argument("--readers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--tree", help="another checkout measured in the same run, interleaved")
    ap.add_argument("--server-ops", type=int, default=20000, help="calls per round of the server phase")
    ap.add_argument("--server-only", action="store_true", help="only the update path in one process")
    ap.add_argument("--quick", action="store_true", help="500 keys, 2 s per phase")
    args = ap.parse_args()
    if args.quick:
        args.keys, args.seconds = 500, 2.0
    trees = {"this": ROOT}
    if args.tree:
        trees["other"] = os.path.abspath(args.tree)
    runs: dict[str, list[dict]] = {k: [] for k in trees}
    for i in range(args.repeat):
        # the order alternates: a machine whose load drifts favours neither tree
        for name, tree in (list(trees.items()) if i % 2 == 0 else list(trees.items())[::-1]):
            runs[name].append(measure(tree, args))
    out: dict = {"bench": "read", "keys": args.keys, "value_size": args.value_size,
                 "readers": args.readers, "seconds": args.seconds, "repeat": args.repeat,
                 "machine": f"{os.cpu_count()} cpu {platform.machine()}, Python {platform.python_version()}",
                 "load_avg": [round(x, 2) for x in os.getloadavg()]}
    for name, tree in trees.items():
        out[name] = {"tree": tree, "commit": commit(tree), "median": median_of(runs[name]),
                     "runs": runs[name]}
    if "other" in trees:
        ratios = {}
        for phase, fig in out["this"]["median"].items():
            theirs = out["other"]["median"].get(phase)
            if theirs:
                ratios[phase] = {k: round(fig[k] / theirs[k], 3) for k in fig
                                 if k in ("ops_per_s", "p50_ms", "p99_ms") or k.endswith("_us")
                                 if theirs.get(k)}
        out["this_over_other"] = ratios
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
