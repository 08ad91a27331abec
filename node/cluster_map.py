"""The cluster map as one node sees it: members, and per partition the state each node
reported, the primary, the in-sync copies and the partition's epoch.

It is a local copy of the control plane (etcd, :mod:`node.control`): members are the
keys ``P/members/*`` (present = its lease is alive), states come from ``P/reports/*``
and primary, in-sync set and epoch from ``P/parts/<cache>/<p>``, which only the
controller writes. ``epoch`` is the etcd revision the copy reflects; ``version`` the
revision of the last membership change. Ideal owners are a pure function of (cache,
partition, live members, pins): see :mod:`node.assignment`.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass

from .assignment import owners, ranked
from .config import CacheConfig
from .jsonvalue import Json, JsonDoc
from .states import State


@dataclass
class Member:
    id: str
    address: str
    order: int             # etcd create revision of its first registration (display order)
    alive: bool = True
    leaving: bool = False   # graceful leave in progress: owns nothing new
    boot: str = ""          # changes at every process start
    transfer: str = ""      # HOST:PORT of its file supplier (files mode), "" = none


@dataclass
class PartRecord:
    """What the controller decided for one partition (``P/parts/<cache>/<p>``)."""
    primary: str | None = None
    isr: tuple[str, ...] = ()      # in-sync copies: every acknowledged write is on each
    epoch: int = 0                 # bumped by every change of primary or in-sync set
    lost: bool = False             # every in-sync copy is gone: reported, never served stale
    # the primary's term (Kafka's leader epoch): bumped only when the primary changes.
    # Copies fence on it, so a change of the in-sync set alone deposes nobody.
    term: int = 0

    def to_json(self) -> JsonDoc:
        return {"primary": self.primary, "isr": list(self.isr), "epoch": self.epoch, "lost": self.lost,
                "term": self.term}

    @classmethod
    def from_json(cls, d: Json) -> "PartRecord":
        if not isinstance(d, dict):
            return cls()
        prim = d.get("primary")
        return cls(prim if isinstance(prim, str) else None,
                   tuple(x for x in d.get("isr", []) if isinstance(x, str)),
                   int(d.get("epoch", 0)), bool(d.get("lost", False)), int(d.get("term", 0)))


class ClusterMap:
    def __init__(self, caches: dict[str, CacheConfig]) -> None:
        self.version = 0
        self.epoch = 0
        self.controller: str | None = None
        self.members: dict[str, Member] = {}
        self.caches = dict(caches)
        # cache -> partition -> node -> state name
        self.states: dict[str, list[dict[str, str]]] = {
            c.name: [{} for _ in range(c.partitions)] for c in caches.values()}
        self.counters: dict[str, list[dict[str, int]]] = {
            c.name: [{} for _ in range(c.partitions)] for c in caches.values()}
        self.parts: dict[str, list[PartRecord]] = {
            c.name: [PartRecord() for _ in range(c.partitions)] for c in caches.values()}
        self.moves: list[JsonDoc] = []
        # manual reassignment by plans: cache -> partition -> owners (primary first)
        self.pins: dict[str, dict[int, list[str]]] = {c.name: {} for c in caches.values()}

    # -- queries ------------------------------------------------------------------
    def alive(self) -> list[str]:
        return [m.id for m in self.members.values() if m.alive]

    def placeable(self) -> list[str]:
        """Members that may be assigned partitions (alive, not leaving)."""
        return [m.id for m in self.members.values() if m.alive and not m.leaving]

    @property
    def coordinator(self) -> str | None:   # the old name, kept for scripts
        return self.controller

    @property
    def primaries(self) -> dict[str, list[str | None]]:
        return {c: [r.primary for r in lst] for c, lst in self.parts.items()}

    @property
    def stale(self) -> dict[str, list[set[str]]]:
        """OWNING copies that are not in sync (after a restart, or a move's end before
        the primary admitted them): they count for nothing until they are."""
        out: dict[str, list[set[str]]] = {}
        for c, lst in self.parts.items():
            out[c] = [{n for n, s in self.states[c][p].items() if s == State.OWNING.value and n not in r.isr}
                      for p, r in enumerate(lst)]
        return out

    def address(self, node: str | None) -> str | None:
        m = self.members.get(node) if node else None
        return m.address if m else None

    def transfer_address(self, node: str | None) -> str | None:
        m = self.members.get(node) if node else None
        return m.transfer or None if m else None

    def ideal(self, cache: str, p: int) -> list[str]:
        """Owners p should have, primary first: a plan's pin while every pinned node is
        live and not leaving, else rendezvous hashing."""
        placeable = self.placeable()
        pin = self.pins.get(cache, {}).get(p)
        if pin and all(n in placeable for n in pin):
            return list(pin)
        return owners(cache, p, placeable, self.caches[cache].backups)

    def state(self, cache: str, p: int, node: str) -> State | None:
        s = self.states[cache][p].get(node)
        return State(s) if s else None

    def holders(self, cache: str, p: int, *states: State) -> list[str]:
        """Live nodes whose reported state for p is one of ``states``, rendezvous order."""
        want = {s.value for s in states}
        live = set(self.alive())
        return ranked(cache, p, [n for n, s in self.states[cache][p].items() if s in want and n in live])

    def primary(self, cache: str, p: int) -> str | None:
        return self.parts[cache][p].primary

    def part(self, cache: str, p: int) -> PartRecord:
        return self.parts[cache][p]

    def in_sync(self, cache: str, p: int, node: str) -> bool:
        return node in self.parts[cache][p].isr

    # -- wire ---------------------------------------------------------------------
    def to_wire(self) -> JsonDoc:
        return {
            "version": self.version, "epoch": self.epoch, "controller": self.controller,
            "members": [asdict(m) for m in self.members.values()],
            "caches": [c.to_wire() for c in self.caches.values()],
            "states": self.states, "primaries": self.primaries,
            "parts": {c: [r.to_json() for r in lst] for c, lst in self.parts.items()},
            "stale": {c: [sorted(s) for s in lst] for c, lst in self.stale.items()},
            "counters": self.counters, "moves": self.moves,
            "pins": {c: {str(p): o for p, o in d.items()} for c, d in self.pins.items()},
        }

    @classmethod
    def from_wire(cls, d: JsonDoc) -> "ClusterMap":
        caches = {c["name"]: CacheConfig.from_wire(c) for c in d["caches"]}
        m = cls(caches)
        m.version, m.epoch = int(d["version"]), int(d["epoch"])
        m.controller = d.get("controller")
        m.members = {x["id"]: Member(**x) for x in d["members"]}
        m.states = {c: [dict(x) for x in lst] for c, lst in d["states"].items()}
        if "parts" in d:
            m.parts = {c: [PartRecord.from_json(x) for x in lst] for c, lst in d["parts"].items()}
        else:
            for c, lst in d.get("primaries", {}).items():
                m.parts[c] = [PartRecord(x, (x,) if x else ()) for x in lst]
        m.counters = {c: [dict(x) for x in lst] for c, lst in d.get("counters", {}).items()} or m.counters
        m.moves = list(d.get("moves", []))
        for c, d2 in d.get("pins", {}).items():
            m.pins[c] = {int(p): list(o) for p, o in d2.items()}
        return m

    def clone(self) -> "ClusterMap":
        return copy.deepcopy(self)
