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
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, TypeVar

from .assignment import owners, ranked
from .config import CacheConfig
from .jsonvalue import JsonDoc, WireDoc
from .states import State

from .schema import BadRecord, PartRecord  # noqa: F401  (PartRecord: this module's public face too)

if TYPE_CHECKING:
    # numpy, imported at the first placement (a client reading the map needs none; a
    # node imports it while its recovery runs: node/node.py ``_warm_up``)
    from .placement import Placement

PartKey = tuple[str, int]
_Row = TypeVar("_Row")


@dataclass
class Member:
    id: str
    address: str
    order: int             # etcd create revision of its first registration (display order)
    alive: bool = True
    leaving: bool = False   # graceful leave in progress: owns nothing new
    boot: str = ""          # changes at every process start
    transfer: str = ""      # HOST:PORT of its file supplier (files mode), "" = none


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
        # owners pinned by reassignment plans (node/reassign.py): cache -> partition ->
        # owners (primary first)
        self.pins: dict[str, dict[int, list[str]]] = {c.name: {} for c in caches.values()}
        # the mod revision of each record (0: none), for the controller's compare-and-swap
        self.rec_mod: dict[str, list[int]] = {c.name: [0] * c.partitions for c in caches.values()}
        # records in etcd that are malformed (node/schema.py): the controller rewrites them
        self.garbage: dict[PartKey, BadRecord] = {}
        self.creator: str | None = None        # the node that created the cluster (P/meta)
        self.initial_members: tuple[str, ...] = ()   # a new cluster's initial members (P/meta)
        # node -> partitions it reported or a record names (a superset: used to find the
        # partitions a membership change touches without scanning them all)
        self.node_parts: dict[str, set[PartKey]] = {}
        # ideal owners by rendezvous hashing over the placeable members, per cache,
        # changed by membership deltas only (node/placement.py)
        self._placement: dict[str, Placement] = {}
        self._placed: dict[str, tuple[int, int, int]] = {}   # cache -> members signature placed
        self.members_changes = 0      # bumped by whoever changes ``members`` in place

    def _members_sig(self) -> tuple[int, int, int]:
        return (id(self.members), len(self.members), self.members_changes)

    def placement(self, cache: str) -> Placement:
        pl = self._placement.get(cache)
        if pl is None:
            from .placement import Placement
            cc = self.caches[cache]
            pl = self._placement[cache] = Placement(cache, cc.partitions, cc.backups + 1)
        sig = self._members_sig()
        if self._placed.get(cache) != sig:
            want = set(self.placeable())
            if pl.members != want:
                pl.update(want)
            self._placed[cache] = sig
        return pl

    def refresh_placement(self) -> set[PartKey]:
        """Bring every cache's ideal owners up to the members now; the partitions whose
        ideal owners changed."""
        want = set(self.placeable())
        sig = self._members_sig()
        out: set[PartKey] = set()
        for cache in self.caches:
            pl = self._placement.get(cache)
            if pl is None:
                pl = self.placement(cache)
                out.update((cache, p) for p in range(pl.partitions))
            elif pl.members != want:
                out.update((cache, int(p)) for p in pl.update(want))
            self._placed[cache] = sig
        return out

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
        return {c: [self.stale_of(c, p) for p in range(len(lst))] for c, lst in self.parts.items()}

    def address(self, node: str | None) -> str | None:
        m = self.members.get(node) if node else None
        return m.address if m else None

    def member_at(self, address: str) -> str | None:
        """The node id a certificate at ``address`` must name (mutual TLS): the member
        listed there, or the one live member when several are (a node restarted under
        a new id); None when none is; when several live members claim the address, a
        description that no node id can match, so no certificate is accepted there."""
        at = [m for m in self.members.values() if m.address == address]
        if len(at) == 1:
            return at[0].id
        live = [m.id for m in at if m.alive]
        if len(live) == 1:
            return live[0]
        if not live:
            return None
        return f"one of several members listed at that address ({', '.join(sorted(live))})"

    def transfer_address(self, node: str | None) -> str | None:
        m = self.members.get(node) if node else None
        return m.transfer or None if m else None

    def ideal(self, cache: str, p: int) -> list[str]:
        """Owners p should have, primary first: a plan's pin while every pinned node is
        live and not leaving, else rendezvous hashing."""
        pin = self.pins.get(cache, {}).get(p)
        if pin:
            placeable = self.placeable()
            if all(n in placeable for n in pin):
                return list(pin)
        return self.placement(cache).owners(p)

    def ideal_slow(self, cache: str, p: int) -> list[str]:
        """:meth:`ideal` by ranking every member (the reference the table is tested against)."""
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
    # The map goes out in pages of partitions (``get_map(start, count)``), numbered
    # over every cache in order: a reply stays far below the 1 MiB frame at any
    # partition count. :meth:`fetch` reads every page; one page is the whole map up to
    # PAGE partitions.
    PAGE = 2048

    def total_partitions(self) -> int:
        return sum(c.partitions for c in self.caches.values())

    def _ranges(self, start: int, end: int) -> dict[str, tuple[int, int]]:
        """cache -> (first, end) of its partitions in the global range [start, end)."""
        out: dict[str, tuple[int, int]] = {}
        base = 0
        for name, c in self.caches.items():
            lo, hi = max(start - base, 0), min(end - base, c.partitions)
            if lo < hi:
                out[name] = (lo, hi)
            base += c.partitions
        return out

    def to_wire(self, start: int = 0, count: int | None = None) -> WireDoc:
        total = self.total_partitions()
        end = total if count is None else min(total, start + max(0, count))
        rng = self._ranges(start, end)
        stale = self.stale_of
        return {
            "version": self.version, "epoch": self.epoch, "controller": self.controller,
            "members": [asdict(m) for m in self.members.values()],
            "caches": [c.to_wire() for c in self.caches.values()],
            "total": total, "range": [start, end],
            "offsets": {c: lo for c, (lo, _) in rng.items()},
            "states": {c: self.states[c][lo:hi] for c, (lo, hi) in rng.items()},
            "primaries": {c: [r.primary for r in self.parts[c][lo:hi]] for c, (lo, hi) in rng.items()},
            "parts": {c: [r.to_json() for r in self.parts[c][lo:hi]] for c, (lo, hi) in rng.items()},
            "stale": {c: [sorted(stale(c, p)) for p in range(lo, hi)] for c, (lo, hi) in rng.items()},
            "counters": {c: self.counters[c][lo:hi] for c, (lo, hi) in rng.items()},
            "moves": self.moves,
            "pins": {c: {str(p): o for p, o in d.items()} for c, d in self.pins.items()},
        }

    def stale_of(self, cache: str, p: int) -> set[str]:
        r = self.parts[cache][p]
        return {n for n, s in self.states[cache][p].items() if s == State.OWNING.value and n not in r.isr}

    @classmethod
    def from_wire(cls, d: WireDoc) -> "ClusterMap":
        caches = {c["name"]: CacheConfig.from_wire(c) for c in d["caches"]}
        m = cls(caches)
        m.version, m.epoch = int(d["version"]), int(d["epoch"])
        m.controller = d.get("controller")
        m.members = {x["id"]: Member(**x) for x in d["members"]}
        m.moves = list(d.get("moves", []))
        for c, d2 in d.get("pins", {}).items():
            m.pins[c] = {int(p): list(o) for p, o in d2.items()}
        m.merge_page(d)
        return m

    def merge_page(self, d: WireDoc) -> None:
        """Fill the partitions of one page (``to_wire(start, count)``) into this map.
        The page is read whole before anything changes: ValueError (or the error of
        the field that does not read) leaves the map as it was, and a page whose
        partitions fall outside this map's caches never changes a table's length."""
        offsets = d.get("offsets", {})
        staged: list[Callable[[], None]] = []

        def stage(table: dict[str, list[_Row]], c: str, rows: list[_Row]) -> None:
            lo = int(offsets.get(c, 0))
            if c not in self.caches or lo < 0 or lo + len(rows) > self.caches[c].partitions:
                raise ValueError(f"map page names partitions {lo}..{lo + len(rows) - 1} of {c!r}, "
                                 f"outside the map's caches")

            def put(t: list[_Row] = table[c]) -> None:
                t[lo:lo + len(rows)] = rows
            staged.append(put)
        for c, lst in d.get("states", {}).items():
            stage(self.states, c, [dict(x) for x in lst])
        for c, lst in d.get("counters", {}).items():
            stage(self.counters, c, [dict(x) for x in lst])
        if "parts" in d:
            for c, lst in d["parts"].items():
                stage(self.parts, c, [PartRecord.from_json(x) for x in lst])
        else:
            for c, lst in d.get("primaries", {}).items():
                stage(self.parts, c, [PartRecord(x, (x,) if x else ()) for x in lst])
        for put in staged:
            put()

    def global_index(self, cache: str, p: int) -> int:
        """Partition ``p`` of ``cache`` in the numbering of the pages (every cache in
        order)."""
        base = 0
        for name, c in self.caches.items():
            if name == cache:
                return base + p
            base += c.partitions
        raise KeyError(cache)

    def absorb(self, d: WireDoc) -> None:
        """One page of a newer map taken into this one: its members, controller,
        pins, moves and epoch, and its partitions (a route table: the partitions of
        other pages stay as they were read). Read whole before anything changes:
        ValueError (or the error of the field that does not read) leaves the map as it
        was, as does a page of other caches than this map's."""
        caches = {c["name"]: CacheConfig.from_wire(c) for c in d["caches"]}
        if caches != self.caches:
            raise ValueError("map page of other caches")
        version, epoch = int(d["version"]), int(d["epoch"])
        members = {x["id"]: Member(**x) for x in d["members"]}
        moves = list(d.get("moves", []))
        pins: dict[str, dict[int, list[str]]] = {c: {} for c in self.caches}
        for c, d2 in d.get("pins", {}).items():
            pins[c] = {int(p): list(o) for p, o in d2.items()}
        self.merge_page(d)                # the last check: nothing changed if it raises
        self.version, self.epoch, self.controller = version, epoch, d.get("controller")
        self.members, self.moves, self.pins = members, moves, pins
        self.members_changes += 1

    @classmethod
    def fetch(cls, call: Callable[..., WireDoc]) -> "ClusterMap":
        """The whole map from a node, page by page: ``call(**args)`` is the ``get_map``
        RPC. Pages may come from maps of different revisions (the map changes while
        it is read); the result is a route table, corrected by ``not_primary`` answers."""
        first = call(start=0, count=cls.PAGE)
        m = cls.from_wire(first)
        total = int(first.get("total", 0) or 0)
        start = int(first.get("range", [0, total])[1]) if "range" in first else total
        while start < total:
            page = call(start=start, count=cls.PAGE)
            m.merge_page(page)
            m.epoch = min(m.epoch, int(page["epoch"]))
            end = int(page["range"][1])
            if end <= start:
                break
            start = end
        return m

    def clone(self) -> "ClusterMap":
        m = copy.copy(self)
        m.members = {k: copy.copy(v) for k, v in self.members.items()}
        m.states = {c: [dict(x) for x in lst] for c, lst in self.states.items()}
        m.counters = {c: [dict(x) for x in lst] for c, lst in self.counters.items()}
        m.parts = {c: list(lst) for c, lst in self.parts.items()}
        m.rec_mod = {c: list(lst) for c, lst in self.rec_mod.items()}
        m.garbage = dict(self.garbage)
        m.pins = {c: {p: list(o) for p, o in d.items()} for c, d in self.pins.items()}
        m.node_parts = {n: set(s) for n, s in self.node_parts.items()}
        m.moves = list(self.moves)
        m._placement, m._placed = {}, {}
        return m
