"""Two read patterns played step by step on a real cluster, each ending in a history
that the linearizability checker reads. Deterministic: every step waits for what it
needs (a new primary in the majority's map), nothing races a workload.

``etcd-cut-primary`` -- a primary cut from etcd only, with a reader that reaches only it:

  1. ``k`` = v1 through the cluster (its primary P acknowledges); the reader reads it at P;
  2. P is cut from etcd (its peers and the clients still reach it);
  3. the other nodes' map names a new primary of k's partition (P's lease ended);
  4. ``k`` = v2 through the cluster, acknowledged by the new primary;
  5. the reader reads ``k`` at P, several times. A primary serving reads without its
     lease answers v1 there: a stale read, after v2 was acknowledged.

``isolated-write-in-flight`` -- a primary isolated while a write is in flight, with a
reader that reaches only it:

  1. ``k`` = v1 through the cluster, read at P;
  2. P is isolated (peers and etcd) and at once ``k`` = v2 is sent to P alone: P applies
     it, cannot replicate it nor shrink its in-sync set, answers "NOT acknowledged"
     (the case needs that outcome, unknown; it says so when the write came too late);
  3. the reader reads ``k`` at P: a primary that shows unacknowledged updates answers v2;
  4. the majority's map names a new primary (it never got v2); ``k`` is read there (v1),
     ``k`` = v3 is written there, and the reader reads at P again.

Each reader's read is one call to P's port, no retry: the reader reaches only P. The
writes use the client's routing and retries without a request id, and no read passes
an option, so the cases run unchanged against an older checkout of the node (copy
``cluster_sim/`` into it and run them there: that is how they were seen to fail before
reads were made linearizable).

    python -m cluster_sim.readcases etcd-cut-primary [--keep] [--tls]
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .drivers.cluster import ClusterDriver
from .history import INFO, READ, WRITE, History, Operation
from .linearizable import Result, check, describe
from .scenario import CacheSpec, Event, Scenario, WorkloadSpec
from .timeline import Timeline
from .workload import Model

CACHE = "default"
KEY = b"lin-key"
CALL_TIMEOUT_S = 8.0          # one reader's call; a node's replication timeout is 5 s
PRIMARY_WAIT_S = 20.0         # a new primary: the lease TTL (2 s) and a decision, with room
STABLE_S = 3.0                # the maps unchanged this long before a case starts (no hand-off coming)


@dataclass
class CaseResult:
    name: str
    ops: list[Operation]
    result: Result
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    exercised: bool = True        # the fault landed as the case needs (see the notes)

    def report(self, t0: float = 0.0) -> list[str]:
        out = [f"{self.name}: {'linearizable' if self.result.ok else 'NOT linearizable'} "
               f"({len(self.ops)} operations, {self.seconds:.1f}s)"]
        out += [f"  {n}" for n in self.notes]
        for kr in self.result.failures:
            out += describe(kr, t0)
        return out


class _Case:
    """A 3-node cluster of the ClusterDriver (RPC proxies, a control proxy per node),
    the history, and the calls the steps make."""

    def __init__(self, name: str, run_dir: str, *, tls: bool = False) -> None:
        self.name, self.dir = name, run_dir
        scenario = Scenario(name=name, nodes=("n1", "n2", "n3"), proxy=True, tls=tls,
                            caches=(CacheSpec(partitions=4, backups=1),), workload=WorkloadSpec(ops=0),
                            # (never fired: it makes the driver give each node control proxies)
                            events=(Event(0, "isolate", "n1"),), settle_timeout=60.0)
        self.timeline = Timeline()
        self.history = History()
        self.notes: list[str] = []
        self.exercised = True       # the fault landed as the case needs
        self.d = ClusterDriver(scenario, 1, run_dir, self.timeline, Model(), None)
        from node import partition_of
        self.pool = self.d.client_pool(timeout=CALL_TIMEOUT_S)
        self.partition = partition_of(KEY, 4)
        self.clients: list[Any] = []

    # -- the cluster -----------------------------------------------------------------
    def start(self) -> None:
        self.d.start()
        deadline = time.monotonic() + 90
        last, since = None, time.monotonic()
        while True:
            now = self.layout()
            if now != last:
                last, since = now, time.monotonic()
            elif now is not None and time.monotonic() - since >= STABLE_S:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: no stable layout with an in-sync backup of k's "
                                   f"partition in every node's map within 90 s: {last}")
            time.sleep(0.2)

    def layout(self) -> tuple[object, ...] | None:
        """Every node's map, when they agree: three live members, no move, every
        partition's primary and in-sync set (k's with a backup). Stable for STABLE_S,
        no hand-off is on its way. (Not the driver's ``settled``: the nodes may run
        another checkout, whose placement the harness need not share.)"""
        seen = set()
        for n in ("n1", "n2", "n3"):
            m = self.map_of(n)
            if m is None or len(m.alive()) != 3 or m.moves:
                return None
            if len(m.parts[CACHE][self.partition].isr) < 2:
                return None
            seen.add(tuple((r.primary, tuple(sorted(r.isr))) for r in m.parts[CACHE]))
        return seen.pop() if len(seen) == 1 else None

    def map_of(self, node: str) -> Any:
        """``node``'s map; the plain ``get_map`` of a node that pages no map (another
        checkout) when the driver's paged fetch gets nothing."""
        m = self.d.map_of(node)
        if m is not None:
            return m
        from node import ClusterMap
        try:
            return ClusterMap.from_wire(self.pool.call(self.d.address(node), "get_map", timeout=5.0))
        except Exception:  # noqa: BLE001 - down or restarting
            return None

    def primary(self, seen_by: str) -> str | None:
        m = self.map_of(seen_by)
        return m.parts[CACHE][self.partition].primary if m is not None else None

    def majority(self, without: str) -> Any:
        """A client of the other nodes (normal routing, retries)."""
        c = self.d.new_client([self.d.address(n) for n in ("n1", "n2", "n3") if n != without],
                              timeout=15.0)
        self.clients.append(c)
        return c

    def wait_new_primary(self, old: str, seen_by: str) -> str:
        deadline = time.monotonic() + PRIMARY_WAIT_S
        while time.monotonic() < deadline:
            p = self.primary(seen_by)
            if p is not None and p != old:
                self.timeline.mark(p, "new primary", f"of {CACHE}/{self.partition} in {seen_by}'s map")
                return p
            time.sleep(0.1)
        raise RuntimeError(f"{self.name}: {seen_by}'s map named no new primary within {PRIMARY_WAIT_S}s")

    # -- operations, recorded ------------------------------------------------------------
    def op(self, process: str, kind: str, value: bytes | None, call: Callable[[], Any],
           via: str) -> Operation:
        h = self.history.invoke(process, kind, KEY, value if kind == WRITE else None, via=via)
        try:
            got = call()
        except Exception as e:  # noqa: BLE001 - every failure is a recorded outcome
            self.history.failed(h, e)
        else:
            self.history.ok(h, got if kind == READ else None)
        return self.history.ops[h]

    def read_at(self, node: str, process: str = "reader") -> Operation:
        """One read at ``node``'s own port: the reader reaches only it."""
        return self.op(process, READ, None, lambda: self.pool.call(self.d.address(node), "get",
                                                                      cache=CACHE, key=KEY), node)

    def write_at(self, node: str, value: bytes, process: str = "writer-2") -> Operation:
        return self.op(process, WRITE, value, lambda: self.pool.call(self.d.address(node), "put",
                                                                       cache=CACHE, key=KEY, value=value),
                       node)

    def close(self) -> None:
        for c in self.clients:
            c.close()
        self.pool.close()
        try:
            self.d.stop()
        finally:
            self.d.cleanup()


def etcd_cut_primary(c: _Case) -> None:
    p = c.primary("n1")
    assert p is not None
    others = [n for n in ("n1", "n2", "n3") if n != p]
    writer = c.majority(without="")
    c.notes.append(f"{CACHE}/{c.partition} (key {KEY.decode()}): primary {p}")
    c.op("writer", WRITE, b"v1", lambda: put(writer, b"v1"), "cluster")
    c.read_at(p)
    c.d.partitions.cut_control(p)
    new = c.wait_new_primary(p, others[0])
    c.notes.append(f"{p} cut from etcd; {others[0]}'s map names {new}")
    c.op("writer", WRITE, b"v2", lambda: put(writer, b"v2"), "cluster")
    answers = []
    for _ in range(5):
        answers.append(c.read_at(p))
        time.sleep(0.1)
    c.notes.append("reads at " + p + " after v2: " + ", ".join(_outcome(o) for o in answers))
    c.d.partitions.heal()


def isolated_write_in_flight(c: _Case) -> None:
    p = c.primary("n1")
    assert p is not None
    others = [n for n in ("n1", "n2", "n3") if n != p]
    writer = c.majority(without="")
    c.notes.append(f"{CACHE}/{c.partition} (key {KEY.decode()}): primary {p}")
    c.op("writer", WRITE, b"v1", lambda: put(writer, b"v1"), "cluster")
    c.read_at(p)
    c.d.partitions.isolate(p)
    w2 = c.write_at(p, b"v2")
    c.exercised = w2.status == INFO
    c.notes.append(f"{p} isolated; v2 sent to {p} alone: {_outcome(w2)}")
    r = c.read_at(p)
    c.notes.append(f"read at {p} right after: {_outcome(r)}")
    new = c.wait_new_primary(p, others[0])
    majority = c.majority(without=p)
    c.op("reader-2", READ, None, lambda: majority.get(CACHE, KEY), "cluster")
    c.op("writer", WRITE, b"v3", lambda: put(majority, b"v3"), "cluster")
    r = c.read_at(p)
    c.notes.append(f"new primary {new}; read at {p} after v3: {_outcome(r)}")
    c.d.partitions.heal()


def put(client: Any, value: bytes) -> Any:
    """The client's routing and retries, without a request id: the same call to a node
    of this checkout and to one of an older one."""
    return client._call_primary(CACHE, KEY, "put", value=value)


def _outcome(op: Operation) -> str:
    if op.status == "ok":
        return f"ok {op.value!r}" if op.kind == READ else "ok"
    return f"{op.status} ({op.error[:90]})"


CASES: dict[str, Callable[[_Case], None]] = {
    "etcd-cut-primary": etcd_cut_primary,
    "isolated-write-in-flight": isolated_write_in_flight,
}


def run_case(name: str, workdir: str | None = None, *, keep: bool = False,
             tls: bool = False) -> CaseResult:
    """Play case ``name`` on a fresh cluster (``tls``: its links mutual TLS, the
    reader and writers with a client certificate); its history checked."""
    run_dir = tempfile.mkdtemp(prefix=f"readcase-{name}-", dir=workdir)
    t0 = time.monotonic()
    c = _Case(name, run_dir, tls=tls)
    try:
        c.start()
        CASES[name](c)
    finally:
        c.close()
    ops = c.history.snapshot()
    res = CaseResult(name, ops, check(ops), c.notes, round(time.monotonic() - t0, 1), c.exercised)
    if res.result.ok and not keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        res.notes.append(f"run folder: {run_dir}")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--tls", action="store_true", help="mutual TLS between nodes and clients")
    args = ap.parse_args()
    res = run_case(args.case, keep=args.keep, tls=args.tls)
    t0 = min((o.call for o in res.ops), default=0.0)
    print("\n".join(res.report(t0)))
    for op in res.ops:
        print(f"  {op.process:>9} {op.kind:<5} {op.call - t0:7.2f}s via {op.via:<8} {_outcome(op)}")
    raise SystemExit(0 if res.result.ok else 1)


if __name__ == "__main__":
    main()
