"""Reassignment plans without node processes: the plan format (malformed and hostile
files), the checks against a cluster map (dead, unknown or leaving nodes, unknown
caches, partitions out of range), generation (--add, --remove, --balance), the
operator's store and cancel, and the controller's driver against a real etcd with
members, reports and records written by hand: bounded moves in flight, done when the
new owners are in sync and the old ones gone, cancel puts the old pin back, the
throttle goes back at the end."""
from __future__ import annotations

import json
import os
import threading

import pytest

from node.cluster_map import ClusterMap, PartRecord
from node.config import CacheConfig
from node.control import KV, Etcd, View
from node.controller import Controller
from node.errors import PlanError
from node.mapview import map_from_keys
from node.reassign import (CANCELLED, DONE, IN_SYNC, MOVING, WAITING, Move, assess, check, generate,
                           parse_plan, read_plan)
from node.reassign_ops import cancel, execute, plan_status, read, verify

PREFIX = "/ferry/t"
CACHE = CacheConfig("default", partitions=8, backups=1)


def kv(v: object, mod: int = 1) -> KV:
    return KV(v, mod, mod, 0)


def cluster_map(members: dict[str, bool], owners: dict[int, list[str]], *, moving: dict[int, list[str]] = {},  # noqa: B006
                pins: dict[int, list[str]] = {}) -> ClusterMap:  # noqa: B006
    """A map with ``members`` (id -> leaving) and per partition its owners (primary
    first, OWNING and in sync)."""
    kvs = {f"{PREFIX}/members/{n}": kv({"address": f"a-{n}", "leaving": lv}) for n, lv in members.items()}
    for p, own in owners.items():
        kvs[f"{PREFIX}/parts/default/{p}"] = kv({"primary": own[0], "isr": own, "epoch": 1, "term": 1})
        for n in own:
            kvs[f"{PREFIX}/reports/{n}/default/{p}"] = kv(["OWNING", 5])
    for p, ns in moving.items():
        for n in ns:
            kvs[f"{PREFIX}/reports/{n}/default/{p}"] = kv(["MOVING", 0])
    for p, own in pins.items():
        kvs[f"{PREFIX}/pins/default/{p}"] = kv(own)
    return map_from_keys(kvs, 10, PREFIX, [CACHE])[0]


# -- the format --------------------------------------------------------------------------------
@pytest.mark.parametrize("raw, needle", [
    (b"{not json", "not valid JSON"),
    (b"[]", "expected"),
    (b'{"moves": []}', "at least one move"),
    (b'{"moves": [3]}', "moves[0] must be an object"),
    (b'{"moves": [{"partition": "1", "to": ["a"]}]}', "partition must be an integer"),
    (b'{"moves": [{"partition": true, "to": ["a"]}]}', "partition must be an integer"),
    (b'{"moves": [{"partition": 1, "to": "a"}]}', "to must be a non-empty list"),
    (b'{"moves": [{"partition": 1, "to": []}]}', "to must be a non-empty list"),
    (b'{"moves": [{"cache": 5, "partition": 1, "to": ["a"]}]}', "cache must be a string"),
    (b'{"moves": [{"partition": 1, "to": ["a"], "from": "b"}]}', "from must be a list"),
    (b'{"version": 2, "moves": [{"partition": 1, "to": ["a"]}]}', "version 2"),
    (b"[" * 100_000 + b"]" * 100_000, "nested more than"),
    (b'{"moves": [{"partition": 1, "to": [[[[[[[["n1"]]]]]]]]}]}', "nested more than"),
    (b'{"moves": [' + b'{"partition": 1, "to": ["n1"]}, ' * 40_000 + b'{"partition": 1, "to": ["n1"]}]}',
     "more than the limit"),
], ids=lambda x: None)
def test_malformed_plans_are_refused_with_a_reason(raw, needle):
    with pytest.raises(PlanError) as e:
        parse_plan(raw)
    assert needle in str(e.value)


def test_a_plan_file_round_trips_and_defaults_the_cache():
    assert parse_plan(b'{"moves": [{"partition": 2, "to": ["a", "b"]}]}') == [Move("default", 2, ("a", "b"))]
    mv = Move("default", 3, ("n3", "n1"), ("n1", "n2"))
    assert parse_plan(json.dumps({"moves": [mv.to_json()]})) == [mv]


def test_plan_files_that_are_not_small_regular_files_are_refused_unread(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * ((1 << 20) + 1))
    with pytest.raises(PlanError, match="more than the limit"):
        read_plan(str(big))
    fifo = str(tmp_path / "fifo.json")
    os.mkfifo(fifo)
    out: list[BaseException] = []

    def read_fifo() -> None:
        try:
            read_plan(fifo)
        except BaseException as e:     # noqa: BLE001 (looked at below)
            out.append(e)
    t = threading.Thread(target=read_fifo, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "reading a FIFO plan blocked"
    assert isinstance(out[0], PlanError) and "not a regular file" in str(out[0])
    with pytest.raises(PlanError, match="cannot read"):
        read_plan(str(tmp_path / "absent.json"))


# -- checks against the cluster -----------------------------------------------------------------
@pytest.mark.parametrize("move, needle", [
    (Move("default", 1, ("n1", "n9")), "n9 is not a live member (dead, or never a node of this cluster)"),
    (Move("default", 1, ("n1", "n4")), "n4 is not a live member: it is dead"),
    (Move("default", 1, ("n1", "n3")), "n3 is leaving"),
    (Move("nope", 1, ("n1", "n2")), "unknown cache 'nope'"),
    (Move("default", 8, ("n1", "n2")), "partitions 0..7, not 8"),
    (Move("default", -1, ("n1", "n2")), "partitions 0..7, not -1"),
    (Move("default", 1, ("n1",)), "must name 2 different nodes"),
    (Move("default", 1, ("n1", "n1")), "must name 2 different nodes"),
])
def test_a_plan_that_does_not_fit_the_cluster_is_refused(move, needle):
    # n4 was a member (it is still in partition 0's in-sync set) and its lease is gone
    m = cluster_map({"n1": False, "n2": False, "n3": True}, {0: ["n1", "n4"], 1: ["n1", "n2"]})
    with pytest.raises(PlanError) as e:
        check([Move("default", 2, ("n2", "n1")), move], m)
    assert needle in str(e.value) and "moves[1]" in str(e.value)
    check([Move("default", 2, ("n2", "n1"))], m)


def test_a_partition_twice_in_one_plan_is_refused():
    m = cluster_map({"n1": False, "n2": False}, {})
    with pytest.raises(PlanError, match=r"moves\[1\]: default/2 is moved by moves\[0\]"):
        check([Move("default", 2, ("n2", "n1")), Move("default", 2, ("n1", "n2"))], m)


# -- generation ----------------------------------------------------------------------------------
def settled(nodes: list[str]) -> dict[int, list[str]]:
    from node.assignment import owners
    return {p: owners("default", p, nodes, 1) for p in range(CACHE.partitions)}


def test_remove_moves_only_the_node_s_copies_and_keeps_the_other_owners():
    own = settled(["n1", "n2", "n3"])
    m = cluster_map({n: False for n in ("n1", "n2", "n3")}, own)
    moves = generate(m, remove="n2")
    assert {mv.partition for mv in moves} == {p for p, o in own.items() if "n2" in o}
    for mv in moves:
        assert "n2" not in mv.to and list(mv.source) == own[mv.partition]
        kept = [n for n in own[mv.partition] if n != "n2"]
        assert mv.to[:len(kept)] == tuple(kept)          # the other owner stays, primary if it was
    # what rendezvous hashing gives without n2: no pin is needed once n2 is gone
    from node.assignment import owners
    assert all(list(mv.to) == owners("default", mv.partition, ["n1", "n3"], 1) for mv in moves)
    with pytest.raises(PlanError, match="only 1 live member"):
        generate(cluster_map({"n1": False, "n2": False}, settled(["n1", "n2"])), remove="n2")
    with pytest.raises(PlanError, match="no partition names it"):
        generate(m, remove="n9")


def test_add_and_balance_go_back_to_rendezvous_owners():
    # every partition pinned to n1,n2 (an earlier drain of n3): n3 is live but holds nothing
    own = settled(["n1", "n2"])
    m = cluster_map({n: False for n in ("n1", "n2", "n3")}, own, pins=own)
    want = settled(["n1", "n2", "n3"])
    add = generate(m, add="n3")
    assert {mv.partition for mv in add} == {p for p, o in want.items() if "n3" in o}
    assert all(list(mv.to) == want[mv.partition] for mv in add)
    bal = generate(m, balance=True)
    assert {mv.partition for mv in bal} == {p for p in want if want[p] != own[p]}
    with pytest.raises(PlanError, match="n4 is not a live member"):
        generate(m, add="n4")
    with pytest.raises(PlanError, match="one of"):
        generate(m, add="n3", balance=True)
    assert generate(cluster_map({"n1": False, "n2": False}, own), balance=True) == []


def test_assess_follows_a_move_through_its_stages():
    to = ["n3", "n1"]
    m = cluster_map({n: False for n in ("n1", "n2", "n3")}, {0: ["n1", "n2"]})
    assert assess(m, "default", 0, to) == (MOVING, "n3 to start its move (a free move slot on n3)")
    m = cluster_map({n: False for n in ("n1", "n2", "n3")}, {0: ["n1", "n2"]}, moving={0: ["n3"]})
    assert assess(m, "default", 0, to) == (MOVING, "n3 to finish its move")
    m = cluster_map({n: False for n in ("n1", "n2", "n3")}, {0: ["n1", "n2", "n3"]})
    assert assess(m, "default", 0, to) == (IN_SYNC, "hand-off of the primary role from n1 to n3")
    m = cluster_map({n: False for n in ("n1", "n2", "n3")}, {0: ["n3", "n1", "n2"]})
    assert assess(m, "default", 0, to)[0] == IN_SYNC and "n2 (OWNING) to evict" in assess(m, "default", 0, to)[1]
    m = cluster_map({n: False for n in ("n1", "n2", "n3")}, {0: ["n3", "n1"]})
    assert assess(m, "default", 0, to) == (DONE, "")
    m = cluster_map({"n1": False, "n2": False}, {0: ["n1", "n2"]})
    assert assess(m, "default", 0, to)[0] == MOVING and "n3 is not a live member" in assess(m, "default", 0, to)[1]


# -- the driver, against a real etcd --------------------------------------------------------------
class World:
    """Members, reports and records written straight into etcd, the controller with a
    view of them; the nodes' part (moving, admitting, handing over, evicting) is done
    by hand."""

    def __init__(self, etcd: Etcd) -> None:
        self.etcd = etcd
        etcd.put(f"{PREFIX}/meta", {"caches": [CACHE.to_wire()], "created_by": "n1"})
        etcd.put(f"{PREFIX}/controller", {"id": "n1", "boot": "b"})
        self.view = View(etcd, PREFIX, lambda ch: None)
        self.ctl = Controller("n1", PREFIX, etcd, self.view, {"default": CACHE},
                              etcd.get(f"{PREFIX}/controller").create)
        for n in ("n1", "n2", "n3"):
            etcd.put(f"{PREFIX}/members/{n}", {"address": f"a-{n}", "boot": "b", "leaving": False})

    def hold(self, p: int, owners: list[str], moving: list[str] = (), gone: list[str] = ()) -> None:  # type: ignore[assignment]
        self.etcd.put(f"{PREFIX}/parts/default/{p}", PartRecord(owners[0], tuple(owners), 1, False, 1).to_json())
        for n in owners:
            self.etcd.put(f"{PREFIX}/reports/{n}/default/{p}", ["OWNING", 5])
        for n in moving:
            self.etcd.put(f"{PREFIX}/reports/{n}/default/{p}", ["MOVING", 0])
        for n in gone:
            self.etcd.delete(f"{PREFIX}/reports/{n}/default/{p}")

    def step(self) -> None:
        self.view.load()
        self.ctl.decide()             # the records (unchanged here), then the plans
        self.view.load()

    def pin(self, p: int) -> object:
        kv_ = self.etcd.get(f"{PREFIX}/pins/default/{p}")
        return kv_.value if kv_ else None

    def stages(self, name: str) -> list[str]:
        snap = read(self.etcd, PREFIX)
        return [mv["stage"] for mv in plan_status(snap, snap.plans[name])["moves"]]


def test_the_controller_moves_a_bounded_number_at_a_time_and_marks_them_done(etcd):
    w = World(etcd)
    for p in range(4):
        w.hold(p, ["n1", "n2"])
    etcd.put(f"{PREFIX}/pins/default/3", ["n1", "n2"])        # an earlier plan's
    moves = [Move("default", p, ("n3", "n1"), ("n1", "n2")) for p in (0, 1, 3)]
    execute(etcd, PREFIX, "p1", moves, max_moves=2, throttle=123456)
    assert etcd.get(f"{PREFIX}/settings/transfer.rate_limit").value == 123456
    w.step()
    assert [w.pin(p) for p in (0, 1, 3)] == [["n3", "n1"], ["n3", "n1"], ["n1", "n2"]]
    assert w.stages("p1") == [MOVING, MOVING, WAITING]
    w.step()                                                 # nothing changed: still 2 in flight
    assert w.pin(3) == ["n1", "n2"]
    # the nodes' part for partition 0: n3 moved, was admitted, took over, n2 evicted
    w.hold(0, ["n3", "n1"], gone=["n2"])
    w.step()
    assert w.stages("p1") == [DONE, MOVING, MOVING] and w.pin(3) == ["n3", "n1"]
    # n3,n1 are not what rendezvous hashing gives partition 0 over n1..n3: the pin stays
    from node.assignment import owners
    assert (w.pin(0) is None) == (owners("default", 0, ["n1", "n2", "n3"], 1) == ["n3", "n1"])
    w.hold(1, ["n3", "n1"], gone=["n2"])
    w.hold(3, ["n3", "n1"], gone=["n2"])
    w.step()
    snap = read(etcd, PREFIX)
    assert snap.plans["p1"].end["state"] == DONE and verify(snap, "p1")["ok"]
    assert etcd.get(f"{PREFIX}/settings/transfer.rate_limit").value == 0      # unset before: the default


def test_cancel_puts_back_the_pins_the_moves_replaced(etcd):
    w = World(etcd)
    for p in range(3):
        w.hold(p, ["n1", "n2"])
    etcd.put(f"{PREFIX}/pins/default/1", ["n1", "n2"])
    etcd.put(f"{PREFIX}/settings/transfer.rate_limit", 777)
    moves = [Move("default", p, ("n3", "n1")) for p in range(3)]
    execute(etcd, PREFIX, "p2", moves, max_moves=2, throttle=1000)
    w.step()
    w.hold(0, ["n3", "n1"], gone=["n2"])                     # partition 0 done
    w.hold(1, ["n1", "n2"], moving=["n3"])                   # partition 1 moving
    w.step()
    assert w.stages("p2") == [DONE, MOVING, MOVING]
    assert cancel(etcd, PREFIX, "p2", wait_s=0).end is None    # asked; no controller round yet
    w.step()
    assert read(etcd, PREFIX).plans["p2"].end["state"] == CANCELLED
    assert w.stages("p2") == [DONE, CANCELLED, CANCELLED]
    assert w.pin(1) == ["n1", "n2"] and w.pin(2) is None      # the pins they replaced
    assert etcd.get(f"{PREFIX}/settings/transfer.rate_limit").value == 777
    with pytest.raises(PlanError, match="ended already"):
        cancel(etcd, PREFIX, "p2")
    # the same plan again, once it ended: replaced, its old progress gone
    execute(etcd, PREFIX, "p2", moves[1:])
    assert [m["stage"] for m in plan_status(read(etcd, PREFIX), read(etcd, PREFIX).plans["p2"])["moves"]] \
        == [WAITING, WAITING]


def test_plans_that_collide_or_are_stored_twice_are_refused(etcd):
    w = World(etcd)
    w.hold(0, ["n1", "n2"])
    execute(etcd, PREFIX, "a", [Move("default", 0, ("n3", "n1"))], throttle=5000)
    with pytest.raises(PlanError, match="still running"):
        execute(etcd, PREFIX, "a", [Move("default", 1, ("n3", "n1"))])
    with pytest.raises(PlanError, match="plan a moves this partition"):
        execute(etcd, PREFIX, "b", [Move("default", 0, ("n2", "n1"))])
    with pytest.raises(PlanError, match="holds a throttle"):
        execute(etcd, PREFIX, "b", [Move("default", 1, ("n2", "n1"))], throttle=1)
    with pytest.raises(PlanError, match="plan name"):
        execute(etcd, PREFIX, "a/b", [Move("default", 1, ("n2", "n1"))])
    with pytest.raises(PlanError, match="--throttle"):
        execute(etcd, PREFIX, "c", [Move("default", 1, ("n2", "n1"))], throttle=-1)
    with pytest.raises(PlanError, match="no Ferry cluster"):
        execute(etcd, "/ferry/none", "c", [Move("default", 1, ("n2", "n1"))])
    assert read(etcd, PREFIX).plans.keys() == {"a"}
    execute(etcd, PREFIX, "ab", [Move("default", 1, ("n3", "n1"))])
    one = read(etcd, PREFIX, "a")           # one plan's keys only (a poll): not "ab"'s
    assert one.plans.keys() == {"a"} and not one.whole and set(one.m.members) == {"n1", "n2", "n3"}


def test_a_stored_plan_that_does_not_parse_is_ended_as_refused(etcd):
    w = World(etcd)
    etcd.put(f"{PREFIX}/reassign/junk", {"moves": [{"partition": 99, "to": ["n1", "n2"]}]})
    w.step()
    end = read(etcd, PREFIX).plans["junk"].end
    assert end["state"] == "refused" and "partitions 0..7" in end["reason"]
