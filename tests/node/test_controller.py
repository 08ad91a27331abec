"""The controller's rules against a real etcd (no node processes): records are created
from the creator's reports, a copy leaves the in-sync set only through the controller
(and never the last one), a primary comes only from the in-sync set, a deposed
controller or primary changes nothing, and a partition whose in-sync copies are all
back without it is LOST. (Plans: tests/node/test_reassign_units.py.)"""
from __future__ import annotations

import time

import pytest

from node.cluster_map import PartRecord
from node.config import CacheConfig
from node.control import Etcd, View
from node.controller import Controller, part_key
from node.errors import BadRequest, StaleEpoch
from node.etcdserver import EtcdCluster

PREFIX = "/ferry/t"
CACHE = CacheConfig("default", partitions=4, backups=1)


class World:
    """Members, reports and the election key written straight into etcd, and a
    controller with a live view of them."""

    def __init__(self, etcd: Etcd, me: str = "a") -> None:
        self.etcd = etcd
        etcd.put(f"{PREFIX}/meta", {"caches": [CACHE.to_wire()], "created_by": "a"})
        self.view = View(etcd, PREFIX, lambda ch: None)
        etcd.put(f"{PREFIX}/controller", {"id": me, "boot": "b"})
        kv = etcd.get(f"{PREFIX}/controller")
        self.ctl = Controller(me, PREFIX, etcd, self.view, {"default": CACHE}, kv.create)

    def member(self, n: str, owning: list[int] = (), moving: list[int] = ()) -> None:  # type: ignore[assignment]
        self.etcd.put(f"{PREFIX}/members/{n}", {"address": f"addr-{n}", "boot": "b", "leaving": False})
        parts = {str(p): ["OWNING", 0] for p in owning}
        parts.update({str(p): ["MOVING", 0] for p in moving})
        self.etcd.put(f"{PREFIX}/reports/{n}", {"boot": "b", "caches": {"default": parts}})

    def gone(self, n: str) -> None:
        self.etcd.txn([], [], [f"{PREFIX}/members/{n}", f"{PREFIX}/reports/{n}"])

    def three_in_sync(self, p: int) -> None:
        """a created the cluster and leads p; b and c joined p's in-sync set through a."""
        self.member("a", owning=[0, 1, 2, 3])
        self.member("b", owning=[p])
        self.member("c", owning=[p])
        self.decide()
        self.view.load()
        self.ctl.alter_isr("default", p, "a", 1, [], ["b", "c"])

    def rec(self, p: int) -> PartRecord:
        return PartRecord.from_json(self.etcd.get(part_key(PREFIX, "default", p)).value)

    def decide(self) -> int:
        self.view.load()
        return self.ctl.decide()


def test_new_cluster_records_come_from_the_creators_reports(etcd):
    w = World(etcd)
    assert w.decide() == 0                  # nobody reports anything yet: nothing to decide
    w.member("a", owning=[0, 1, 2, 3])
    w.member("b")
    assert w.decide() == 4
    assert all(w.rec(p) == PartRecord("a", ("a",), 1, False, 1) for p in range(4))
    assert w.decide() == 0                  # idempotent


def test_removal_needs_the_primary_at_its_epoch_and_goes_through_the_controller(etcd):
    w = World(etcd)
    w.member("a", owning=[0, 1, 2, 3])
    w.member("b", owning=[0])
    w.decide()
    w.view.load()
    rec = w.ctl.alter_isr("default", 0, "a", 1, [], ["b"])      # a (term 1) admits b
    assert rec == PartRecord("a", ("a", "b"), 2, False, 1)
    with pytest.raises(StaleEpoch):                              # an old term changes nothing
        w.ctl.alter_isr("default", 0, "a", 0, ["b"], [])
    with pytest.raises(StaleEpoch):                              # nor does a non-primary
        w.ctl.alter_isr("default", 0, "b", 1, ["a"], [])
    with pytest.raises(BadRequest):
        w.ctl.alter_isr("default", 0, "a", 1, ["a"], [])
    assert w.rec(0) == PartRecord("a", ("a", "b"), 2, False, 1)
    assert w.ctl.alter_isr("default", 0, "a", 1, ["b"], []) == PartRecord("a", ("a",), 3, False, 1)


def test_an_in_sync_change_by_the_controller_deposes_nobody(etcd):
    """A dead copy leaving the set bumps the epoch but not the primary's term: the
    primary's next request (in its term) is still honoured."""
    w = World(etcd)
    w.three_in_sync(0)
    w.gone("c")
    w.decide()
    r = w.rec(0)
    assert r.isr == ("a", "b") and r.term == 1 and r.epoch == 3
    assert w.ctl.alter_isr("default", 0, "a", 1, ["b"], []).isr == ("a",)


def test_a_deposed_controller_writes_nothing(etcd):
    w = World(etcd)
    w.member("a", owning=[0, 1, 2, 3])
    # another node won the election meanwhile (the election key was re-created)
    etcd.delete(f"{PREFIX}/controller")
    etcd.put(f"{PREFIX}/controller", {"id": "b", "boot": "b"})
    assert w.decide() == 0
    assert etcd.get(part_key(PREFIX, "default", 0)) is None
    with pytest.raises(StaleEpoch):
        w.ctl.alter_isr("default", 0, "a", 0, [], [])


def test_a_stale_copy_is_never_made_primary(etcd):
    """b holds an OWNING copy of 0 but is not in sync; when the primary a fails, the
    partition waits for a instead of being served from b's copy."""
    w = World(etcd)
    w.member("a", owning=[0, 1, 2, 3])
    w.decide()
    w.member("b", owning=[0])                 # e.g. back from a restart: not in sync
    w.decide()
    assert w.rec(0).isr == ("a",)
    w.gone("a")                               # a's lease expired
    w.decide()
    r = w.rec(0)
    assert r.primary is None and r.isr == ("a",) and not r.lost      # waits for a
    w.member("a", owning=[0, 1, 2, 3])       # a is back with its copy
    w.decide()
    assert w.rec(0).primary == "a"


def test_failover_goes_to_a_live_in_sync_copy_and_dead_copies_leave_the_set(etcd):
    w = World(etcd)
    w.three_in_sync(1)
    w.gone("a")
    w.decide()
    r = w.rec(1)
    assert r.primary in ("b", "c") and set(r.isr) == {"b", "c"} and r.epoch == 3 and r.term == 2
    w.member("b", moving=[1])                 # b resyncs: it leaves the set, c leads
    w.decide()
    assert w.rec(1).isr == ("c",) and w.rec(1).primary == "c"


def test_a_partition_whose_in_sync_copies_came_back_empty_is_lost(etcd):
    w = World(etcd)
    w.member("a", owning=[0, 1, 2, 3])
    w.decide()
    w.member("a", owning=[1, 2, 3])           # a lost partition 0 (its file was deleted)
    w.decide()
    r = w.rec(0)
    assert r.lost and r.primary is None and r.isr == ("a",)


def test_the_view_follows_etcd_and_resumes_after_an_outage(tmp_path):
    c = EtcdCluster(str(tmp_path / "etcd")).start()
    try:
        e = Etcd(c.endpoints)
        seen: list[object] = []
        v = View(e, PREFIX, seen.append)
        v.load()
        v.start()
        e.put(f"{PREFIX}/x", 1)
        deadline = time.monotonic() + 5
        while v.get(f"{PREFIX}/x") is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert v.get(f"{PREFIX}/x").value == 1
        c.kill()                                   # the whole control plane goes away
        time.sleep(1.0)
        c.restart()
        e.put(f"{PREFIX}/x", 2)
        deadline = time.monotonic() + 10
        while v.get(f"{PREFIX}/x").value != 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert v.get(f"{PREFIX}/x").value == 2     # no restart of the watcher needed
        v.stop()
    finally:
        c.stop()


def _initial_world(etcd: Etcd, init: list[str]) -> World:
    """A World whose cluster record names ``init`` as its initial members."""
    etcd.put(f"{PREFIX}/meta", {"caches": [CACHE.to_wire()], "created_by": "a", "initial_members": init})
    w = World.__new__(World)
    w.etcd = etcd
    w.view = View(etcd, PREFIX, lambda ch: None)
    etcd.put(f"{PREFIX}/controller", {"id": "a", "boot": "b"})
    w.ctl = Controller("a", PREFIX, etcd, w.view, {"default": CACHE}, etcd.get(f"{PREFIX}/controller").create)
    return w


def test_a_new_cluster_with_initial_members_starts_every_copy_in_sync(etcd, monkeypatch):
    """Each initial member made its rendezvous share, empty: a record waits for all of
    its initial owners (up to INITIAL_WAIT_S), then names them all in sync, the ideal
    primary first. Nothing has to move for the cluster to settle."""
    from node.assignment import owners
    init = ["a", "b", "c"]
    w = _initial_world(etcd, init)
    share = {n: [p for p in range(4) if n in owners("default", p, init, 1)] for n in init}
    w.member("a", owning=share["a"])
    w.member("b", owning=share["b"])
    # c has not reported yet: partitions it owns wait; the others are made at once
    made = w.decide()
    assert made == sum(1 for p in range(4) if "c" not in owners("default", p, init, 1))
    for p in range(4):
        want = owners("default", p, init, 1)
        if "c" not in want:
            assert w.rec(p) == PartRecord(want[0], tuple(want), 1, False, 1)
    w.member("c", owning=share["c"])
    w.decide()
    for p in range(4):
        want = owners("default", p, init, 1)
        assert w.rec(p) == PartRecord(want[0], tuple(want), 1, False, 1)


def test_initial_owners_that_never_come_are_not_waited_for_forever(etcd, monkeypatch):
    import node.controller as ctlmod
    from node.assignment import owners
    init = ["a", "b", "c"]
    w = _initial_world(etcd, init)
    w.member("a", owning=[p for p in range(4) if "a" in owners("default", p, init, 1)])
    monkeypatch.setattr(ctlmod, "INITIAL_WAIT_S", 0.0)
    w.decide()
    for p in range(4):
        want = owners("default", p, init, 1)
        if "a" in want:
            assert w.rec(p) == PartRecord("a", ("a",), 1, False, 1)   # made with who came
        else:
            assert etcd.get(part_key(PREFIX, "default", p)) is None     # nobody holds it yet


class _Counted:
    """Counts the etcd requests a client makes (by gateway path)."""

    def __init__(self, etcd: Etcd) -> None:
        self.calls: list[str] = []
        post = etcd.post

        def counted(path, body):
            self.calls.append(path)
            return post(path, body)
        etcd.post = counted  # type: ignore[method-assign]


def test_a_round_on_a_view_behind_its_own_writes_decides_from_what_it_wrote(etcd):
    """The controller's view shows its own writes only when the watch delivers them. A
    round before that decides from the records it wrote, not the older ones: nothing
    is written again, and no transaction fails on a revision it has moved past."""
    w = World(etcd)
    w.member("a", owning=[0, 1, 2, 3])
    w.member("b")
    assert w.decide() == 4                  # the view did not see these writes
    n = _Counted(etcd)
    assert w.ctl.decide() == 0              # same view: the records it wrote are current
    assert n.calls == []
    # and a change decided on that view compares the revision it wrote
    w.view.load()
    rec = w.ctl.alter_isr("default", 1, "a", 1, [], [])
    assert rec.epoch == 2
    w.gone("b")
    w.view.load()                           # shows b gone; p1's record as alter_isr wrote it
    assert w.ctl.decide() == 0


def test_a_request_decided_here_is_not_decided_again_before_the_view_shows_it(etcd):
    """A request the controller applied is deleted in the same transaction; until its
    view shows the deletion it still lists the request. It is not planned again (no
    refusal, no failed transaction, no extra read)."""
    w = World(etcd)
    w.member("a", owning=[0, 1, 2, 3])
    w.member("b", owning=[0, 1])
    w.decide()
    for p in (0, 1):
        etcd.put(f"{PREFIX}/requests/default/{p}/a", {"op": "alter_isr", "term": 1, "remove": [],
                                                       "add": ["b"]})
    w.view.load()
    assert w.ctl.handle_requests() == 2
    assert [w.rec(p).isr for p in (0, 1)] == [("a", "b"), ("a", "b")]
    assert etcd.get(f"{PREFIX}/requests/default/0/a") is None
    n = _Counted(etcd)
    assert w.ctl.handle_requests() == 0     # the view still shows both requests
    assert n.calls == []
    # a new request for the same key (a new mod revision) is looked at as usual
    etcd.put(f"{PREFIX}/requests/default/0/a", {"op": "alter_isr", "term": 1, "remove": ["b"],
                                                 "add": []})
    w.view.load()
    assert w.ctl.handle_requests() == 1
    assert w.rec(0).isr == ("a",) and w.rec(1).isr == ("a", "b")
