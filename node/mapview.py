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
cluster's creation record. Every value is parsed by :mod:`node.schema`; a malformed
one is logged once per (key, revision) and treated as absent, never fatal, except a
partition record: the map keeps the valid record it replaced when it saw that one, and
the controller rewrites the key (``ClusterMap.garbage``).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from . import schema
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
    garbage: list[PartKey] = field(default_factory=list)    # records that went malformed


class _Skip(ValueError):
    """A key under the prefix that names no partition of this node's caches."""


class MapBuilder:
    def __init__(self, prefix: str, caches: Iterable[CacheConfig]) -> None:
        self.prefix = prefix
        self.head = prefix + "/"
        self.map = ClusterMap({c.name: c for c in caches})
        self.settings: dict[str, Json] = {}
        self.requests: set[str] = set()
        # whole-document reports: node -> the entries that key contributed
        self._docs: dict[str, dict[PartKey, schema.ReportEntry]] = {}
        self._sizes = {c.name: c.partitions for c in self.map.caches.values()}

    # -- one key -------------------------------------------------------------------
    def _partition(self, key: str, cache: str, ps: str) -> int:
        if cache not in self.map.caches:
            raise _Skip(cache)
        try:
            return schema.partition_number(ps, self.map.caches[cache].partitions)
        except ValueError as e:
            raise schema.Malformed(key, None, str(e)) from None

    def _set_state(self, node: str, cache: str, p: int, entry: schema.ReportEntry | None,
                   d: Delta) -> None:
        m = self.map
        if entry is None:
            if m.states[cache][p].pop(node, None) is not None:
                d.parts.add((cache, p))
            m.counters[cache][p].pop(node, None)
            return
        if m.states[cache][p].get(node) != entry.state:
            d.parts.add((cache, p))
        m.states[cache][p][node] = entry.state
        m.counters[cache][p][node] = entry.counter
        m.node_parts.setdefault(node, set()).add((cache, p))

    def _report_doc(self, node: str, key: str, kv: KV | None, d: Delta, snapshot: bool) -> None:
        new: dict[PartKey, schema.ReportEntry] = {}
        bad: schema.Malformed | None = None
        if kv is not None:
            try:
                new = schema.report_doc(key, kv, self._sizes)
            except schema.Malformed as e:
                if not snapshot:         # refused, as a one-partition report is
                    e.action = "kept the entries it last held"
                    raise
                bad = e
        old = self._docs.pop(node, {})
        for k in old.keys() - new.keys():
            self._set_state(node, k[0], k[1], None, d)
        for k, entry in new.items():
            if old.get(k) != entry:
                self._set_state(node, k[0], k[1], entry, d)
        if new:
            self._docs[node] = new
        if bad is not None:
            raise bad

    def _record(self, key: str, cache: str, p: int, kv: KV | None, d: Delta, snapshot: bool) -> None:
        """A record put or deleted. A malformed one is refused: when this map saw the
        valid record it replaced (event by event, not in a load), that record stays,
        else the partition reads as having none; either way the partition is in
        ``map.garbage`` with the bad value's revision, which the controller's
        compare-and-swap rewrites (node/controller.py, schema.rebuild_record)."""
        m = self.map
        old = m.parts[cache][p]
        bad: schema.Malformed | None = None
        if kv is None:
            new, mod = PartRecord(), 0
            m.garbage.pop((cache, p), None)
        else:
            mod = kv.mod
            try:
                new = schema.record(key, kv)
                m.garbage.pop((cache, p), None)
            except schema.Malformed as e:
                bad = e
                was = m.garbage.get((cache, p))
                known = was.known if was is not None else (m.rec_mod[cache][p] != 0 and not snapshot)
                e.action = ("kept the valid record it replaced; the controller rewrites it" if known else
                            "no record for now; the controller rebuilds it from the copies' reports")
                new = old if known else PartRecord()
                m.garbage[(cache, p)] = schema.BadRecord(mod, was.since if was else time.monotonic(), known)
                d.garbage.append((cache, p))
                d.parts.add((cache, p))
        m.parts[cache][p] = new
        m.rec_mod[cache][p] = mod
        for n in new.isr:
            m.node_parts.setdefault(n, set()).add((cache, p))
        if new != old:
            d.records.append((cache, p, old, new))
            d.parts.add((cache, p))
        if bad is not None:
            raise bad

    def _key(self, key: str, kv: KV | None, d: Delta, snapshot: bool = False) -> None:
        m = self.map
        parts = key[len(self.head):].split("/")
        kind = parts[0]
        if kind == "members" and len(parts) == 2:
            node = parts[1]
            doc: schema.MemberDoc | None = None
            bad: schema.Malformed | None = None
            if kv is not None:
                try:
                    schema.node_id(node)
                    doc = schema.member(key, kv)
                except schema.Malformed as e:
                    bad = e
                except ValueError as e:
                    bad = schema.Malformed(key, kv.mod, str(e))
            if doc is None:
                # gone, or malformed: not a member (a live node puts its key back)
                if m.members.pop(node, None) is None:
                    if bad is not None:
                        raise bad
                    return
            else:
                m.members[node] = Member(node, doc.address, kv.create if kv else 0, True, doc.leaving,
                                         doc.boot, doc.transfer)
            d.members = True
            m.members_changes += 1
            d.parts.update(m.node_parts.get(node, ()))
            if bad is not None:
                raise bad
        elif kind == "reports" and len(parts) == 2:
            self._report_doc(parts[1], key, kv, d, snapshot)
        elif kind == "reports" and len(parts) == 4:
            node, cache = parts[1], parts[2]
            p = self._partition(key, cache, parts[3])
            if kv is None:
                self._set_state(node, cache, p, None, d)
                return
            try:
                schema.node_id(node)
                entry = schema.report_entry(key, kv)
            except ValueError as e:
                # refused: the state this key last held stays (absent in a load). Read
                # as absent it would take the copy out of the in-sync set, and a
                # primary that dies then would leave the partition with no successor;
                # a live node puts its own report back at once
                if snapshot:
                    self._set_state(node, cache, p, None, d)
                err = e if isinstance(e, schema.Malformed) else schema.Malformed(key, kv.mod, str(e))
                err.action = "kept the state it last held; its node puts it back"
                raise err from None
            self._set_state(node, cache, p, entry, d)
        elif kind == "parts" and len(parts) == 3:
            cache = parts[1]
            self._record(key, cache, self._partition(key, cache, parts[2]), kv, d, snapshot)
        elif kind == "pins" and len(parts) == 3:
            cache = parts[1]
            if cache not in m.pins:
                return
            p = self._partition(key, cache, parts[2])
            d.parts.add((cache, p))
            if kv is None:
                m.pins[cache].pop(p, None)
                return
            try:
                m.pins[cache][p] = list(schema.pin(key, kv))
            except schema.Malformed:
                m.pins[cache].pop(p, None)
                raise
        elif kind == "controller" and len(parts) == 1:
            d.controller = True
            m.controller = None
            if kv is not None:
                m.controller = schema.controller(key, kv).id
        elif kind == "meta" and len(parts) == 1:
            m.creator, m.initial_members = None, ()
            if kv is not None:
                meta = schema.meta(key, kv)
                m.creator, m.initial_members = meta.created_by, meta.initial_members
        elif kind == "settings" and len(parts) == 2:
            d.settings = True
            self.settings.pop(parts[1], None)
            if kv is not None:
                self.settings[parts[1]] = schema.setting(key, kv)
        elif kind == "requests":
            if kv is None:
                self.requests.discard(key)
            else:
                self.requests.add(key)
            d.requests = True

    # -- a batch -------------------------------------------------------------------
    def apply(self, events: Iterable[tuple[str, KV | None]], revision: int,
              snapshot: bool = False) -> Delta:
        """Apply ``(key, KV or None)`` changes seen at ``revision``; what changed.
        ``snapshot``: the events are a load's values (``View.snapshot``), not every
        change since the last batch. A malformed value is logged once per (key,
        revision) and treated as node/schema.py says; it never stops the batch."""
        d = Delta()
        m = self.map
        for key, kv in events:
            if not key.startswith(self.head):
                continue
            try:
                self._key(key, kv, d, snapshot)
            except _Skip:
                pass
            except schema.Malformed as e:
                if e.revision is None and kv is not None:
                    e = schema.Malformed(e.key, kv.mod, e.why)
                schema.log_malformed(e, e.action or "treated as absent", log)
            except (ValueError, TypeError, KeyError, AttributeError) as e:    # a gap in the schema
                schema.log_malformed(schema.Malformed(key, kv.mod if kv is not None else revision,
                                                      f"{type(e).__name__}: {e}"), "ignored", log)
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
    b.apply(kvs.items(), revision, snapshot=True)
    b.map.epoch = revision
    return b.map, b.settings, b.requests


__all__ = ["MapBuilder", "Delta", "map_from_keys"]
