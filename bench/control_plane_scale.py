"""The control plane at scale: the real controller and the real node-side map code
against a real etcd, with simulated members (no data, no node processes).

Default: 1,000 nodes x 100,000 partitions (2 caches of 50,000, backups 1), then +10%
nodes. Three actors:

- **the controller node** (a process of its own, so its CPU is its own): the real
  ``node.membership.ControlPlane`` on a stub node context, wired as a node wires it:
  ``View`` -> ``ControlPlane._on_view_change`` (``MapBuilder.apply`` into the
  ``MapHolder``, dirty sets) and ``ControlPlane._control_loop`` (election,
  ``Controller.handle_requests()``, ``Controller.decide()`` on every change);
- **the simulated members** (this process, the "driver"): every other node's etcd
  traffic, written as the node code writes it: registration (``_register``: report
  keys in transactions of ``REPORT_TXN_OPS``, the member key in the last one), report
  changes (``put_report``: one transaction per node per coalescing window, at most 50
  puts and 50 deletes each), requests to the controller (``ControlPlane.request``: one
  put per request under the node's lease, withdrawn by a compare-and-delete after
  ``REQUEST_TIMEOUT_S``), and the reconcile rules that order them (a copy asks to be
  admitted once it is OWNING; the ideal primary takes over once it is in sync; an old
  owner evicts once every ideal owner is in sync and OWNING, and is not the primary).
  Each member has a lease of its own (its keys are attached to it, as a node's are),
  granted for the whole run: keepalives are not simulated (a node sends one every
  TTL/5: 0.6 s at the default 3 s TTL). The step's requests of all members go out at
  once through ``--workers`` clients;
- **one observer node**: a ``View`` on the whole prefix feeding a real ``MapBuilder``
  and ``MapHolder`` as ``_on_view_change`` does, followed by reconcile-like lookups
  (``ClusterMap.ideal``, the record and the reported states) of each delta's
  partitions. Its thread CPU over the events is the per-node cost of a record change.

Phases:

1. **create**: the creator registers every partition OWNING, the other members
   register, then the controller node starts: its first round creates every record.
2. **setup**: the initial spread. ``--spread direct`` (default): reports from each
   ideal owner, records with primary = ideal[0] and isr = the ideal owners, and the
   creator's other reports deleted, written straight into etcd in transactions: setup,
   NOT measured (the controller must write nothing). ``--spread simulate`` drives the
   spread through the same steps as phase 3 (measured the same way).
3. **+10% nodes**: the new members register; for every partition whose ideal owners
   (the observer's ``ClusterMap.ideal``) changed, the steps of a real move: the new
   owner reports MOVING, then OWNING; the primary puts an ``alter_isr`` add request
   and the controller applies it; the ideal primary puts ``set_primary`` where the
   primary changes; the old owner's report is deleted (eviction; RENTING -> EVICTED
   within the reporter's 20 ms window, so only the delete reaches etcd), and the
   controller's decide drops it from the in-sync set.

Measured per phase: wall time, CPU of the controller node's threads (thread CPU
clocks) and process, etcd's process CPU, every etcd request of every actor (by path,
bytes of the JSON body sent, largest), watch events the observer received, and the
observer's CPU. Computed (from counted events, not measured): watch deliveries if every
node watched the whole prefix (each event x the members at that moment) and if each
node received only the events of partitions it holds or is assigned (each event x the
nodes concerned: holders, in-sync copies, primary, ideal owners, the key's own node,
the controller; a membership event concerns every node).

``--lease-probe`` measures only etcd's cost of a put under a lease by the number of keys
already on that lease (etcd before 3.4.27 / 3.5.10: O(keys on the lease), which a
cluster's creator, holding every partition's report under its lease, pays).
``--profile-dir`` runs the controller node's threads and the observer under cProfile
(timed by thread CPU; a run that slow is for the hotspots, not the figures).

    .venv/bin/python bench/control_plane_scale.py                  # 1,000 x 100,000
    .venv/bin/python bench/control_plane_scale.py --nodes 100 --partitions 10000 --json
    .venv/bin/python bench/control_plane_scale.py --lease-probe
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from node.cluster_map import PartRecord  # noqa: E402
from node.config import CacheConfig  # noqa: E402
from node.control import KV, Etcd, Session, View, _b64  # noqa: E402
from node.context import MapHolder  # noqa: E402
from node.controller import TXN_BATCH, part_key  # noqa: E402
from node.mapview import MapBuilder  # noqa: E402
from node.membership import REPORT_TXN_OPS, REQUEST_TIMEOUT_S  # noqa: E402
from node.reqbatch import MAX_OPS as REQUEST_TXN_OPS  # noqa: E402

PREFIX = "/ferry/scale"
OWNING, MOVING = "OWNING", "MOVING"
ETCD_MAX_REQUEST = 1536 * 1024          # etcd's default --max-request-bytes (1.5 MiB)
SIM_LEASE_MARGIN = 600                  # the simulated members' leases outlive the run by this
CTL_LEASE_TTL = 10                      # the controller node's lease (a node's default is 3)
PartKey = tuple[str, int]
_HDR = {"Content-Type": "application/json"}


# -- counting every etcd request --------------------------------------------------
class ReqStats:
    """Requests by path: [count, bytes of the JSON body, largest body]."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_path: dict[str, list[int]] = {}

    def add(self, path: str, n: int) -> None:
        with self.lock:
            s = self.by_path.get(path)
            if s is None:
                self.by_path[path] = [1, n, n]
            else:
                s[0] += 1
                s[1] += n
                if n > s[2]:
                    s[2] = n

    def snapshot(self) -> dict[str, list[int]]:
        with self.lock:
            return {p: list(v) for p, v in self.by_path.items()}


def req_diff(a: dict[str, list[int]], b: dict[str, list[int]]) -> dict[str, dict[str, int]]:
    """Requests made between snapshots ``a`` and ``b`` (the largest is over the run up
    to ``b``: a lower bound on nothing, an upper bound on the phase)."""
    out = {}
    for p, (n, by, mx) in b.items():
        n0, by0, _ = a.get(p, [0, 0, 0])
        if n - n0:
            out[p] = {"count": n - n0, "bytes": by - by0, "max_bytes": mx}
    return out


def req_sum(*ds: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for d in ds:
        for p, s in d.items():
            o = out.setdefault(p, {"count": 0, "bytes": 0, "max_bytes": 0})
            o["count"] += s["count"]
            o["bytes"] += s["bytes"]
            o["max_bytes"] = max(o["max_bytes"], s["max_bytes"])
    return out


def instrument_etcd(stats: ReqStats) -> None:
    """Count every ``Etcd.post`` of this process. The body is serialised once, here,
    and sent as those bytes: what ``requests`` does with ``json=body`` (the same
    ``json.dumps``, then UTF-8), so the CPU of the code under test is unchanged."""
    from node import control

    def post(self: Etcd, path: str, body: Any) -> Any:
        data = json.dumps(body).encode()
        stats.add(path, len(data))
        return self._call(lambda c: c.post(c.get_url(path), data=data, headers=_HDR))

    control.Etcd.post = post        # type: ignore[method-assign]


def profiled(fn: Any, path: str) -> Any:
    """``fn`` run under cProfile (in the thread that calls it) timed by the thread's
    CPU clock (waits for etcd cost nothing), the stats dumped to ``path`` when it
    returns."""
    def wrapper(*a: Any, **kw: Any) -> Any:
        import cProfile
        pr = cProfile.Profile(time.thread_time)
        pr.enable()
        try:
            return fn(*a, **kw)
        finally:
            pr.disable()
            pr.dump_stats(path)
    return wrapper


def profile_top(path: str, n: int = 25) -> dict[str, list[str]]:
    """The ``n`` functions with the most own and the most cumulative CPU, as pstats
    prints them."""
    import io
    import pstats
    out: dict[str, list[str]] = {}
    if not os.path.exists(path):
        return out
    for key in ("tottime", "cumtime"):
        buf = io.StringIO()
        pstats.Stats(path, stream=buf).sort_stats(key).print_stats(n)
        lines = buf.getvalue().splitlines()
        i = next((j for j, ln in enumerate(lines) if ln.strip().startswith("ncalls")), 0)
        out[key] = [ln.rstrip().replace(ROOT + "/", "") for ln in lines[i:] if ln.strip()]
    return out


def thread_cpu(t: threading.Thread | None) -> float:
    if t is None or t.ident is None or not t.is_alive():
        return 0.0
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(t.ident))
    except (OSError, ProcessLookupError):
        return 0.0


def proc_cpu(pid: int) -> float:
    """utime + stime of a process (seconds), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def layout(partitions: int, caches: int, backups: int) -> tuple[CacheConfig, ...]:
    per = partitions // caches
    if per * caches != partitions:
        raise SystemExit(f"--partitions {partitions} must be a multiple of --caches {caches}")
    return tuple(CacheConfig(f"c{i}", per, backups) for i in range(caches))


def node_ids(start: int, n: int, width: int) -> list[str]:
    return [f"n{i:0{width}d}" for i in range(start, start + n)]


# -- the controller node (a process of its own) ------------------------------------
class _CountingHandler(logging.Handler):
    """Counts the node code's log lines by template (no formatting); warnings and
    errors go to stderr as well."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.counts: collections.Counter[str] = collections.Counter()
        self.examples: dict[str, list[str]] = {}     # a few of each refusal / failure

    def emit(self, record: logging.LogRecord) -> None:
        key = str(record.msg)[:60]
        self.counts[key] += 1
        if any(w in key for w in ("refused", "changed under", "withdrawn", "failed", "crashed")):
            ex = self.examples.setdefault(key, [])
            if len(ex) < 5:
                ex.append(record.getMessage()[:300])
        if record.levelno >= logging.WARNING:
            sys.stderr.write(f"{record.name} {record.levelname} {record.getMessage()[:300]}\n")


def controller_node_main(a: argparse.Namespace) -> None:
    from node.cluster_map import ClusterMap
    from node.config import NodeConfig
    from node.context import Events, MoveTable, NodeContext, PartitionLocks, Replication
    from node.membership import ControlPlane

    handler = _CountingHandler()
    lg = logging.getLogger("ferry")
    lg.setLevel(logging.INFO)
    lg.addHandler(handler)
    lg.propagate = False
    stats = ReqStats()
    instrument_etcd(stats)
    caches = layout(a.partitions, a.caches, a.backups)
    cfg = NodeConfig(id=a.me, data=a.workdir, control_plane=tuple(a.endpoints), control_prefix=a.prefix,
                     caches=caches, lease_ttl_s=CTL_LEASE_TTL)
    # a node context with nothing but what the control plane's map and controller use
    ctx = NodeContext(cfg=cfg, id=a.me, boot=uuid.uuid4().hex, secret=b"", metrics=None,  # type: ignore[arg-type]
                      data={}, states=None, pool=None, map=MapHolder(ClusterMap({})),  # type: ignore[arg-type]
                      plock=PartitionLocks(), events=Events(), repl=Replication(), moves=MoveTable())
    cp = ControlPlane(ctx, on_settings=lambda old, new: None)
    ctl_thread: threading.Thread | None = None

    def reply(doc: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()

    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "start":
            cp.etcd = Etcd(list(a.endpoints))
            cp.session = Session(cp.etcd, CTL_LEASE_TTL, 0.5)
            ctx.session = cp.session
            cp.session.grant()
            cp.session.start()
            # a node puts its member key and its election key under its one lease, and a
            # node only obeys an election key whose holder's member key shares its lease:
            # this process is that member here, so its key moves under this lease
            mkey = f"{a.prefix}/members/{a.me}"
            mine = cp.etcd.get(mkey)
            if mine is not None:
                cp.etcd.put(mkey, mine.value, cp.session.lease)
            # the View loads everything (one range) in its watch thread, then watches
            cp.view = View(cp.etcd, cp.prefix, cp._on_view_change)
            loop = cp._control_loop
            if a.profile_dir:
                cp.view._loop = profiled(cp.view._loop, os.path.join(a.profile_dir, "controller-node-watch.pstats"))  # type: ignore[method-assign]
                loop = profiled(loop, os.path.join(a.profile_dir, "controller-node-controller.pstats"))
            cp.view.start()
            ctl_thread = threading.Thread(target=loop, name="controller", daemon=True)
            ctl_thread.start()
            reply({"ok": True})
        elif op == "stats":
            ctl = cp.controller
            view = cp.view
            with ctx.map.lock:
                epoch = ctx.map.map.epoch
                members = len(ctx.map.map.members)
            reply({
                "controller_cpu": thread_cpu(ctl_thread),
                "watch_cpu": thread_cpu(view._thread if view else None),
                "keepalive_cpu": thread_cpu(cp.session._thread if cp.session else None),
                "process_cpu": time.process_time(),
                "requests": stats.snapshot(),
                "rounds": ctl.rounds if ctl else 0,
                "looked_at": ctl.looked_at if ctl else 0,
                "elected": ctl is not None,
                "controller_dirty": len(ctx.map.controller_dirty),
                "pending_requests": len(view.items("requests")) if view else 0,
                "revision": view.revision if view else 0,
                "reloads": view.reloads if view else 0,
                "map_epoch": epoch, "members": members,
                "log": dict(handler.counts),
                "log_examples": handler.examples,
            })
        elif op == "quit":
            ctx.events.stopping.set()
            ctx.events.controller_wake.set()
            if cp.view is not None:
                cp.view.stop()
            if cp.session is not None:
                cp.session.stop(revoke=True)
            for t in (ctl_thread, cp.view._thread if cp.view else None):
                if t is not None:
                    t.join(10)
            reply({"ok": True})
            return


class ControllerNode:
    """The driver's handle on the controller node process (JSON lines on stdin/stdout)."""

    def __init__(self, workdir: str, endpoints: list[str], me: str, partitions: int, caches: int,
                 backups: int, profile_dir: str | None = None) -> None:
        self.err_path = os.path.join(workdir, "controller-node.stderr")
        self._err = open(self.err_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--controller-node", "--me", me,
             "--workdir", workdir, "--prefix", PREFIX, "--partitions", str(partitions),
             "--caches", str(caches), "--backups", str(backups),
             *(["--profile-dir", profile_dir] if profile_dir else []), "--endpoints", *endpoints],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True, cwd=ROOT)

    def call(self, op: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the controller node exited ({self.proc.poll()}); see {self.err_path}")
        return json.loads(line)

    def stop(self) -> None:
        try:
            if self.proc.poll() is None:
                self.call("quit")
                self.proc.wait(10)
        except Exception:
            pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._err.close()


# -- the observer node ---------------------------------------------------------------
class Observer:
    """One node's view of the whole prefix: a real MapBuilder fed as
    ``ControlPlane._on_view_change`` feeds it, then reconcile-like lookups of the
    delta's partitions (both timed: the node's cost), then the bench's own counting
    (timed apart and not part of the node's cost)."""

    def __init__(self, etcd: Etcd, caches: tuple[CacheConfig, ...], controller: str) -> None:
        self.builder = MapBuilder(PREFIX, caches)
        self.holder = MapHolder(self.builder.map)
        self.holder.pending_requests = self.builder.requests
        self.controller = controller
        self.head = PREFIX + "/"
        self.view = View(etcd, PREFIX, self._on_change)
        self._lock = threading.Lock()
        # records changed / requests gone since the driver last looked -> when first seen
        self.changed: dict[PartKey, float] = {}
        self.wake = threading.Event()
        self.node_cpu = 0.0          # apply + dirty sets + lookups (the node's cost)
        self.book_cpu = 0.0          # the bench's counting in the same thread
        self.events = 0
        self.batches = 0
        self.by_kind: collections.Counter[str] = collections.Counter()
        self.deliver_all = 0         # sum over events of the members at that moment
        self.deliver_interest = 0    # sum over events of the nodes concerned
        self.records = 0             # P/parts keys present
        self.lookups = 0

    def start(self) -> None:
        self.view.start()

    def cpu(self) -> float:
        return thread_cpu(self.view._thread)

    def counters(self) -> dict[str, Any]:
        with self._lock:
            return {"node_cpu": self.node_cpu, "book_cpu": self.book_cpu, "thread_cpu": self.cpu(),
                    "events": self.events, "batches": self.batches, "by_kind": dict(self.by_kind),
                    "deliver_all": self.deliver_all, "deliver_interest": self.deliver_interest,
                    "lookups": self.lookups, "reloads": self.view.reloads, "revision": self.view.revision}

    def take_changed(self) -> dict[PartKey, float]:
        with self._lock:
            out, self.changed = self.changed, {}
            self.wake.clear()
        return out

    def _on_change(self, events: list[tuple[str, KV | None]]) -> None:
        t0 = time.thread_time()
        h = self.holder
        rev = self.view.revision
        with h.lock:
            d = self.builder.apply(events, rev)
        h.dirty.add(d.parts)
        h.controller_dirty.add(d.parts)
        with h.changed:
            h.changed.notify_all()
        # the reconcile pass over the delta: each partition's record, ideal owners and
        # reported states, as Reconciler._one reads them
        keys = h.dirty.take()
        h.controller_dirty.take()
        n = 0
        with h.lock:
            m = h.map
            it = keys if keys is not None else [(c, p) for c, cc in m.caches.items() for p in range(cc.partitions)]
            for c, p in it:
                rec = m.parts[c][p]
                ideal = m.ideal(c, p)
                prim_alive = rec.primary in m.members
                _ = {x for x in ideal if m.states[c][p].get(x) == OWNING}, prim_alive
                n += 1
        t1 = time.thread_time()
        self._count(events, d)
        t2 = time.thread_time()
        with self._lock:
            self.node_cpu += t1 - t0
            self.book_cpu += t2 - t1
            self.lookups += n

    def _count(self, events: list[tuple[str, KV | None]], d: Any) -> None:
        old_isr = {(c, p): old.isr for c, p, old, _ in d.records}
        changed: set[PartKey] = set()
        h = self.holder
        hl = len(self.head)
        all_n = all_i = 0
        kinds: collections.Counter[str] = collections.Counter()
        with h.lock:
            m = h.map
            members = len(m.members)
            for key, kv in events:
                parts = key[hl:].split("/")
                kind = parts[0]
                kinds[kind] += 1
                all_n += members
                ck: PartKey | None = None
                own: str | None = None
                try:
                    if kind == "reports" and len(parts) == 4:
                        ck, own = (parts[2], int(parts[3])), parts[1]
                    elif kind == "parts" and len(parts) == 3:
                        ck = (parts[1], int(parts[2]))
                        if kv is not None and kv.create == kv.mod:
                            self.records += 1
                        changed.add(ck)
                    elif kind == "requests" and len(parts) == 4:
                        ck, own = (parts[1], int(parts[2])), parts[3]
                        if kv is None:
                            changed.add(ck)
                except ValueError:
                    ck = None
                if ck is None or ck[0] not in m.caches:
                    all_i += members
                    continue
                c, p = ck
                rec = m.parts[c][p]
                who = set(m.states[c][p]) | set(rec.isr) | set(m.ideal(c, p)) | set(old_isr.get(ck, ()))
                who.add(self.controller)
                if rec.primary:
                    who.add(rec.primary)
                if own:
                    who.add(own)
                all_i += len(who)
        with self._lock:
            self.events += len(events)
            self.batches += 1
            self.by_kind.update(kinds)
            self.deliver_all += all_n
            self.deliver_interest += all_i
            if changed:
                now = time.monotonic()
                for k in changed:
                    self.changed.setdefault(k, now)
                self.wake.set()


# -- the simulated members -------------------------------------------------------------
@dataclass
class Req:
    kind: str            # alter_isr / set_primary
    key: str
    rev: int
    t: float
    want: str            # the node to admit / the new primary


@dataclass
class SimCounters:
    moves: int = 0               # copies moved (MOVING -> OWNING)
    evictions: int = 0
    admissions: int = 0          # alter_isr requests put
    handoffs: int = 0            # set_primary requests put
    refused: int = 0             # requests the controller deleted without the change
    timed_out: int = 0           # requests withdrawn after REQUEST_TIMEOUT_S
    late: int = 0                # not answered in REQUEST_TIMEOUT_S, gone when withdrawn
    report_changes: int = 0      # report keys put or deleted
    report_txns: int = 0
    request_txns: int = 0        # transactions carrying the requests (a node's group commit)
    ticks: int = 0
    max_outstanding: int = 0
    request_latency: list[float] = field(default_factory=list)


class Members:
    """Every simulated member's etcd traffic: registration, reports, requests."""

    def __init__(self, etcd: Etcd, lease_ttl: int, obs: Observer, caches: tuple[CacheConfig, ...],
                 workers: int = 16) -> None:
        from concurrent.futures import ThreadPoolExecutor
        self.etcd, self.lease_ttl, self.obs = etcd, lease_ttl, obs
        self.caches = caches
        # the members act at once, as separate nodes do: their report transactions and
        # requests of one step go out through a pool of clients
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="member")
        self._tl = threading.local()
        # each member's own lease, as each node has (etcd before 3.4.27 / 3.5.10 costs a
        # plain put under a lease O(keys already on that lease): one lease for every
        # member would make every request's put O(all reports))
        self.leases: dict[str, int] = {}
        # what each node holds, as its reports in etcd say: (cache, p) -> node -> state
        self.held: dict[PartKey, dict[str, str]] = collections.defaultdict(dict)
        self._out: dict[str, dict[PartKey, str | None]] = collections.defaultdict(dict)
        self.c = SimCounters()

    @staticmethod
    def report_key(node: str, k: PartKey) -> str:
        return f"{PREFIX}/reports/{node}/{k[0]}/{k[1]}"

    def member_doc(self, node: str) -> dict[str, Any]:
        return {"address": f"10.0.{int(node[1:]) // 250}.{int(node[1:]) % 250}:7001",
                "transfer": "", "boot": "b", "leaving": False}

    def register(self, node: str, holds: list[PartKey]) -> None:
        """``ControlPlane._register``: a lease, report keys in transactions of
        REPORT_TXN_OPS, the member key in the last one. The lease is granted for the
        whole run (no keepalives are simulated)."""
        lease = self.leases[node] = self.etcd.grant(self.lease_ttl)[0]
        keys = [(self.report_key(node, k), [OWNING, 0], lease) for k in holds]
        member = (f"{PREFIX}/members/{node}", self.member_doc(node), lease)
        chunks = [keys[i:i + REPORT_TXN_OPS] for i in range(0, len(keys), REPORT_TXN_OPS)] or [[]]
        chunks[-1].append(member)
        for ch in chunks:
            self.etcd.txn([], ch)
        for k in holds:
            self.held[k][node] = OWNING

    def _client(self) -> Etcd:
        e = getattr(self._tl, "etcd", None)
        if e is None:
            e = self._tl.etcd = Etcd(self.etcd.endpoints, timeout=self.etcd.timeout)
        return e

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    def set_state(self, node: str, k: PartKey, state: str | None) -> None:
        if state is None:
            self.held[k].pop(node, None)
        else:
            self.held[k][node] = state
        self._out[node][k] = state

    def flush(self) -> None:
        """Each node's changes since its last flush in one ``put_report``: transactions
        of at most REPORT_TXN_OPS/2 puts and as many deletes."""
        half = REPORT_TXN_OPS // 2
        calls = []
        for node, ch in self._out.items():
            lease = self.leases[node]
            puts = [(self.report_key(node, k), [st, 0], lease) for k, st in sorted(ch.items()) if st]
            dels = [self.report_key(node, k) for k, st in sorted(ch.items()) if not st]
            # one node's transactions in order; nodes at once
            calls.append([(puts[i:i + half], dels[i:i + half]) for i in range(0, max(len(puts), len(dels)), half)])
            self.c.report_txns += len(calls[-1])
            self.c.report_changes += len(ch)
        self._out.clear()

        def one(txns: list[tuple[list[Any], list[str]]]) -> None:
            e = self._client()
            for pu, de in txns:
                e.txn([], pu, de)
        list(self.pool.map(one, calls))

    def requests(self, node: str, reqs: list[tuple[PartKey, dict[str, Any]]]) -> list[tuple[str, int, float]]:
        """``ControlPlane.request``'s puts of one node in one step: the node's
        ``GroupCommit`` (node/reqbatch.py) puts the requests it makes together in one
        transaction (at most MAX_OPS keys, no key twice). (key, revision, when it
        returned) of each."""
        out: list[tuple[str, int, float]] = []
        e = self._client()
        for i in range(0, len(reqs), REQUEST_TXN_OPS):
            chunk = [(f"{PREFIX}/requests/{k[0]}/{k[1]}/{node}", doc) for k, doc in reqs[i:i + REQUEST_TXN_OPS]]
            _, rev = e.txn([], [(key, doc, self.leases[node]) for key, doc in chunk])
            out += [(key, rev, time.monotonic()) for key, _ in chunk]
        return out

    def withdraw(self, r: Req) -> bool:
        ok, _ = self.etcd.txn([Etcd.mod_is(r.key, r.rev)], [], [r.key])
        return ok

    # -- the moves ----------------------------------------------------------------------
    def drive(self, targets: dict[PartKey, list[str]], moves_per_node: int, deadline: float,
              progress: bool = False) -> None:
        """Bring every partition of ``targets`` to its owners (primary first) by the
        steps real nodes take, with at most ``moves_per_node`` moves at once per node.
        A step of this loop stands for one reporter window: the MOVING reports of the
        moves a node starts, and the OWNING reports of the ones that ended (a move of a
        partition without data ends at the next step), go in one put_report."""
        queues: dict[str, collections.deque[PartKey]] = collections.defaultdict(collections.deque)
        for k in sorted(targets):
            for x in targets[k]:
                if self.held[k].get(x) != OWNING:
                    queues[x].append(k)
        active = set(targets)
        dirty = set(targets)
        busy: collections.Counter[str] = collections.Counter()
        moving: list[tuple[str, PartKey]] = []
        out: dict[PartKey, Req] = {}
        obs, h = self.obs, self.obs.holder
        last_progress, last_active, last_say = time.monotonic(), len(active), time.monotonic()
        while active or moving or out:
            now = time.monotonic()
            if now > deadline:
                raise RuntimeError(f"not done by the deadline: {len(active)} partitions active, "
                                   f"{len(out)} requests outstanding, {len(moving)} moving")
            self.c.ticks += 1
            # moves that started at the last step end (OWNING); free slots start more
            for x, k in moving:
                self.set_state(x, k, OWNING)
                busy[x] -= 1
                self.c.moves += 1
                dirty.add(k)
            moving = []
            for x, q in queues.items():
                while q and busy[x] < moves_per_node:
                    k = q.popleft()
                    self.set_state(x, k, MOVING)
                    busy[x] += 1
                    moving.append((x, k))
            self.flush()             # OWNING is in etcd before the admission request
            seen = obs.take_changed()
            dirty |= seen.keys() & active
            for k, r in list(out.items()):
                if now - r.t > REQUEST_TIMEOUT_S and k not in seen:
                    # ControlPlane.request: out of time, withdrawn (if it is still there)
                    if self.withdraw(r):
                        self.c.timed_out += 1
                    else:
                        self.c.late += 1
                    del out[k]
                    dirty.add(k)
            puts: list[tuple[str, PartKey, dict[str, Any], str, str]] = []
            with h.lock:
                m = h.map
                for k in sorted(dirty):
                    rec = m.parts[k[0]][k[1]]
                    r = out.get(k)
                    if r is not None:
                        ok = (r.want in rec.isr) if r.kind == "alter_isr" else (rec.primary == r.want)
                        if ok:
                            self.c.request_latency.append(max(0.0, seen.get(k, now) - r.t))
                            del out[k]
                        elif m.epoch >= r.rev and r.key not in self.builder_requests():
                            self.c.refused += 1
                            del out[k]
                        else:
                            continue
                    want = targets[k]
                    held = self.held[k]
                    prim = rec.primary
                    joiners = [x for x in want if held.get(x) == OWNING and x not in rec.isr]
                    if joiners and prim is not None and held.get(prim) == OWNING:
                        # the copy asks its primary (join_isr), which asks the controller
                        puts.append((prim, k, {"op": "alter_isr", "term": rec.term, "remove": [],
                                               "add": [joiners[0]]}, "alter_isr", joiners[0]))
                    elif (held.get(want[0]) == OWNING and want[0] in rec.isr and prim not in (want[0], None)
                          and held.get(prim) == OWNING):
                        # the ideal primary takes over (after fencing the old one by RPC)
                        puts.append((want[0], k, {"op": "set_primary", "previous": prim}, "set_primary", want[0]))
                    if all(n in rec.isr and held.get(n) == OWNING for n in want):
                        for d, st in list(held.items()):
                            if d not in want and st == OWNING and prim != d:
                                self.set_state(d, k, None)       # RENTING -> EVICTED: deleted
                                self.c.evictions += 1
                    if (not any(p[1] == k for p in puts[-1:]) and prim == want[0]
                            and set(rec.isr) == set(want) and set(held) == set(want)):
                        active.discard(k)
            dirty = set()
            self.flush()             # evictions
            by_node: dict[str, list[tuple[PartKey, dict[str, Any]]]] = collections.defaultdict(list)
            for node, k, doc, _, _ in puts:
                by_node[node].append((k, doc))
            order = list(by_node)
            self.c.request_txns += sum(-(-len(v) // REQUEST_TXN_OPS) for v in by_node.values())
            got = {n: iter(r) for n, r in zip(order, self.pool.map(self.requests, order,
                                                                   [by_node[n] for n in order]))}
            done = [next(got[node]) for node, _, _, _, _ in puts]
            for (node, k, doc, kind, want), (key, rev, t) in zip(puts, done):
                out[k] = Req(kind, key, rev, t, want)
                if kind == "alter_isr":
                    self.c.admissions += 1
                else:
                    self.c.handoffs += 1
            self.c.max_outstanding = max(self.c.max_outstanding, len(out))
            if len(active) != last_active:
                last_active, last_progress = len(active), time.monotonic()
            if progress and time.monotonic() - last_say > 10:
                last_say = time.monotonic()
                sys.stderr.write(f"[{time.strftime('%H:%M:%S')}]   active {len(active)}, requests "
                                 f"outstanding {len(out)}, moves {self.c.moves}, evictions "
                                 f"{self.c.evictions}, timed out {self.c.timed_out}\n")
            if not moving:
                # nothing ends at the next step: wait for the controller's answers
                obs.wake.wait(0.02 if out else 0.2)
            if time.monotonic() - last_progress > 120:
                raise RuntimeError(f"no progress for 120 s: {len(active)} active, {len(out)} outstanding")

    def builder_requests(self) -> set[str]:
        return self.obs.builder.requests


# -- the phases ------------------------------------------------------------------------
def wait_quiet(ctl: ControllerNode, obs: Observer, timeout: float = 600.0) -> dict[str, Any]:
    """Until the controller node has nothing left to look at, is at the observer's
    revision and its controller thread has used no CPU for a second."""
    deadline = time.monotonic() + timeout
    prev = None
    while time.monotonic() < deadline:
        s = ctl.call("stats")
        quiet = (s["elected"] and s["controller_dirty"] == 0 and s["pending_requests"] == 0
                 and s["revision"] >= obs.view.revision)
        if quiet and prev is not None and s["controller_cpu"] - prev["controller_cpu"] < 0.01 \
                and s["revision"] == prev["revision"]:
            return s
        prev = s if quiet else None
        time.sleep(0.5)
    raise RuntimeError("the controller node did not settle")


def wait_for(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Phase:
    """Counters of every actor at the start of a phase; ``end`` gives the deltas."""

    def __init__(self, ctl: ControllerNode | None, obs: Observer, drv: ReqStats, etcd_pid: int,
                 s: dict[str, Any] | None = None) -> None:
        self.ctl, self.obs, self.drv, self.etcd_pid = ctl, obs, drv, etcd_pid
        self.t0 = time.monotonic()
        self.c0 = s if s is not None else (ctl.call("stats") if ctl else None)
        self.o0 = obs.counters()
        self.d0 = drv.snapshot()
        self.e0 = proc_cpu(etcd_pid)
        self.p0 = time.process_time()

    def end(self, s: dict[str, Any] | None = None, wall: float | None = None) -> dict[str, Any]:
        c1 = s if s is not None else (self.ctl.call("stats") if self.ctl else None)
        o1 = self.obs.counters()
        drv = req_diff(self.d0, self.drv.snapshot())
        out: dict[str, Any] = {"wall_s": round(wall if wall is not None else time.monotonic() - self.t0, 3),
                               "etcd_cpu_s": round(proc_cpu(self.etcd_pid) - self.e0, 3),
                               "driver_process_cpu_s": round(time.process_time() - self.p0, 3)}
        ctl_req: dict[str, dict[str, int]] = {}
        if c1 is not None:
            c0 = self.c0 or {"controller_cpu": 0, "watch_cpu": 0, "keepalive_cpu": 0, "process_cpu": 0,
                             "requests": {}, "rounds": 0, "looked_at": 0, "log": {}}
            ctl_req = req_diff(c0["requests"], c1["requests"])
            logs = {k: v - c0["log"].get(k, 0) for k, v in c1["log"].items() if v - c0["log"].get(k, 0)}
            out["controller_node"] = {
                "controller_thread_cpu_s": round(c1["controller_cpu"] - c0["controller_cpu"], 3),
                "watch_thread_cpu_s": round(c1["watch_cpu"] - c0["watch_cpu"], 3),
                "process_cpu_s": round(c1["process_cpu"] - c0["process_cpu"], 3),
                "rounds": c1["rounds"] - c0["rounds"], "partitions_looked_at": c1["looked_at"] - c0["looked_at"],
                "requests": ctl_req, "log_lines": logs, "log_examples": c1.get("log_examples", {}),
                "view_reloads": c1["reloads"]}
        out["simulated_members_requests"] = drv
        total = req_sum(drv, ctl_req)
        out["etcd_requests"] = {
            "by_path": total,
            "count": sum(v["count"] for v in total.values()),
            "bytes": sum(v["bytes"] for v in total.values()),
            "max_bytes": max((v["max_bytes"] for v in total.values()), default=0)}
        ev = o1["events"] - self.o0["events"]
        node_cpu = o1["node_cpu"] - self.o0["node_cpu"]
        watch_cpu = (o1["thread_cpu"] - self.o0["thread_cpu"]) - (o1["book_cpu"] - self.o0["book_cpu"])
        out["watch"] = {
            "events": ev, "batches": o1["batches"] - self.o0["batches"],
            "by_kind": {k: v - self.o0["by_kind"].get(k, 0) for k, v in o1["by_kind"].items()
                        if v - self.o0["by_kind"].get(k, 0)},
            "deliveries_whole_prefix": o1["deliver_all"] - self.o0["deliver_all"],
            "deliveries_by_interest": o1["deliver_interest"] - self.o0["deliver_interest"],
            "observer_mapbuilder_cpu_s": round(node_cpu, 3),
            "observer_watch_thread_cpu_s": round(watch_cpu, 3),
            "observer_lookups": o1["lookups"] - self.o0["lookups"],
            "mapbuilder_us_per_event": round(node_cpu / ev * 1e6, 2) if ev else None,
            "watch_thread_us_per_event": round(watch_cpu / ev * 1e6, 2) if ev else None,
            "observer_reloads": o1["reloads"]}
        return out


def machine() -> dict[str, Any]:
    model = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "")
    except OSError:
        pass

    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        except OSError:
            return ""
    h = hashlib.sha1()
    for f in sorted(os.listdir(os.path.join(ROOT, "node"))):
        if f.endswith(".py"):
            with open(os.path.join(ROOT, "node", f), "rb") as fh:
                h.update(f.encode() + b"\0" + fh.read())
    return {"nproc": os.cpu_count(), "cpu": model, "python": platform.python_version(),
            "commit": git("rev-parse", "--short", "HEAD"),
            "node_uncommitted_files": len([x for x in git("status", "--porcelain", "node").splitlines() if x]),
            "node_tree_sha1": h.hexdigest()[:12],
            "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
            "etcd": (subprocess.run(["etcd", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
                     if shutil.which("etcd") else "")}


def run(nodes: int = 1000, partitions: int = 100_000, caches: int = 2, backups: int = 1, add: float = 0.1,
        spread: str = "direct", moves_per_node: int = 8, workdir: str | None = None,
        timeout: float = 7200.0, progress: bool = False, workers: int = 16,
        profile_dir: str | None = None) -> dict[str, Any]:
    from node.etcdserver import EtcdCluster
    logging.getLogger("ferry").setLevel(logging.WARNING)
    cfgs = layout(partitions, caches, backups)
    n_add = int(round(nodes * add))
    width = len(str(nodes + n_add - 1))
    old = node_ids(0, nodes, width)
    new = node_ids(nodes, n_add, width)
    creator = old[0]
    own_dir = workdir is None
    work = workdir or tempfile.mkdtemp(prefix="ferry-cpscale-")
    deadline = time.monotonic() + timeout
    result: dict[str, Any] = {
        "config": {"nodes": nodes, "partitions": partitions, "caches": caches, "backups": backups,
                   "added_nodes": n_add, "spread": spread, "moves_per_node": moves_per_node,
                   "member_workers": workers, "profiled": bool(profile_dir),
                   "sim_lease_ttl_s": int(timeout) + SIM_LEASE_MARGIN, "controller_lease_ttl_s": CTL_LEASE_TTL,
                   "request_timeout_s": REQUEST_TIMEOUT_S},
        "machine": machine()}
    etcd_c = EtcdCluster(os.path.join(work, "etcd")).start()
    ctl: ControllerNode | None = None
    obs: Observer | None = None
    sim: Members | None = None
    if profile_dir:
        os.makedirs(profile_dir, exist_ok=True)

    def say(msg: str) -> None:
        if progress:
            sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {msg}\n")
    try:
        etcd_pid = etcd_c.members[0].proc.pid        # type: ignore[union-attr]
        drv = ReqStats()
        instrument_etcd(drv)
        etcd = Etcd(etcd_c.endpoints, timeout=30.0)
        etcd.put(f"{PREFIX}/meta", {"caches": sorted((c.to_wire() for c in cfgs), key=lambda c: c["name"]),
                                    "created_by": creator})
        obs = Observer(Etcd(etcd_c.endpoints, timeout=30.0), cfgs, creator)
        if profile_dir:
            obs.view._loop = profiled(obs.view._loop, os.path.join(profile_dir, "observer-watch.pstats"))  # type: ignore[method-assign]
        obs.start()
        sim = Members(etcd, int(timeout) + SIM_LEASE_MARGIN, obs, cfgs, workers)
        ctl = ControllerNode(work, etcd_c.endpoints, creator, partitions, caches, backups, profile_dir)
        every = [(c.name, p) for c in cfgs for p in range(c.partitions)]

        # -- 1. create -----------------------------------------------------------------
        say(f"create: {creator} registers {len(every)} partitions OWNING, {nodes - 1} members register")
        ph = Phase(None, obs, drv, etcd_pid)
        sim.register(creator, every)
        for n in old[1:]:
            sim.register(n, [])
        wait_for(lambda: len(obs.holder.map.members) == nodes, 600, "the members in the observer's map")
        reg = ph.end()
        say(f"registered in {reg['wall_s']} s; starting the controller node")
        ph = Phase(ctl, obs, drv, etcd_pid)
        t0 = time.monotonic()
        ctl.call("start")
        wait_for(lambda: obs.records >= partitions, max(60.0, deadline - time.monotonic()), "every record")
        t_records = time.monotonic() - t0
        s = wait_quiet(ctl, obs)
        create = ph.end(s)
        create["records_wall_s"] = round(t_records, 3)
        create["records"] = obs.records
        result["registration"] = reg
        result["create"] = create
        say(f"create: every record in {t_records:.1f} s, controller thread "
            f"{create['controller_node']['controller_thread_cpu_s']} s CPU")

        # -- 2. the initial spread -------------------------------------------------------
        with obs.holder.lock:
            m = obs.holder.map
            ideal = {k: m.ideal(*k) for k in every}
        ph = Phase(ctl, obs, drv, etcd_pid, s)
        if spread == "direct":
            say("setup: placing the initial copies directly (not measured)")
            place_directly(sim, etcd, ideal, creator)
            wait_for(lambda: obs.view.revision >= etcd_rev(etcd), 600, "the observer")
        else:
            say("setup: simulating the initial spread")
            sim.drive(ideal, moves_per_node, deadline, progress)
        s = wait_quiet(ctl, obs)
        setup = ph.end(s)
        setup["mode"] = spread
        setup["measured"] = spread != "direct"
        setup["sim"] = _sim_counts(sim)
        result["setup"] = setup
        check = verify(obs, ideal)
        setup["check"] = check
        if check["bad"]:
            raise RuntimeError(f"after the setup: {check}")
        say(f"setup done in {setup['wall_s']} s; controller wrote "
            f"{setup['controller_node']['requests'].get('/kv/txn', {}).get('count', 0)} txns")

        # -- 3. +10% nodes ----------------------------------------------------------------
        sim.c = SimCounters()
        before = {k: obs.holder.map.parts[k[0]][k[1]] for k in every}
        ph = Phase(ctl, obs, drv, etcd_pid, s)
        t0 = time.monotonic()
        for n in new:
            sim.register(n, [])
        wait_for(lambda: len(obs.holder.map.members) == nodes + n_add, 600, "the new members")
        newset = set(new)
        with obs.holder.lock:
            m = obs.holder.map
            after = {k: m.ideal(*k) for k in every}
        targets = {k: after[k] for k in every if after[k] != ideal[k]}
        minimum = sum(1 for k in targets for x in after[k] if x in newset)
        say(f"+{n_add} nodes: {len(targets)} partitions change owners, rendezvous minimum {minimum} copies")
        sim.drive(targets, moves_per_node, deadline, progress)
        t_done = time.monotonic() - t0
        s = wait_quiet(ctl, obs)
        grow = ph.end(s, wall=t_done)
        check = verify(obs, after)
        final = {k: obs.holder.map.parts[k[0]][k[1]] for k in every}
        gained = sum(len(set(final[k].isr) - set(before[k].isr)) for k in every)
        grow["sim"] = _sim_counts(sim)
        ev = grow["watch"]["events"]
        moved = sim.c.moves
        grow["partitions_changed"] = len(targets)
        grow["copies_moved"] = moved
        grow["copies_gained_in_records"] = gained
        grow["rendezvous_minimum"] = minimum
        grow["expected_fraction_copies"] = round(len(every) * (backups + 1) * n_add / (nodes + n_add))
        grow["moved_over_minimum"] = round(moved / minimum, 4) if minimum else None
        grow["check"] = check
        per = moved or 1
        grow["per_moved_copy"] = {
            "etcd_requests": round(grow["etcd_requests"]["count"] / per, 2),
            "etcd_request_bytes": round(grow["etcd_requests"]["bytes"] / per, 1),
            "watch_events": round(ev / per, 2),
            "deliveries_whole_prefix": round(grow["watch"]["deliveries_whole_prefix"] / per, 1),
            "deliveries_by_interest": round(grow["watch"]["deliveries_by_interest"] / per, 1),
            "controller_thread_cpu_ms": round(grow["controller_node"]["controller_thread_cpu_s"] / per * 1e3, 3),
            "controller_process_cpu_ms": round(grow["controller_node"]["process_cpu_s"] / per * 1e3, 3),
            "etcd_cpu_ms": round(grow["etcd_cpu_s"] / per * 1e3, 3)}
        # computed, not measured: every node's watch thread pays the observer's measured
        # CPU per event for each event delivered to it
        us = grow["watch"]["watch_thread_us_per_event"] or 0.0
        grow["computed_node_watch_cpu_s"] = {
            "whole_prefix": round(grow["watch"]["deliveries_whole_prefix"] * us / 1e6, 1),
            "by_interest": round(grow["watch"]["deliveries_by_interest"] * us / 1e6, 1)}
        result["add"] = grow
        result["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        say(f"+{n_add} nodes done in {t_done:.1f} s: {moved} copies moved (minimum {minimum})")
        return result
    finally:
        if sim is not None:
            sim.close()
        if ctl is not None:
            ctl.stop()
        if obs is not None:
            obs.view.stop()
            if profile_dir and obs.view._thread is not None:
                obs.view._thread.join(10)
        if profile_dir:
            result["profile"] = {f[:-7]: profile_top(os.path.join(profile_dir, f))
                                 for f in sorted(os.listdir(profile_dir)) if f.endswith(".pstats")}
        etcd_c.stop()
        if own_dir:
            shutil.rmtree(work, ignore_errors=True)


def _sim_counts(sim: Members) -> dict[str, Any]:
    c = sim.c
    return {"moves": c.moves, "evictions": c.evictions, "admission_requests": c.admissions,
            "handoff_requests": c.handoffs, "refused": c.refused, "timed_out": c.timed_out, "late": c.late,
            "report_changes": c.report_changes, "report_txns": c.report_txns,
            "request_txns": c.request_txns, "steps": c.ticks,
            "max_outstanding_requests": c.max_outstanding,
            # from the request's put to the observer's first sight of the record applying it
            "request_latency_s": _quantiles(c.request_latency)}


def _quantiles(xs: list[float]) -> dict[str, float]:
    lat = sorted(xs)
    return ({"p50": round(lat[len(lat) // 2], 3), "p99": round(lat[int(len(lat) * 0.99)], 3),
             "max": round(lat[-1], 3)} if lat else {})


def etcd_rev(etcd: Etcd) -> int:
    """etcd's current revision (one range of the meta key)."""
    return int(etcd.post("/kv/range", {"key": _b64(f"{PREFIX}/meta")})["header"]["revision"])


def place_directly(sim: Members, etcd: Etcd, ideal: dict[PartKey, list[str]], creator: str) -> None:
    """Setup, not measured: every ideal owner's OWNING report (by node, in put_report's
    transaction size), then each record as a finished spread leaves it (primary =
    ideal[0], isr = the ideal owners; epoch and term moved on), then the creator's
    reports of partitions it does not own deleted. In that order the controller never
    sees a record naming a copy that does not report OWNING."""
    by_node: dict[str, list[PartKey]] = collections.defaultdict(list)
    for k, own in ideal.items():
        for n in own:
            if sim.held[k].get(n) != OWNING:
                by_node[n].append(k)
    half = REPORT_TXN_OPS
    for n, ks in sorted(by_node.items()):
        puts = [(sim.report_key(n, k), [OWNING, 0], sim.leases[n]) for k in ks]
        for i in range(0, len(puts), half):
            etcd.txn([], puts[i:i + half])
        for k in ks:
            sim.held[k][n] = OWNING
    m = sim.obs.holder.map
    recs = []
    for k, own in sorted(ideal.items()):
        old = m.parts[k[0]][k[1]]
        recs.append((part_key(PREFIX, *k), PartRecord(own[0], tuple(own), old.epoch + 2, False,
                                                     old.term + (own[0] != old.primary)).to_json(), 0))
    for i in range(0, len(recs), TXN_BATCH):
        etcd.txn([], recs[i:i + TXN_BATCH])
    dels = [sim.report_key(creator, k) for k, own in sorted(ideal.items()) if creator not in own]
    for i in range(0, len(dels), half):
        etcd.txn([], [], dels[i:i + half])
    for k, own in ideal.items():
        if creator not in own:
            sim.held[k].pop(creator, None)


def verify(obs: Observer, want: dict[PartKey, list[str]]) -> dict[str, Any]:
    """Every record: isr = the ideal owners, primary = ideal[0]; reports: exactly the
    ideal owners, OWNING."""
    bad = []
    no_record = 0
    with obs.holder.lock:
        m = obs.holder.map
        for (c, p), own in want.items():
            rec = m.parts[c][p]
            if not m.rec_mod[c][p]:
                no_record += 1
            states = m.states[c][p]
            if rec.primary != own[0] or set(rec.isr) != set(own) or rec.lost \
                    or set(states) != set(own) or any(v != OWNING for v in states.values()):
                bad.append(f"{c}/{p}: record {rec.primary} {list(rec.isr)} reports {states} ideal {own}")
    return {"partitions": len(want), "no_record": no_record, "bad": len(bad), "examples": bad[:5]}


def lease_probe(workdir: str | None = None, sizes: tuple[int, ...] = (0, 1000, 10_000, 100_000),
                n: int = 300) -> list[dict[str, Any]]:
    """etcd's cost of a put under a lease by the keys already on it: ``n`` puts of a
    request-sized value under the lease holding ``size`` keys (a plain put, as
    ``Etcd.put``, and a put in a transaction, as ``Etcd.txn``), under a lease of its own
    and under none. etcd before 3.4.27 / 3.5.10 checks the permission of every key on
    the lease at each plain put with a lease, auth enabled or not (etcd-io/etcd#15993);
    its transactions do not make that check."""
    from node.etcdserver import EtcdCluster
    work = workdir or tempfile.mkdtemp(prefix="ferry-leaseprobe-")
    c = EtcdCluster(os.path.join(work, "etcd")).start()
    out = []
    try:
        e = Etcd(c.endpoints, timeout=30.0)
        pid = c.members[0].proc.pid          # type: ignore[union-attr]
        lease, _ = e.grant(3600)
        attached = 0
        for size in sizes:
            while attached < size:
                e.txn([], [(f"/probe/k/{attached + i}", [OWNING, 0], lease) for i in range(REPORT_TXN_OPS)])
                attached += REPORT_TXN_OPS
            other, _ = e.grant(3600)
            doc = {"op": "alter_isr", "term": 1, "remove": [], "add": ["n1"]}
            for name, ls, txn in (("the full lease", lease, False), ("the full lease, in a txn", lease, True),
                                  ("a lease of its own", other, False), ("no lease", 0, False)):
                c0, t0 = proc_cpu(pid), time.monotonic()
                for i in range(n):
                    if txn:
                        e.txn([], [(f"/probe/req/{i}", doc, ls)])
                    else:
                        e.put(f"/probe/req/{i}", doc, lease=ls)
                out.append({"keys_on_lease": size, "put_under": name,
                            "wall_ms": round((time.monotonic() - t0) / n * 1e3, 2),
                            "etcd_cpu_ms": round((proc_cpu(pid) - c0) / n * 1e3, 2)})
    finally:
        c.stop()
        if workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    return out


# -- output ----------------------------------------------------------------------------
def _fmt_req(r: dict[str, Any]) -> str:
    return ", ".join(f"{p.rsplit('/', 1)[-1]} {v['count']}" for p, v in sorted(r["by_path"].items()))


def render(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table
    cfg, mach = res["config"], res["machine"]
    con = Console(width=140)
    con.print(f"[bold]Control plane at scale[/bold]: {cfg['nodes']} nodes x {cfg['partitions']} partitions "
              f"({cfg['caches']} caches, backups {cfg['backups']}), +{cfg['added_nodes']} nodes; "
              f"commit {mach['commit']} (node/ uncommitted files: {mach['node_uncommitted_files']}), "
              f"{mach['nproc']} cores {mach['cpu']}, {mach['date']}")
    t = Table(title="phases")
    for col in ("", "create", f"setup ({res['setup']['mode']}{'' if res['setup']['measured'] else ', NOT measured'})",
                f"+{cfg['added_nodes']} nodes"):
        t.add_column(col, justify="right")
    ph = [res["create"], res["setup"], res["add"]]

    def row(name: str, f: Any) -> None:
        vals = []
        for p in ph:
            try:
                vals.append(str(f(p)))
            except (KeyError, TypeError, ZeroDivisionError):
                vals.append("-")
        t.add_row(name, *vals)
    row("wall s", lambda p: p["wall_s"])
    row("controller thread CPU s", lambda p: p["controller_node"]["controller_thread_cpu_s"])
    row("controller node watch thread CPU s", lambda p: p["controller_node"]["watch_thread_cpu_s"])
    row("controller node process CPU s", lambda p: p["controller_node"]["process_cpu_s"])
    row("controller rounds / partitions looked at",
        lambda p: f"{p['controller_node']['rounds']} / {p['controller_node']['partitions_looked_at']}")
    row("etcd CPU s", lambda p: p["etcd_cpu_s"])
    row("etcd requests", lambda p: p["etcd_requests"]["count"])
    row("  by path", lambda p: _fmt_req(p["etcd_requests"]))
    row("request MiB", lambda p: round(p["etcd_requests"]["bytes"] / 2**20, 1))
    row("largest request KiB", lambda p: round(p["etcd_requests"]["max_bytes"] / 1024, 1))
    row("watch events", lambda p: p["watch"]["events"])
    row("observer MapBuilder+lookups us/event", lambda p: p["watch"]["mapbuilder_us_per_event"])
    row("observer watch thread us/event", lambda p: p["watch"]["watch_thread_us_per_event"])
    con.print(t)
    a = res["add"]
    t2 = Table(title=f"+{cfg['added_nodes']} nodes")
    t2.add_column("")
    t2.add_column("value", justify="right")
    pm = a["per_moved_copy"]
    for name, val in [
        ("partitions whose owners changed", a["partitions_changed"]),
        ("copies moved (measured)", a["copies_moved"]),
        ("rendezvous minimum ((partition, new node) pairs)", a["rendezvous_minimum"]),
        ("moved / minimum", a["moved_over_minimum"]),
        ("admission / hand-off requests", f"{a['sim']['admission_requests']} / {a['sim']['handoff_requests']}"),
        ("refused / timed out requests", f"{a['sim']['refused']} / {a['sim']['timed_out']}"),
        ("request latency p50 / p99 / max s", "/".join(str(a["sim"]["request_latency_s"].get(x, "-"))
                                                       for x in ("p50", "p99", "max"))),
        ("etcd requests per moved copy", pm["etcd_requests"]),
        ("request bytes per moved copy", pm["etcd_request_bytes"]),
        ("watch events per moved copy", pm["watch_events"]),
        ("deliveries per moved copy, whole prefix (computed)", pm["deliveries_whole_prefix"]),
        ("deliveries per moved copy, by interest (computed)", pm["deliveries_by_interest"]),
        ("controller thread CPU ms per moved copy", pm["controller_thread_cpu_ms"]),
        ("controller process CPU ms per moved copy", pm["controller_process_cpu_ms"]),
        ("etcd CPU ms per moved copy", pm["etcd_cpu_ms"]),
        ("all nodes' watch CPU s, whole prefix / by interest (computed)",
         f"{a['computed_node_watch_cpu_s']['whole_prefix']} / {a['computed_node_watch_cpu_s']['by_interest']}"),
        ("check", f"{a['check']['bad']} bad of {a['check']['partitions']}"),
    ]:
        t2.add_row(name, str(val))
    con.print(t2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=100_000)
    ap.add_argument("--caches", type=int, default=2)
    ap.add_argument("--backups", type=int, default=1)
    ap.add_argument("--add", type=float, default=0.1, help="fraction of nodes added (default 0.1)")
    ap.add_argument("--spread", choices=("direct", "simulate"), default="direct",
                    help="the initial spread: placed directly (setup, not measured) or simulated")
    ap.add_argument("--moves-per-node", type=int, default=8,
                    help="moves at once per node (a node's default: 2 x transfer.concurrency = 8)")
    ap.add_argument("--workers", type=int, default=16,
                    help="etcd clients the simulated members' requests of one step go through at once")
    ap.add_argument("--profile-dir", default=None,
                    help="run the controller node's threads and the observer under cProfile, stats "
                         "here (slower: the CPU figures of such a run are not the code's)")
    ap.add_argument("--timeout", type=float, default=7200.0)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    # the controller node process
    ap.add_argument("--controller-node", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--me", help=argparse.SUPPRESS)
    ap.add_argument("--prefix", default=PREFIX, help=argparse.SUPPRESS)
    ap.add_argument("--endpoints", nargs="*", help=argparse.SUPPRESS)
    ap.add_argument("--lease-probe", action="store_true",
                    help="only measure etcd's cost of a put under a lease by the keys already on it")
    a = ap.parse_args(argv)
    if a.controller_node:
        controller_node_main(a)
        return 0
    if a.lease_probe:
        rows = lease_probe(a.workdir)
        if a.json:
            print(json.dumps(rows, indent=1))
        else:
            for r in rows:
                print(f"{r['keys_on_lease']:7d} keys on the lease, put under {r['put_under']:24s}: "
                      f"{r['wall_ms']:6.2f} ms wall, {r['etcd_cpu_ms']:6.2f} ms etcd CPU")
        return 0
    res = run(a.nodes, a.partitions, a.caches, a.backups, a.add, a.spread, a.moves_per_node, a.workdir,
              a.timeout, progress=not a.quiet, workers=a.workers, profile_dir=a.profile_dir)
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        render(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
