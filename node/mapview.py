"""The cluster map from the control plane's keys, applied event by event.

:class:`MapBuilder` holds a :class:`~node.cluster_map.ClusterMap` and changes it in
place by the keys a watch batch changed (:meth:`MapBuilder.apply`), so the cost of a
batch is the number of its events, not the number of partitions. Each batch's
:class:`Delta` names the partitions it touched (their record, a report of them, a pin,
or their ideal owners after a membership change), which is all the reconcile loop and
the controller look at. :func:`map_from_keys` builds a map from a whole set of keys
with the same code (tests, tools). Nothing here talks to etcd.

Keys (prefix ``P``): ``P/members/<id>`` live members (the key lives with the member's
lease); ``P/reports/<id>/<cache>/<p>`` ``[state, counter]`` of one partition a node
holds (``P/reports/<id>`` with ``{"caches": {cache: {p: [state, counter]}}}`` is read
too); ``P/parts/<cache>/<p>`` the controller's record; ``P/pins/<cache>/<p>`` a plan's
owners; ``P/controller`` the elected controller; ``P/settings/<name>`` live cluster
settings; ``P/requests/...`` requests to the controller still pending; ``P/meta`` the
cluster's creation record. A malformed value is logged (key, revision, why) and
treated as absent, never fatal.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .cluster_map import ClusterMap, Member, PartKey, PartRecord
from .config import CacheConfig
from .control import KV
from .jsonvalue import Json

log = logging.getLogger("ferry.node.membership")


@dataclass
class Delta:
    """What one batch of key changes changed in the map."""
    parts: set[PartKey] = field(default_factory=set)       # partitions to look at again
    members: bool = False            # a member came, went or changed (leaving)
    settings: bool = False
    controller: bool = False
    requests: bool = False
    # (cache, p, record before, record now) of every changed record
    records: list[tuple[str, int, PartRecord, PartRecord]] = field(default_factory=list)


class Malformed(ValueError):
    pass


def _report_entry(st: object) -> tuple[str, int]:
    if not isinstance(st, list) or len(st) < 2 or not isinstance(st[0], str):
        raise Malformed(f"a report entry must be [state, counter], not {st!r}"[:160])
    c = st[1]
    if isinstance(c, bool) or not isinstance(c, int):
        raise Malformed(f"counter {c!r} is not an integer"[:120])
    return st[0], c


class MapBuilder:
    def __init__(self, prefix: str, caches: Iterable[CacheConfig]) -> None:
        self.prefix = prefix
        self.head = prefix + "/"
        self.map = ClusterMap({c.name: c for c in caches})
        self.settings: dict[str, Json] = {}
        self.requests: set[str] = set()
        # whole-document reports: node -> the entries that key contributed
        self._docs: dict[str, dict[PartKey, tuple[str, int]]] = {}

    # -- one key -------------------------------------------------------------------
    def _partition(self, cache: str, ps: str) -> int:
        if cache not in self.map.caches:
            raise Malformed(f"unknown cache {cache!r}")
        p = int(ps)
        if not 0 <= p < self.map.caches[cache].partitions:
            raise Malformed(f"partition {p} out of range")
        return p

    def _set_state(self, node: str, cache: str, p: int, entry: tuple[str, int] | None,
                   d: Delta) -> None:
        m = self.map
        if entry is None:
            if m.states[cache][p].pop(node, None) is not None:
                d.parts.add((cache, p))
            m.counters[cache][p].pop(node, None)
            return
        if m.states[cache][p].get(node) != entry[0]:
            d.parts.add((cache, p))
        m.states[cache][p][node] = entry[0]
        m.counters[cache][p][node] = entry[1]
        m.node_parts.setdefault(node, set()).add((cache, p))

    def _report_doc(self, node: str, val: Json | None, d: Delta) -> None:
        new: dict[PartKey, tuple[str, int]] = {}
        if val is not None:
            if not isinstance(val, dict):
                raise Malformed("a report must be an object")
            reported = val.get("caches") or {}
            if not isinstance(reported, dict):
                raise Malformed("caches is not an object")
            for cache, ps in reported.items():
                if cache not in self.map.caches:
                    continue
                if not isinstance(ps, dict):
                    raise Malformed(f"cache {cache}: partitions are not an object")
                for p_s, st in ps.items():
                    new[(cache, self._partition(cache, p_s))] = _report_entry(st)
        old = self._docs.pop(node, {})
        for key in old.keys() - new.keys():
            self._set_state(node, key[0], key[1], None, d)
        for key, entry in new.items():
            if old.get(key) != entry:
                self._set_state(node, key[0], key[1], entry, d)
        if new:
            self._docs[node] = new

    def _key(self, key: str, kv: KV | None, d: Delta) -> None:
        m = self.map
        parts = key[len(self.head):].split("/")
        kind = parts[0]
        val = kv.value if kv is not None else None
        if kind == "members" and len(parts) == 2:
            node = parts[1]
            if kv is None:
                if m.members.pop(node, None) is None:
                    return
            else:
                if not isinstance(val, dict):
                    m.members.pop(node, None)
                    raise Malformed("a member must be an object")
                addr = val.get("address", "")
                if not isinstance(addr, str):
                    raise Malformed("address is not a string")
                m.members[node] = Member(node, addr, kv.create, True, bool(val.get("leaving")),
                                         str(val.get("boot", "")), str(val.get("transfer", "")))
            d.members = True
            m.members_changes += 1
            d.parts.update(m.node_parts.get(node, ()))
        elif kind == "reports" and len(parts) == 2:
            self._report_doc(parts[1], val if kv is not None else None, d)
        elif kind == "reports" and len(parts) == 4:
            node, cache = parts[1], parts[2]
            if cache not in m.caches:
                return
            p = self._partition(cache, parts[3])
            if kv is None:
                self._set_state(node, cache, p, None, d)
            else:
                try:
                    entry = _report_entry(val)
                except Malformed:
                    self._set_state(node, cache, p, None, d)
                    raise
                self._set_state(node, cache, p, entry, d)
        elif kind == "parts" and len(parts) == 3:
            cache = parts[1]
            if cache not in m.caches:
                return
            p = self._partition(cache, parts[2])
            old = m.parts[cache][p]
            bad: Malformed | None = None
            if kv is None:
                new, mod = PartRecord(), 0
            else:
                mod = kv.mod
                try:
                    new = PartRecord.parse(val)
                except ValueError as e:
                    # absent for this node; the controller sees the same and rewrites it
                    new, bad = PartRecord(), Malformed(str(e))
            m.parts[cache][p] = new
            m.rec_mod[cache][p] = mod
            for n in new.isr:
                m.node_parts.setdefault(n, set()).add((cache, p))
            if new != old:
                d.records.append((cache, p, old, new))
                d.parts.add((cache, p))
            if bad is not None:
                raise bad
        elif kind == "pins" and len(parts) == 3:
            cache = parts[1]
            if cache not in m.pins:
                return
            p = self._partition(cache, parts[2])
            if kv is None:
                m.pins[cache].pop(p, None)
            else:
                if not isinstance(val, list) or not all(isinstance(x, str) for x in val):
                    m.pins[cache].pop(p, None)
                    raise Malformed("a pin must be a list of node ids")
                m.pins[cache][p] = list(val)
            d.parts.add((cache, p))
        elif kind == "controller" and len(parts) == 1:
            ctl = val.get("id") if isinstance(val, dict) else None
            if kv is not None and not isinstance(ctl, str):
                m.controller = None
                raise Malformed("the controller key must name a node")
            m.controller = ctl
            d.controller = True
        elif kind == "meta" and len(parts) == 1:
            creator = val.get("created_by") if isinstance(val, dict) else None
            m.creator = creator if isinstance(creator, str) else None
            initial = val.get("initial_members") if isinstance(val, dict) else None
            m.initial_members = tuple(sorted(str(n) for n in initial)) if isinstance(initial, list) else ()
        elif kind == "settings" and len(parts) == 2:
            if kv is None:
                self.settings.pop(parts[1], None)
            else:
                self.settings[parts[1]] = val
            d.settings = True
        elif kind == "requests":
            if kv is None:
                self.requests.discard(key)
            else:
                self.requests.add(key)
            d.requests = True

    # -- a batch -------------------------------------------------------------------
    def apply(self, events: Iterable[tuple[str, KV | None]], revision: int) -> Delta:
        """Apply ``(key, KV or None)`` changes seen at ``revision``; what changed."""
        d = Delta()
        m = self.map
        for key, kv in events:
            if not key.startswith(self.head):
                continue
            try:
                self._key(key, kv, d)
            except (Malformed, ValueError, TypeError) as e:
                log.warning("stage=control ignoring malformed key %s (revision %s): %s", key,
                            kv.mod if kv is not None else revision, e)
        m.epoch = max(m.epoch, revision)
        if d.members:
            m.version = max((x.order for x in m.members.values()), default=0)
            d.parts |= m.refresh_placement()
            self._prune_node_parts()
        return d

    def _prune_node_parts(self) -> None:
        """Forget partitions of nodes that are no longer members and hold nothing."""
        m = self.map
        for node in [n for n in m.node_parts if n not in m.members]:
            keep = {k for k in m.node_parts[node]
                    if node in m.states[k[0]][k[1]] or node in m.parts[k[0]][k[1]].isr}
            if keep:
                m.node_parts[node] = keep
            else:
                del m.node_parts[node]


def map_from_keys(kvs: Mapping[str, KV], revision: int, prefix: str,
                  caches: Iterable[CacheConfig]) -> tuple[ClusterMap, dict[str, Json], set[str]]:
    """(the map at ``revision``, the cluster settings, the pending request keys)."""
    b = MapBuilder(prefix, caches)
    b.apply(kvs.items(), revision)
    b.map.epoch = revision
    return b.map, b.settings, b.requests


__all__ = ["MapBuilder", "Delta", "map_from_keys"]
