"""Reassignment plans: stored in etcd, applied by the controller.

A plan is a list of moves; each gives one partition new owners::

    {"version": 1, "moves": [{"cache": "default", "partition": 3,
                              "from": ["n1", "n2"], "to": ["n3", "n1"]}]}

``to`` names B+1 live members, primary first; ``from`` (optional) is what the
partition had when the plan was generated, for the operator to read. Keys, under the
cluster prefix ``P``:

- ``P/reassign/<name>``: the plan as ``execute`` stored it, with ``max_moves``,
  ``throttle``, ``created``; ``cancel`` set true by ``cancel``. Written only by the
  operator's commands (node/reassign_ops.py).
- ``P/reassign/<name>/moves/<i>``: move i once the controller started it: its stage,
  what it waits for, since when, and the pin it replaced. Written only by the controller.
- ``P/reassign/<name>/end``: the plan ended (``done``, ``cancelled`` or ``refused``).
  Written only by the controller.

The controller applies a plan through the one mechanism every move uses: it *pins* a
partition's owners (``P/pins/<cache>/<p>``), which makes them the partition's ideal
owners (``ClusterMap.ideal``); the nodes then move, admit the new copies to the
in-sync set through the primary, hand the primary role over and evict the old copies
exactly as for a join. The controller's :class:`node.reassign_driver.PlanDriver` starts at most ``max_moves`` of a plan at a
time (in plan order), marks a move done when :func:`assess` says so, and on cancel puts
back, for every move not done, the pin it replaced. A done move whose owners are what
rendezvous hashing gives anyway loses its pin, so ``--balance`` and ``--add`` plans
leave the cluster following rendezvous hashing again.
"""
from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from faults import fileio

from .assignment import ranked
from .cluster_map import ClusterMap
from .config import CacheConfig
from .control import KV
from .errors import PlanError
from .jsonvalue import Json, JsonDoc
from .schema import Malformed, log_malformed, node_id
from .states import State

log = logging.getLogger("ferry.node.reassign")

# A plan names partitions and owners: a few KiB even for thousands of moves, and it is
# stored as one etcd value (etcd's default request limit is 1.5 MiB). Larger files are
# refused unread; a 47 MB plan once took 736 MB of memory to parse.
MAX_PLAN_BYTES = 1 << 20
# {"moves": [{"to": [...]}]} is 4 levels deep. json.loads recurses per level: 100,000
# nested arrays raised RecursionError.
MAX_PLAN_DEPTH = 8
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# stages of a move of a plan (status, progress keys, docs/operations.md)
WAITING, MOVING, IN_SYNC, DONE, CANCELLED = "waiting", "moving", "in sync", "done", "cancelled"
STAGES = (WAITING, MOVING, IN_SYNC, DONE, CANCELLED)
TERMINAL = (DONE, CANCELLED)
RATE_SETTING = "transfer.rate_limit"      # what a plan's throttle sets


def plan_key(prefix: str, name: str) -> str:
    return f"{prefix}/reassign/{name}"


def pin_key(prefix: str, cache: str, p: int) -> str:
    return f"{prefix}/pins/{cache}/{p}"


# -- the plan's format ----------------------------------------------------------------------
@dataclass(frozen=True)
class Move:
    cache: str
    partition: int
    to: tuple[str, ...]
    source: tuple[str, ...] = ()       # "from": owners when generated (informational)

    def to_json(self) -> JsonDoc:
        return {"cache": self.cache, "partition": self.partition, "from": list(self.source),
                "to": list(self.to)}


def _depth(raw: bytes) -> int:
    """Deepest nesting of ``[``/``{`` outside strings (counted before parsing, so a
    hostile file never reaches the recursive parser)."""
    depth = deepest = 0
    in_str = escaped = False
    for b in raw:
        if in_str:
            if escaped:
                escaped = False
            elif b == 0x5C:            # backslash
                escaped = True
            elif b == 0x22:            # "
                in_str = False
        elif b == 0x22:
            in_str = True
        elif b in (0x5B, 0x7B):        # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif b in (0x5D, 0x7D):        # ] }
            depth -= 1
    return deepest


def read_plan(path: str) -> bytes:
    """The bytes of a plan file: a regular file of at most MAX_PLAN_BYTES (larger ones
    are refused unread). Opened non-blocking, so a FIFO cannot hang the reader."""
    try:
        return fileio.read_regular(path, MAX_PLAN_BYTES)  # parse_plan refuses what grew meanwhile
    except fileio.NotRegularFile:
        raise PlanError(f"plan {path}: not a regular file") from None
    except fileio.FileTooLarge as e:
        raise PlanError(f"plan {path} is {e.size} bytes, more than the limit of "
                        f"{MAX_PLAN_BYTES}; split it into smaller plans") from None
    except OSError as e:
        raise PlanError(f"cannot read plan {path}: {e.strerror}") from None


def parse_plan(raw: bytes | str) -> list[Move]:
    """The moves of a plan, shape-checked (not against a cluster: :func:`check`);
    :class:`PlanError` says what is wrong."""
    data = raw.encode() if isinstance(raw, str) else raw
    if len(data) > MAX_PLAN_BYTES:
        raise PlanError(f"plan is {len(data)} bytes, more than the limit of {MAX_PLAN_BYTES}; "
                        "split it into smaller plans")
    if _depth(data) > MAX_PLAN_DEPTH:
        raise PlanError(f"nested more than {MAX_PLAN_DEPTH} levels deep; expected "
                        '{"moves": [{"cache", "partition", "to": [nodes]}, ...]}')
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise PlanError(f"not valid JSON: {e}") from None
    return moves_of(doc)


def moves_of(doc: Json) -> list[Move]:
    """The moves of a parsed plan document (a file, or the stored plan)."""
    raw = doc.get("moves") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or not isinstance(raw, list) or not raw:
        raise PlanError('expected {"moves": [{"cache", "partition", "to": [nodes]}, ...]} '
                        "with at least one move")
    if doc.get("version", 1) != 1:
        raise PlanError(f"plan version {doc.get('version')!r}: this Ferry reads version 1")
    out = []
    for i, mv in enumerate(raw):
        if not isinstance(mv, dict):
            raise PlanError(f"moves[{i}] must be an object")
        cache, p, to, src = mv.get("cache", "default"), mv.get("partition"), mv.get("to"), mv.get("from", [])
        if not isinstance(cache, str):
            raise PlanError(f"moves[{i}].cache must be a string")
        if not isinstance(p, int) or isinstance(p, bool):
            raise PlanError(f"moves[{i}].partition must be an integer")
        if not isinstance(to, list) or not to or not all(isinstance(n, str) for n in to):
            raise PlanError(f"moves[{i}].to must be a non-empty list of node ids")
        if not isinstance(src, list) or not all(isinstance(n, str) for n in src):
            raise PlanError(f"moves[{i}].from must be a list of node ids")
        try:
            ids = tuple(node_id(n, f"moves[{i}].to:") for n in to)
        except ValueError as e:
            raise PlanError(str(e)) from None
        out.append(Move(cache, p, ids, tuple(str(n) for n in src)))
    return out


def check_shape(moves: Sequence[Move], caches: dict[str, CacheConfig]) -> None:
    """What a plan must satisfy whatever the members: known caches, partitions in
    range, B+1 different owners, each partition once."""
    seen: dict[tuple[str, int], int] = {}
    for i, mv in enumerate(moves):
        cc = caches.get(mv.cache)
        if cc is None:
            raise PlanError(f"moves[{i}]: unknown cache {mv.cache!r} (caches: {', '.join(sorted(caches))})")
        if not 0 <= mv.partition < cc.partitions:
            raise PlanError(f"moves[{i}]: cache {mv.cache} has partitions 0..{cc.partitions - 1}, "
                            f"not {mv.partition}")
        if len(mv.to) != cc.backups + 1 or len(set(mv.to)) != len(mv.to):
            raise PlanError(f"moves[{i}]: 'to' must name {cc.backups + 1} different nodes "
                            f"(backups + 1 of cache {mv.cache}), not {list(mv.to)}")
        first = seen.setdefault((mv.cache, mv.partition), i)
        if first != i:
            raise PlanError(f"moves[{i}]: {mv.cache}/{mv.partition} is moved by moves[{first}] already")


def known_nodes(m: ClusterMap) -> set[str]:
    """Nodes the map knows of, live or not: members, reporters, record owners."""
    out = set(m.members) | set(m.node_parts) | set(m.initial_members)
    for lst in m.parts.values():
        for r in lst:
            out.update(r.isr)
    return out


def why_not_placeable(m: ClusterMap, node: str) -> str | None:
    """Why ``node`` cannot be given partitions now (None: it can). etcd keeps no list of
    past members: a dead node is told apart only while a record or report names it."""
    mem = m.members.get(node)
    if mem is not None:
        return f"{node} is leaving the cluster" if mem.leaving else None
    if node in known_nodes(m):
        return f"{node} is not a live member: it is dead (its lease ended; records still name it)"
    return f"{node} is not a live member (dead, or never a node of this cluster)"


def check(moves: Sequence[Move], m: ClusterMap) -> None:
    """:func:`check_shape`, and every owner a live member that is not leaving."""
    check_shape(moves, m.caches)
    for i, mv in enumerate(moves):
        for n in mv.to:
            why = why_not_placeable(m, n)
            if why:
                raise PlanError(f"moves[{i}] ({mv.cache}/{mv.partition}): {why}")


# -- where a move stands -----------------------------------------------------------------------
def current_owners(m: ClusterMap, cache: str, p: int) -> list[str]:
    """The partition's owners now: the record's primary, then its other in-sync copies."""
    rec = m.parts[cache][p]
    rest = ranked(cache, p, [n for n in rec.isr if n != rec.primary])
    return ([rec.primary] if rec.primary else []) + rest


def assess(m: ClusterMap, cache: str, p: int, to: Sequence[str]) -> tuple[str, str]:
    """(stage, what it waits for) of giving (cache, p) the owners ``to`` as the map
    shows it now: MOVING until every target is OWNING and in sync, IN_SYNC until
    ``to[0]`` leads and no other node holds a copy, then DONE."""
    rec = m.parts[cache][p]
    gone = [why for n in to if (why := why_not_placeable(m, n))]
    if gone:
        return MOVING, "; ".join(gone) + ": the plan's owners do not apply until it is back (or cancel the plan)"
    if rec.lost:
        return MOVING, f"{cache}/{p} is LOST (no in-sync copy left): a node holding it must come back"
    states = {n: s for n, s in m.states[cache][p].items() if n in m.members}
    for n in to:
        st = states.get(n)
        if st == State.MOVING.value:
            return MOVING, f"{n} to finish its move"
        if st is None:
            return MOVING, f"{n} to start its move (a free move slot on {n})"
        if st != State.OWNING.value:
            return MOVING, f"{n} to hold it OWNING (reports {st})"
    out = [n for n in to if n not in rec.isr]
    if out:
        return MOVING, f"primary {rec.primary} to admit {', '.join(out)} to the in-sync set"
    if rec.primary != to[0]:
        return IN_SYNC, f"hand-off of the primary role from {rec.primary} to {to[0]}"
    extra = sorted(n for n in states if n not in to)
    if extra:
        return IN_SYNC, ", ".join(f"{n} ({states[n]})" for n in extra) + " to evict its copy"
    stale = [n for n in rec.isr if n not in to]
    if stale:
        return IN_SYNC, f"{', '.join(stale)} to leave the in-sync set"
    return DONE, ""


# -- generating a plan ---------------------------------------------------------------------------
def generate(m: ClusterMap, *, add: str | None = None, remove: str | None = None,
             balance: bool = False) -> list[Move]:
    """The moves of one of three plans, from the map now:

    - ``remove``: every partition NODE holds, is assigned or is in sync for gets NODE's
      place filled by the best-ranked other live member (rendezvous order); the other
      owners stay. Owners that are not placeable are replaced too.
    - ``add``: the partitions whose rendezvous owners over the live members include
      NODE (and differ from the owners now) get those owners: what a join gives NODE
      when no pin holds its partitions elsewhere.
    - ``balance``: every partition whose owners differ from its rendezvous owners.
    """
    if sum((add is not None, remove is not None, balance)) != 1:
        raise PlanError("choose one of --add NODE, --remove NODE, --balance")
    placeable = m.placeable()
    node = add if add is not None else remove
    if node is not None:
        why = why_not_placeable(m, node)
        if add is not None and why:
            raise PlanError(f"cannot plan adding {why}; start it first")
        if remove is not None and node not in known_nodes(m):
            raise PlanError(f"cannot plan removing {node}: not a live member, and no partition "
                            "names it (nothing to move)")
    pool = [n for n in placeable if n != remove]
    out: list[Move] = []
    for cache, cc in m.caches.items():
        copies = cc.backups + 1
        if len(pool) < copies:
            raise PlanError(f"cache {cache} keeps {copies} copies of each partition and only "
                            f"{len(pool)} live member(s) would be left: {', '.join(sorted(pool)) or 'none'}")
        for p in range(cc.partitions):
            now = current_owners(m, cache, p)
            if remove is not None:
                holders = set(m.states[cache][p]) | set(now) | set(m.ideal(cache, p))
                if remove not in holders:
                    continue
                keep = [n for n in now if n in pool][:copies]
                fill = [n for n in ranked(cache, p, pool) if n not in keep]
                to = keep + fill[:copies - len(keep)]
            else:
                to = ranked(cache, p, pool)[:copies]
                if add is not None and add not in to:
                    continue
            if to != now:
                out.append(Move(cache, p, tuple(to), tuple(now)))
    return out


def plan_file(moves: Sequence[Move], by: str, revision: int) -> JsonDoc:
    """The plan file ``generate`` writes."""
    return {"version": 1, "generated": {"by": by, "at": round(time.time(), 3), "revision": revision},
            "moves": [mv.to_json() for mv in moves]}


# -- the stored plan, as the controller reads it --------------------------------------------
def _seconds(v: Json) -> float:
    """A wall time as stored (a number)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{v!r} is not a time"[:80])
    return float(v)


@dataclass
class Progress:
    """``P/reassign/<name>/moves/<i>``: a started move, as the controller last saw it."""
    stage: str
    waits: str
    since: float                        # wall time the stage or what it waits for last changed
    started: float
    finished: float | None = None
    pin_before: list[str] | None = None  # the pin this move's replaced (None: none)
    mod: int = 0

    def to_json(self) -> JsonDoc:
        pin: Json = None if self.pin_before is None else list[Json](self.pin_before)
        return {"stage": self.stage, "waits": self.waits, "since": self.since, "started": self.started,
                "finished": self.finished, "pin_before": pin}

    @classmethod
    def parse(cls, kv: KV) -> "Progress":
        d = kv.value
        if not isinstance(d, dict) or d.get("stage") not in STAGES:
            raise ValueError("not a move's progress")
        pin, fin = d.get("pin_before"), d.get("finished")
        return cls(str(d["stage"]), str(d.get("waits", "")), _seconds(d.get("since", 0)),
                   _seconds(d.get("started", 0)), None if fin is None else _seconds(fin),
                   [str(n) for n in pin] if isinstance(pin, list) else None, kv.mod)


@dataclass
class Plan:
    """A stored plan with its progress."""
    name: str
    moves: list[Move]
    mod: int
    max_moves: int = 0                  # 0: no bound of the plan's own
    throttle: int | None = None         # transfer.rate_limit set by execute (bytes/s)
    throttle_before: Json = None        # the stored setting it replaced (None: unset)
    cancel: bool = False
    created: float = 0.0
    refused: str | None = None          # a stored plan that does not parse
    progress: dict[int, Progress] = field(default_factory=dict)
    end: JsonDoc | None = None

    def stage_of(self, i: int) -> str:
        pr = self.progress.get(i)
        if pr is not None:
            return pr.stage
        return CANCELLED if self.cancel or (self.end or {}).get("state") == CANCELLED else WAITING

    def in_flight(self) -> list[int]:
        return [i for i, pr in self.progress.items() if pr.stage not in TERMINAL]


def stored_doc(moves: Sequence[Move], *, max_moves: int = 0, throttle: int | None = None,
               throttle_before: Json = None) -> JsonDoc:
    """The value of ``P/reassign/<name>`` that ``execute`` puts."""
    return {"version": 1, "moves": [mv.to_json() for mv in moves], "max_moves": max_moves,
            "throttle": throttle, "throttle_before": throttle_before, "cancel": False,
            "created": round(time.time(), 3)}


def _whole(v: Json, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise PlanError(f"{what} {v!r} is not a non-negative integer"[:120])
    return v


def parse_stored(name: str, kv: KV, caches: dict[str, CacheConfig]) -> Plan:
    """The plan stored under ``name``; one that does not parse or names an unknown
    cache comes back with ``refused`` saying why (the controller ends it)."""
    d = kv.value
    try:
        moves = moves_of(d)
        check_shape(moves, caches)
        assert isinstance(d, dict)
        thr = d.get("throttle")
        return Plan(name, moves, kv.mod, _whole(d.get("max_moves", 0), "max_moves"),
                    None if thr is None else _whole(thr, "throttle"), d.get("throttle_before"),
                    d.get("cancel") is True, _seconds(d.get("created", 0)))
    except (PlanError, TypeError, ValueError) as e:
        return Plan(name, [], kv.mod, refused=str(e))


def plans_from(items: Iterable[tuple[str, KV]], caches: dict[str, CacheConfig],
               cache: dict[tuple[str, int], Plan] | None = None, *,
               running_only: bool = False) -> dict[str, Plan]:
    """Plans from the keys under ``P/reassign/`` (``(key after it, KV)``). ``cache``
    keeps each parsed plan by (name, mod revision): a large plan is parsed once.
    ``running_only``: the plans that ended are left out (their progress is not read)."""
    plans: dict[str, Plan] = {}
    ends: dict[str, KV] = {}
    rest: list[tuple[list[str], KV]] = []
    for key, kv in items:
        parts = key.split("/")
        if len(parts) == 2 and parts[1] == "end":
            ends[parts[0]] = kv
        elif len(parts) > 1:
            rest.append((parts, kv))
        elif not (running_only and key in ends):
            hit = cache.get((key, kv.mod)) if cache is not None else None
            parsed = hit or parse_stored(key, kv, caches)
            if cache is not None and hit is None:
                cache[(key, kv.mod)] = parsed
            plans[key] = Plan(**{**parsed.__dict__, "progress": {}, "end": None})
    for name, kv in ends.items():
        if running_only:
            plans.pop(name, None)
        elif name in plans:
            plans[name].end = kv.value if isinstance(kv.value, dict) else {"state": "?"}
    if cache is not None:          # forget versions no longer stored
        for k in [k for k in cache if plans.get(k[0]) is None or plans[k[0]].mod != k[1]]:
            del cache[k]
    for parts, kv in rest:
        plan = plans.get(parts[0])
        if plan is None:
            continue
        try:
            if len(parts) == 3 and parts[1] == "moves":
                plan.progress[int(parts[2])] = Progress.parse(kv)
            else:
                raise ValueError("not a key of a plan")
        except (ValueError, TypeError) as e:     # logged once per key and revision
            log_malformed(Malformed(f"reassign/{'/'.join(parts)}", kv.mod, str(e)), "ignored", log)
    return plans


__all__ = ["Move", "Plan", "Progress", "parse_plan", "read_plan", "moves_of", "check",
           "check_shape", "assess", "generate", "plan_file", "stored_doc", "plans_from", "current_owners",
           "why_not_placeable", "known_nodes", "plan_key", "pin_key", "STAGES", "WAITING", "MOVING",
           "IN_SYNC", "DONE", "CANCELLED", "TERMINAL", "MAX_PLAN_BYTES", "NAME", "RATE_SETTING"]
