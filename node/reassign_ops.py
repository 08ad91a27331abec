"""The operator's side of reassignment plans (``ferry cluster reassign ...``, ``ferry
cluster drain``): read the cluster from etcd, store or cancel a plan, and say where
each move stands. The controller applies the plans (node/reassign.py); nothing here
writes a pin.

Reads come from etcd in one range of the cluster's prefix (the map is built with the
nodes' own code, :func:`node.mapview.map_from_keys`). The figures of a running move
(bytes, rate, ETA, the engine's stage) live only in the node that runs it: with the
cluster secret, :func:`status` asks the moving nodes (RPC ``moves``) twice, ``sample``
seconds apart, so that a move that advanced in between shows a current rate and a
last-progress time of now.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypedDict, cast

from . import schema
from .cluster_map import ClusterMap
from .control import KV, Etcd
from .errors import ConfigError, NodeError, PlanError
from .jsonvalue import Json, JsonDoc, MoveDoc
from .mapview import map_from_keys
from .reassign import (CANCELLED, DONE, IN_SYNC, MOVING, NAME, RATE_SETTING, STAGES, TERMINAL, WAITING,
                       Move, Plan, assess, check, generate, plan_key, plans_from, stored_doc,
                       why_not_placeable)
from .settings import parse as parse_setting
from .rpcapi import Moves as MovesQuery
from .wire import Pool

NodeMoves = dict[tuple[str, int, str], MoveDoc]   # (cache, p, demander) -> its `moves` entry

# one move of a plan's status (``plan_status``)
PlanMoveDoc = TypedDict("PlanMoveDoc", {
    "cache": str, "partition": int, "from": list[str], "to": list[str], "stage": str,
    "waits_for": "str | None", "started": "float | None", "finished": "float | None",
    "last_progress": "float | None", "node_stage": "str | None", "bytes": "int | None",
    "bytes_total": "int | None", "rate_bps": "float | None", "eta_s": "float | None",
})


class PlanDoc(TypedDict):
    """One plan's status (``plan_status``), as ``--json`` prints it."""
    plan: str
    state: str
    created: float
    max_moves: int
    throttle: int | None
    reason: object
    ended: object
    counts: dict[str, int]
    moves: list[PlanMoveDoc]


class PlansDoc(TypedDict):
    """``ferry reassign status --json``."""
    revision: int
    plans: list[PlanDoc]


class VerifyMoveDoc(TypedDict):
    cache: str
    partition: int
    to: list[str]
    ok: bool
    primary: str | None
    in_sync: list[str]
    problem: str | None


class VerifyDoc(TypedDict):
    """``ferry reassign verify --json``."""
    plan: str
    state: str
    ok: bool
    moves: list[VerifyMoveDoc]


@dataclass
class Snapshot:
    """The cluster as etcd holds it at one revision. ``whole`` False: only one plan's
    keys, the members and the cluster record were read (:func:`read` with ``plan``):
    the map has no partition states or records."""
    m: ClusterMap
    kvs: dict[str, KV]
    revision: int
    plans: dict[str, Plan]
    whole: bool = True


def read(etcd: Etcd, prefix: str, plan: str | None = None) -> Snapshot:
    """Everything under the prefix (one range); with ``plan``, only what following that
    plan needs: its keys, the members, ``P/meta``: a poll that costs the plan's size,
    not the cluster's."""
    if plan is None:
        rev, kvs = etcd.range_prefix(prefix + "/")
    else:
        base = plan_key(prefix, plan)
        rev, kvs = etcd.range_prefix(base)        # (also "<plan>x...": filtered below)
        kvs = {k: v for k, v in kvs.items() if k == base or k.startswith(base + "/")}
        kvs.update(etcd.range_prefix(f"{prefix}/members/")[1])
        meta = etcd.get(f"{prefix}/meta")
        if meta is not None:
            kvs[f"{prefix}/meta"] = meta
    kv = kvs.get(f"{prefix}/meta")
    if kv is None:
        raise PlanError(f"no Ferry cluster under the prefix {prefix} in this etcd (no {prefix}/meta); "
                        "check --control-plane and --prefix")
    try:
        caches = schema.meta(f"{prefix}/meta", kv).caches
    except schema.Malformed as e:
        raise PlanError(f"the cluster record is malformed: {e}") from None
    m = map_from_keys(kvs, rev, prefix, caches)[0]
    head = f"{prefix}/reassign/"
    plans = plans_from(((k[len(head):], v) for k, v in kvs.items() if k.startswith(head)), m.caches)
    return Snapshot(m, kvs, rev, plans, plan is None)


def state_of(pl: Plan) -> str:
    if pl.end is not None:
        return str(pl.end.get("state"))
    return "cancelling" if pl.cancel else "running"


# -- execute, cancel --------------------------------------------------------------------------
def execute(etcd: Etcd, prefix: str, name: str, moves: Sequence[Move], *, max_moves: int = 0,
            throttle: int | None = None) -> int:
    """Check the plan against the cluster now and store it for the controller; returns
    the revision. A plan of the same name that ended is replaced (its progress goes);
    a running one is refused, as is a move of a partition another running plan moves.
    ``throttle`` sets the cluster setting transfer.rate_limit (the controller puts the
    previous value back when the plan ends); one throttled plan at a time."""
    if not NAME.fullmatch(name):
        raise PlanError(f"plan name {name!r}: use 1-64 letters, digits, '_', '.' or '-'")
    if max_moves < 0:
        raise PlanError(f"--max-moves {max_moves}: 0 (no bound) or more")
    snap = read(etcd, prefix)
    check(moves, snap.m)
    old = snap.plans.get(name)
    if old is not None and old.end is None:
        raise PlanError(f"plan {name} is still {state_of(old)}; wait for it, cancel it "
                        f"(ferry cluster reassign cancel {name}) or choose another --name")
    mine = {(mv.cache, mv.partition): i for i, mv in enumerate(moves)}
    for other in snap.plans.values():
        if other.end is not None or other.name == name:
            continue
        for j, mv in enumerate(other.moves):
            i = mine.get((mv.cache, mv.partition))
            if i is not None and other.stage_of(j) not in TERMINAL:
                raise PlanError(f"moves[{i}] ({mv.cache}/{mv.partition}): plan {other.name} moves this "
                                "partition and is still running; cancel it or leave the partition out")
        if throttle is not None and other.throttle is not None:
            raise PlanError(f"plan {other.name} holds a throttle already: run without --throttle and "
                            f"change {RATE_SETTING} with `ferry cluster settings set`")
    setting = f"{prefix}/settings/{RATE_SETTING}"
    puts: list[tuple[str, Json, int]] = []
    before: Json = None
    if throttle is not None:
        try:                                    # checked like `settings set`
            parse_setting(RATE_SETTING, str(throttle))
        except ConfigError as e:
            raise PlanError(f"--throttle: {e}") from None
        cur = snap.kvs.get(setting)
        before = cur.value if cur is not None else None
        puts.append((setting, throttle, 0))
    key = plan_key(prefix, name)
    puts.insert(0, (key, stored_doc(moves, max_moves=max_moves, throttle=throttle, throttle_before=before), 0))
    ok, rev = etcd.txn([Etcd.mod_is(key, old.mod if old else 0)], puts, [], prefixes=[key + "/"])
    if not ok:
        raise PlanError(f"plan {name} was stored by someone else meanwhile; look at it "
                        f"(ferry cluster reassign status {name}) and try again")
    return rev


def cancel(etcd: Etcd, prefix: str, name: str, wait_s: float = 30.0) -> Plan:
    """Ask the controller to cancel the plan and wait (up to ``wait_s``) until it has:
    the moves not done get the pin they replaced back. Returns the plan as it ended,
    or as it stands when the wait ran out (its end is then None)."""
    key = plan_key(prefix, name)
    pl = read(etcd, prefix, name).plans.get(name)
    if pl is None:
        raise PlanError(f"no plan {name} (ferry cluster reassign status lists them)")
    if pl.end is not None:
        raise PlanError(f"plan {name} has ended already: {state_of(pl)}")
    kv = etcd.get(key)
    if kv is None or not isinstance(kv.value, dict):
        raise PlanError(f"plan {name} is gone")
    if not pl.cancel:
        ok, _ = etcd.txn([Etcd.mod_is(key, kv.mod)], [(key, {**kv.value, "cancel": True}, 0)])
        if not ok:
            raise PlanError(f"plan {name} changed meanwhile; try again")
    deadline = time.monotonic() + wait_s
    while True:
        pl = read(etcd, prefix, name).plans[name]
        if pl.end is not None or time.monotonic() >= deadline:
            return pl
        time.sleep(0.2)


# -- where the moves stand --------------------------------------------------------------------
def node_moves(pool: Pool | None, m: ClusterMap, nodes: set[str]) -> NodeMoves:
    """The moves the given nodes run now (RPC ``moves``); a node that does not answer
    contributes nothing."""
    out: NodeMoves = {}
    if pool is None:
        return out
    for n in sorted(nodes):
        addr = m.address(n)
        if addr is None:
            continue
        try:
            running = pool.request(addr, MovesQuery(), timeout=5.0)
        except NodeError:
            continue
        for mv in running:
            cache, p, to = mv.get("cache"), mv.get("partition"), mv.get("to")
            if isinstance(cache, str) and isinstance(p, int) and isinstance(to, str):
                out[(cache, p, to)] = cast(MoveDoc, mv)   # as the node reports it
    return out


def _waiting(snap: Snapshot, pl: Plan, i: int) -> str:
    mv = pl.moves[i]
    for other in snap.plans.values():
        if other.name != pl.name and other.end is None and any(
                (other.moves[j].cache, other.moves[j].partition) == (mv.cache, mv.partition)
                for j in other.in_flight()):
            return f"plan {other.name} to finish its move of this partition"
    gone = [why for n in mv.to if (why := why_not_placeable(snap.m, n))]
    if gone:
        return "; ".join(gone)
    if not pl.max_moves:
        return "the controller to start it"
    return f"a free slot: {len(pl.in_flight())} of the plan's moves in flight (max-moves {pl.max_moves})"


def _progressed(now: MoveDoc, before: MoveDoc | None) -> bool:
    if before is None:
        return False
    return (now.get("stage") != before.get("stage") or now.get("bytes") != before.get("bytes")
            or now.get("replayed") != before.get("replayed")
            or cast(JsonDoc, now).get("buffered") != cast(JsonDoc, before).get("buffered"))


def plan_status(snap: Snapshot, pl: Plan, live: NodeMoves | None = None,
                earlier: NodeMoves | None = None, dt: float = 0.0) -> PlanDoc:
    """Per move: stage, what it waits for, bytes, rate, ETA, last progress (wall time).
    ``live`` are the nodes' moves now, ``earlier`` the same ``dt`` seconds before."""
    t = time.time()
    rows: list[PlanMoveDoc] = []
    counts = {s: 0 for s in STAGES}
    for i, mv in enumerate(pl.moves):
        pr = pl.progress.get(i)
        stage = pl.stage_of(i)
        row: PlanMoveDoc = {"cache": mv.cache, "partition": mv.partition, "from": list(mv.source), "to": list(mv.to),
                        "stage": stage, "waits_for": None, "started": pr.started if pr else None,
                        "finished": pr.finished if pr else None, "last_progress": pr.since if pr else None,
                        "node_stage": None, "bytes": None, "bytes_total": None, "rate_bps": None, "eta_s": None}
        if stage == WAITING:
            row["waits_for"] = _waiting(snap, pl, i)
        elif stage not in TERMINAL:
            if snap.whole:                 # fresher than the controller's note
                st, waits = assess(snap.m, mv.cache, mv.partition, mv.to)
                row["stage"], row["waits_for"] = (st, waits) if st != DONE else (IN_SYNC, "the controller to record it done")
            else:
                assert pr is not None
                row["waits_for"] = pr.waits
            for n in mv.to:
                nm = (live or {}).get((mv.cache, mv.partition, n))
                if nm is None:
                    continue
                row["node_stage"], row["bytes"] = nm.get("stage"), nm.get("bytes")
                row["bytes_total"], row["rate_bps"], row["eta_s"] = (nm.get("bytes_total"), nm.get("rate_bps"),
                                                                     nm.get("eta_s"))
                row["waits_for"] = (f"{n} to finish its move: {nm.get('stage')} from {nm.get('from')}"
                                    + (f", {int(nm.get('bytes') or 0) / 1e6:.1f} of "
                                       f"{int(nm.get('bytes_total') or 0) / 1e6:.1f} MB"
                                       if nm.get("bytes_total") else ""))
                old = (earlier or {}).get((mv.cache, mv.partition, n))
                if _progressed(nm, old):
                    row["last_progress"] = round(t, 3)
                    if old is not None and dt > 0 and nm.get("stage") == old.get("stage"):
                        row["rate_bps"] = round((int(nm.get("bytes") or 0) - int(old.get("bytes") or 0)) / dt, 1)
                break
        counts[str(row["stage"])] += 1
        rows.append(row)
    return {"plan": pl.name, "state": state_of(pl), "created": pl.created, "max_moves": pl.max_moves,
            "throttle": pl.throttle, "reason": (pl.end or {}).get("reason") or pl.refused,
            "ended": (pl.end or {}).get("at"), "counts": counts, "moves": rows}


def status(snap: Snapshot, name: str | None, pool: Pool | None = None, sample: float = 1.0) -> PlansDoc:
    """``{"plans": [plan_status ...]}`` of one plan or of every stored plan (newest
    first); with a pool, the moving nodes are asked for their figures."""
    if name is not None and name not in snap.plans:
        raise PlanError(f"no plan {name}; stored plans: {', '.join(sorted(snap.plans)) or 'none'}")
    plans = [snap.plans[name]] if name is not None else sorted(snap.plans.values(), key=lambda p: -p.created)
    movers = {n for pl in plans if pl.end is None for i in pl.in_flight() for n in pl.moves[i].to}
    earlier = live = None
    dt = 0.0
    if pool is not None and movers:
        t0 = time.monotonic()
        earlier = node_moves(pool, snap.m, movers)
        if sample > 0:
            time.sleep(sample)
            live = node_moves(pool, snap.m, movers)
            dt = time.monotonic() - t0
        else:
            live, earlier = earlier, None
    return {"revision": snap.revision, "plans": [plan_status(snap, pl, live, earlier, dt) for pl in plans]}


def verify(snap: Snapshot, name: str) -> VerifyDoc:
    """Is every partition of the plan held by its target owners, OWNING and in sync,
    the first one primary, nobody else holding a copy? ``ok`` says."""
    pl = snap.plans.get(name)
    if pl is None:
        raise PlanError(f"no plan {name}; stored plans: {', '.join(sorted(snap.plans)) or 'none'}")
    rows: list[VerifyMoveDoc] = []
    for mv in pl.moves:
        stage, waits = assess(snap.m, mv.cache, mv.partition, mv.to)
        rec = snap.m.parts[mv.cache][mv.partition]
        rows.append({"cache": mv.cache, "partition": mv.partition, "to": list(mv.to), "ok": stage == DONE,
                     "primary": rec.primary, "in_sync": list(rec.isr),
                     "problem": None if stage == DONE else f"{stage}: waits for {waits}"})
    return {"plan": name, "state": state_of(pl), "ok": all(bool(r["ok"]) for r in rows), "moves": rows}


def holdings(m: ClusterMap, node: str) -> list[str]:
    """The partitions ``node`` still reports or is in sync for."""
    return [f"{c}/{p}" for c, lst in m.states.items() for p, st in enumerate(lst)
            if node in st or node in m.parts[c][p].isr]


# -- waiting for a plan -----------------------------------------------------------------------
def wait(etcd: Etcd, prefix: str, name: str, *, pool: Pool | None, timeout: float,
         report: Callable[[PlanDoc], None], every: float = 1.0) -> PlanDoc:
    """Poll the plan until it ends or ``timeout`` (0: none) runs out; ``report`` gets
    each status (``plan_status``). Returns the last one."""
    deadline = time.monotonic() + timeout if timeout > 0 else None
    while True:
        t0 = time.monotonic()
        snap = read(etcd, prefix, name)
        doc = status(snap, name, pool, sample=every)["plans"][0]
        report(doc)
        if doc["state"] not in ("running", "cancelling"):
            return doc
        if deadline is not None and time.monotonic() >= deadline:
            return doc
        time.sleep(max(0.0, every - (time.monotonic() - t0)))     # (status may have sampled)


def _moves(doc: PlanDoc) -> list[PlanMoveDoc]:
    mvs = doc.get("moves")
    return [mv for mv in mvs if isinstance(mv, dict)] if isinstance(mvs, list) else []


def summary_line(doc: PlanDoc) -> str:
    """``drain-n3 running: 3/8 done, 2 moving, 3 waiting; 4.1 MB/s``"""
    counts = doc["counts"]
    assert isinstance(counts, dict)
    moves = _moves(doc)
    parts = [f"{counts[DONE]}/{len(moves)} done"] + [f"{counts[s]} {s}" for s in (MOVING, IN_SYNC, WAITING, CANCELLED)
                                                   if counts.get(s)]
    rate = sum(float(mv["rate_bps"] or 0) for mv in moves if mv["stage"] == MOVING)
    return f"{doc['plan']} {doc['state']}: {', '.join(parts)}" + (f"; {rate / 1e6:.1f} MB/s" if rate else "")


ROWS = 40        # a plan's table lists at most this many moves not done (all of them up to 64 moves)


def _ago(t: object, now: float) -> str:
    if not isinstance(t, (int, float)):
        return "-"
    s = max(0.0, now - float(t))
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago"


def render(doc: PlansDoc, *, with_figures: bool = True, width: int | None = None) -> str:
    """``status``'s document as text: per plan a summary line and a table of its moves
    (past 64 moves, only those not done, at most ROWS)."""
    import io
    import shutil
    import sys

    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    now = time.time()
    width = width or (shutil.get_terminal_size((140, 24)).columns if sys.stdout.isatty() else 140)
    buf = io.StringIO()
    out = Console(file=buf, width=width, no_color=True, color_system=None, highlight=False)
    plans = doc.get("plans")
    for pl in plans if isinstance(plans, list) else []:
        assert isinstance(pl, dict)
        extra = [f"created {_ago(pl.get('created'), now)}"]
        if pl.get("max_moves"):
            extra.append(f"max-moves {pl['max_moves']}")
        if pl.get("throttle") is not None:
            extra.append(f"throttle {pl['throttle']} B/s")
        if pl.get("reason"):
            extra.append(f"reason: {pl['reason']}")
        out.print(escape(summary_line(pl) + f" ({', '.join(extra)})"))
        moves = _moves(pl)
        rows = moves if len(moves) <= 64 else [mv for mv in moves if mv["stage"] not in TERMINAL][:ROWS]
        if not rows:
            continue
        t = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
        for col, right in (("partition", False), ("from -> to", False), ("stage", False), ("MB", True),
                           ("MB/s", True), ("ETA", True), ("last progress", True), ("waits for", False)):
            t.add_column(col, justify="right" if right else "left", no_wrap=col != "waits for")
        for mv in rows:
            mb = (f"{int(mv['bytes'] or 0) / 1e6:.1f}/{int(mv['bytes_total'] or 0) / 1e6:.1f}"
                  if mv.get("bytes_total") else "-")
            t.add_row(f"{escape(mv['cache'])}/{mv['partition']}",
                      escape(f"{','.join(mv['from']) or '-'} -> {','.join(mv['to'])}"),
                      escape(str(mv["stage"]) + (f" ({mv['node_stage']})" if mv.get("node_stage") else "")),
                      mb, f"{float(rate) / 1e6:.1f}" if (rate := mv.get("rate_bps")) is not None else "-",
                      f"{mv['eta_s']}s" if mv.get("eta_s") is not None else "-",
                      _ago(mv.get("finished") or mv.get("last_progress"), now), escape(mv.get("waits_for") or ""))
        out.print(t)
        if len(rows) < len(moves):
            out.print(f"({len(moves) - len(rows)} more moves not shown; --json lists every one)")
    if not with_figures:
        out.print("(bytes, rate and ETA come from the moving nodes: pass --secret-file or set $FERRY_SECRET)")
    return "\n".join(line.rstrip() for line in buf.getvalue().rstrip("\n").splitlines())


def drain(etcd: Etcd, prefix: str, node: str, *, max_moves: int = 0, throttle: int | None = None,
          name: str | None = None) -> tuple[str, list[Move]]:
    """Plan and store the moves that take every copy and primary role away from
    ``node`` (``generate(remove=node)``); returns (plan name, moves). No moves (the
    node holds nothing): nothing is stored."""
    snap = read(etcd, prefix)
    moves = generate(snap.m, remove=node)
    name = name or f"drain-{node}"
    if moves:
        execute(etcd, prefix, name, moves, max_moves=max_moves, throttle=throttle)
    return name, moves


__all__ = ["Snapshot", "read", "execute", "cancel", "status", "plan_status", "verify", "wait", "drain",
           "holdings", "summary_line", "node_moves", "state_of", "render"]
