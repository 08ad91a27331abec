"""The map kept by deltas equals the map built from scratch; the placement table equals
rendezvous ranking; the map pages back into the whole map. No etcd needed."""
from __future__ import annotations

import random

from hypothesis import given, settings, strategies as st

from node.assignment import owners
from node.cluster_map import ClusterMap, PartRecord
from node.config import CacheConfig
from node.control import KV
from node.mapview import MapBuilder, map_from_keys
from node.placement import Placement

P = "/ferry"
CACHES = [CacheConfig(name="a", partitions=40, backups=1), CacheConfig(name="b", partitions=25, backups=2)]
NODES = [f"n{i}" for i in range(7)]


def _random_event(rng: random.Random, rev: int) -> tuple[str, KV | None]:
    kind = rng.choice(["members", "reports", "reports", "parts", "parts", "pins", "controller", "meta",
                       "settings", "requests", "garbage"])
    node = rng.choice(NODES)
    cache = rng.choice(CACHES)
    p = rng.randrange(cache.partitions)
    dead = rng.random() < 0.25

    def kv(v):
        return None if dead else KV(v, rev, rev, 0)
    if kind == "members":
        return f"{P}/members/{node}", kv({"address": f"h:{rev}", "leaving": rng.random() < 0.2})
    if kind == "reports":
        return f"{P}/reports/{node}/{cache.name}/{p}", kv([rng.choice(["OWNING", "MOVING", "RENTING"]), rev])
    if kind == "parts":
        isr = rng.sample(NODES, rng.randint(0, 3))
        return f"{P}/parts/{cache.name}/{p}", kv({"primary": isr[0] if isr else None, "isr": isr,
                                                  "epoch": rev, "term": rev // 2, "lost": False})
    if kind == "pins":
        return f"{P}/pins/{cache.name}/{p}", kv(rng.sample(NODES, cache.backups + 1))
    if kind == "controller":
        return f"{P}/controller", kv({"id": node, "boot": "b"})
    if kind == "meta":
        return f"{P}/meta", kv({"created_by": node, "caches": []})
    if kind == "settings":
        return f"{P}/settings/transfer.rate_limit", kv(rev)
    if kind == "requests":
        return f"{P}/requests/{cache.name}/{p}/{node}", kv({"op": "alter_isr"})
    return f"{P}/parts/{cache.name}/{p}", kv(rng.choice(["x", {"epoch": "7"}, {"isr": "n1"}, [1, 2]]))


def _same(a: ClusterMap, b: ClusterMap) -> None:
    assert a.members == b.members
    assert a.states == b.states and a.counters == b.counters
    assert a.rec_mod == b.rec_mod
    # a record that went malformed: the map that saw the valid one before keeps it (the
    # controller rewrites the key from it); one built from the keys alone has none
    kept = {k for k, g in a.garbage.items() if g.known}
    assert {k for k in a.garbage} == {k for k in b.garbage}
    for c, lst in a.parts.items():
        for p, rec in enumerate(lst):
            assert b.parts[c][p] == (PartRecord() if (c, p) in kept else rec)
    assert a.pins == b.pins and a.controller == b.controller and a.creator == b.creator
    assert a.version == b.version
    for c in a.caches:
        for p in range(a.caches[c].partitions):
            assert a.ideal(c, p) == b.ideal(c, p) == b.ideal_slow(c, p)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32))
def test_deltas_give_the_map_built_from_scratch(seed):
    rng = random.Random(seed)
    b = MapBuilder(P, CACHES)
    kvs: dict[str, KV] = {}
    for rev in range(1, 400):
        batch = [_random_event(rng, rev) for _ in range(rng.randint(1, 5))]
        d = b.apply(batch, rev)
        for k, v in batch:
            if v is None:
                kvs.pop(k, None)
            else:
                kvs[k] = v
        assert all(isinstance(k, tuple) for k in d.parts)
        if rev % 50 == 0:
            ref, settings_, requests = map_from_keys(kvs, rev, P, CACHES)
            _same(b.map, ref)
            assert b.settings == settings_ and b.requests == requests


def test_a_delta_names_the_partitions_it_touched():
    b = MapBuilder(P, CACHES)
    b.apply([(f"{P}/members/{n}", KV({"address": "h"}, i + 1, i + 1, 0)) for i, n in enumerate(NODES[:3])], 3)
    d = b.apply([(f"{P}/reports/n1/a/5", KV(["OWNING", 3], 4, 4, 0))], 4)
    assert d.parts == {("a", 5)}
    d = b.apply([(f"{P}/parts/a/7", KV({"primary": "n2", "isr": ["n2"], "epoch": 1}, 5, 5, 0))], 5)
    assert d.parts == {("a", 7)} and d.records[0][3] == PartRecord("n2", ("n2",), 1, False, 0)
    # n1 goes: the partitions it reported, and those whose ideal owners change
    d = b.apply([(f"{P}/members/n1", None)], 6)
    assert ("a", 5) in d.parts and d.members
    moved = {(c.name, p) for c in CACHES for p in range(c.partitions)
             if "n1" in owners(c.name, p, NODES[:3], c.backups)}
    assert moved <= d.parts
    assert len(d.parts) < sum(c.partitions for c in CACHES)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sets(st.sampled_from([f"m{i}" for i in range(30)]), max_size=30), min_size=1, max_size=6))
def test_placement_follows_any_membership_sequence(steps):
    pl = Placement("c", 300, 3)
    for nodes in steps:
        before = {p: pl.owners(p) for p in range(300)}
        changed = set(int(p) for p in pl.update(nodes))
        for p in range(300):
            assert pl.owners(p) == owners("c", p, nodes, 2)
        assert changed == {p for p in range(300) if before[p] != pl.owners(p)}


def test_the_map_pages_back_into_the_whole_map():
    caches = [CacheConfig(name="a", partitions=5000, backups=1), CacheConfig(name="b", partitions=3001, backups=1)]
    b = MapBuilder(P, caches)
    ev = [(f"{P}/members/n{i}", KV({"address": f"h{i}"}, i + 1, i + 1, 0)) for i in range(3)]
    ev += [(f"{P}/parts/{c.name}/{p}", KV({"primary": f"n{p % 3}", "isr": [f"n{p % 3}"], "epoch": p, "term": 1},
                                          10, 10, 0)) for c in caches for p in range(c.partitions)]
    ev += [(f"{P}/reports/n{p % 3}/{c.name}/{p}", KV(["OWNING", p], 10, 10, 0)) for c in caches
           for p in range(c.partitions)]
    b.apply(ev, 10)
    calls = []

    def call(start, count):
        calls.append((start, count))
        return b.map.to_wire(start, min(count, ClusterMap.PAGE))
    m = ClusterMap.fetch(call)
    assert len(calls) == -(-8001 // ClusterMap.PAGE)
    assert m.parts == b.map.parts and m.states == b.map.states and m.counters == b.map.counters
    import json
    assert max(len(json.dumps(b.map.to_wire(s, ClusterMap.PAGE))) for s, _ in calls) < 512 * 1024
