"""The cluster map: members, topology version, and per partition the primary and the
state each node reported. The coordinator owns it; every node holds the latest copy
it has seen (a higher ``epoch`` always wins).

``version`` (the topology version) changes when membership changes (join, leave,
failure); ``epoch`` changes on every change of the map, including state reports and
primary hand-offs. Ideal owners are a pure function of (cache, partition, live
members): see :mod:`node.assignment`.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Any

from .assignment import owners, ranked
from .config import CacheConfig
from .states import State


@dataclass
class Member:
    id: str
    address: str
    order: int             # join order; the live member with the lowest is coordinator
    alive: bool = True
    leaving: bool = False   # graceful leave in progress: owns nothing new
    boot: str = ""          # changes at every process start
    transfer: str = ""      # HOST:PORT of its file supplier (files mode), "" = none


class ClusterMap:
    def __init__(self, caches: dict[str, CacheConfig]) -> None:
        self.version = 0
        self.epoch = 0
        self.members: dict[str, Member] = {}
        self.caches = dict(caches)
        # cache -> partition -> node -> state name
        self.states: dict[str, list[dict[str, str]]] = {
            c.name: [{} for _ in range(c.partitions)] for c in caches.values()}
        # cache -> partition -> nodes whose OWNING copy is unconfirmed (after restart)
        self.stale: dict[str, list[set[str]]] = {
            c.name: [set() for _ in range(c.partitions)] for c in caches.values()}
        self.counters: dict[str, list[dict[str, int]]] = {
            c.name: [{} for _ in range(c.partitions)] for c in caches.values()}
        self.primaries: dict[str, list[str | None]] = {
            c.name: [None] * c.partitions for c in caches.values()}
        self.moves: list[dict[str, Any]] = []
        # manual reassignment by plans: cache -> partition -> owners (primary first)
        self.pins: dict[str, dict[int, list[str]]] = {c.name: {} for c in caches.values()}

    # -- queries ------------------------------------------------------------------
    def alive(self) -> list[str]:
        return [m.id for m in self.members.values() if m.alive]

    def placeable(self) -> list[str]:
        """Members that may be assigned partitions (alive, not leaving)."""
        return [m.id for m in self.members.values() if m.alive and not m.leaving]

    @property
    def coordinator(self) -> str | None:
        live = [m for m in self.members.values() if m.alive]
        return min(live, key=lambda m: (m.order, m.id)).id if live else None

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
        return self.primaries[cache][p]

    # -- coordinator's rule for primaries -----------------------------------------
    def choose_primaries(self) -> bool:
        """Keep a live OWNING primary; otherwise pick the live OWNING copy that is
        confirmed (not stale) and first in rendezvous order, else the stale copy with
        the highest counter. Returns True when something changed."""
        changed = False
        live = set(self.alive())
        for cache, plist in self.primaries.items():
            for p, cur in enumerate(plist):
                st = self.states[cache][p]
                if cur in live and st.get(cur) == State.OWNING.value:
                    continue
                owning = self.holders(cache, p, State.OWNING)
                fresh = [n for n in owning if n not in self.stale[cache][p]]
                if fresh:
                    new = fresh[0]
                elif owning:
                    cnt = self.counters[cache][p]
                    new = max(owning, key=lambda n: (cnt.get(n, 0), -owning.index(n)))
                else:
                    new = None
                if new != cur:
                    plist[p] = new
                    changed = True
        return changed

    # -- wire ---------------------------------------------------------------------
    def to_wire(self) -> dict[str, Any]:
        return {
            "version": self.version, "epoch": self.epoch,
            "members": [asdict(m) for m in self.members.values()],
            "caches": [c.to_wire() for c in self.caches.values()],
            "states": self.states, "primaries": self.primaries,
            "stale": {c: [sorted(s) for s in lst] for c, lst in self.stale.items()},
            "counters": self.counters, "moves": self.moves,
            "pins": {c: {str(p): o for p, o in d.items()} for c, d in self.pins.items()},
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> "ClusterMap":
        caches = {c["name"]: CacheConfig.from_wire(c) for c in d["caches"]}
        m = cls(caches)
        m.version, m.epoch = int(d["version"]), int(d["epoch"])
        m.members = {x["id"]: Member(**x) for x in d["members"]}
        m.states = {c: [dict(x) for x in lst] for c, lst in d["states"].items()}
        m.primaries = {c: list(lst) for c, lst in d["primaries"].items()}
        m.stale = {c: [set(x) for x in lst] for c, lst in d.get("stale", {}).items()} or m.stale
        m.counters = {c: [dict(x) for x in lst] for c, lst in d.get("counters", {}).items()} or m.counters
        m.moves = list(d.get("moves", []))
        for c, d2 in d.get("pins", {}).items():
            m.pins[c] = {int(p): list(o) for p, o in d2.items()}
        return m

    def clone(self) -> "ClusterMap":
        return copy.deepcopy(self)
