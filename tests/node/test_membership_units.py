"""The member's failure detector without processes: a member cut off from its
coordinator suspects it only locally (the map and reconcile are untouched), and after
the link heals learns from the successor's newer map that it was declared failed,
rejoins, and holds its copies as unconfirmed (node bug 1 of the crash harness)."""
from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from node.cluster_map import ClusterMap, Member
from node.config import CacheConfig
from node.errors import Unavailable
from node.membership import Membership
from node.states import State, StateTable

CACHE = CacheConfig("default", partitions=4, backups=1)


def cluster(epoch: int, n3_alive: bool = True) -> ClusterMap:
    m = ClusterMap({CACHE.name: CACHE})
    m.version, m.epoch = 3, epoch
    for order, n in enumerate(("n1", "n2", "n3"), 1):
        m.members[n] = Member(n, f"addr-{n}", order, True, False, f"boot-{n}")
    m.members["n3"].alive = n3_alive
    return m


class Peers:
    """The RPC pool: each address answers with its handler (an exception is raised)."""

    def __init__(self) -> None:
        self.answers: dict[str, Any] = {}
        self.calls: list[tuple[str, str]] = []

    def call(self, addr: str, method: str, **_: Any) -> Any:
        self.calls.append((addr, method))
        a = self.answers[addr]
        if isinstance(a, Exception):
            raise a
        return a


class Member3(Membership):
    """Just enough of a node for the member's side of membership."""

    def __init__(self, data: str) -> None:
        self.id, self.boot = "n3", "boot-n3"
        self.cfg = SimpleNamespace(failure_timeout_s=0.2, heartbeat_interval_s=0.05, data=data,
                                   join=[], address="addr-n3")
        self.map, self.map_lock, self._save_lock = cluster(epoch=20), threading.RLock(), threading.Lock()
        self.coord, self._suspects = None, set()
        self.pool = Peers()
        self.stopping, self._report_dirty, self._reconcile_event = (threading.Event() for _ in range(3))
        self.states = StateTable(data)
        self.states.set("default", 0, State.OWNING, reason="test")
        self.stale: set[tuple[str, int]] = set()
        self.rejoined = 0
        self._last_ok = 0.0                     # long ago: the next failure is past the timeout

    def join_cluster(self) -> None:             # the real one is exercised by the cluster tests
        self.rejoined += 1

    def data_must_not_be_touched(self) -> None:
        raise AssertionError("reconcile acted on a map that declares this node failed")

    data = property(lambda self: self.data_must_not_be_touched())


def test_cut_off_member_suspects_locally_then_rejoins_from_the_successors_newer_map(tmp_path) -> None:
    n3 = Member3(str(tmp_path))
    # the cut: n1 does not answer for longer than the failure timeout
    n3.pool.answers["addr-n1"] = Unavailable("connection refused")
    n3._heartbeat_once()
    assert n3._suspects == {"n1"}
    assert n3.map.members["n1"].alive and n3.map.epoch == 20   # the map is not changed locally
    assert n3.map.coordinator == "n1"
    # n1 declared n3 failed meanwhile (epoch 25); after the heal n2 answers with that map
    n3.pool.answers["addr-n2"] = {"member": True, "not_coordinator": True, "coordinator": "n1",
                                  "map": cluster(epoch=25, n3_alive=False).to_wire()}
    before = n3._last_ok
    n3._heartbeat_once()
    assert n3.pool.calls[-1] == ("addr-n2", "heartbeat")
    assert n3.map.epoch == 25 and not n3._suspects
    assert n3._last_ok == before               # a non-coordinator's answer is no heartbeat
    n3.reconcile()                              # declared failed: reconcile does nothing
    # the next heartbeat goes to the real coordinator, which does not count this boot
    n3.pool.answers["addr-n1"] = {"member": False, "map": None}
    n3._heartbeat_once()
    assert n3.pool.calls[-1] == ("addr-n1", "heartbeat")
    assert n3.rejoined == 1
    assert ("default", 0) in n3.stale          # writes went on without it: copy unconfirmed


def test_successor_without_a_newer_map_sends_the_member_back_to_the_coordinator(tmp_path) -> None:
    n3 = Member3(str(tmp_path))
    n3.pool.answers["addr-n1"] = Unavailable("timed out")
    n3._heartbeat_once()
    assert n3._suspects == {"n1"}
    n3.pool.answers["addr-n2"] = {"member": True, "not_coordinator": True, "coordinator": "n1", "map": None}
    n3._heartbeat_once()                        # within the timeout: still suspected
    assert n3._suspects == {"n1"} and n3.pool.calls[-1][0] == "addr-n2"
    n3._last_ok -= 1.0                          # a failure timeout of such answers
    n3._heartbeat_once()
    assert not n3._suspects                     # n2 still follows n1: try n1 again
    n3.pool.answers["addr-n1"] = {"member": True, "map": None}
    n3._heartbeat_once()
    assert n3.pool.calls[-1] == ("addr-n1", "heartbeat") and n3.rejoined == 0


@pytest.mark.parametrize("epoch,newer", [(19, True), (25, False)])
def test_non_coordinator_answers_with_its_map_only_when_newer(epoch: int, newer: bool) -> None:
    from node.node import Node
    fake = SimpleNamespace(coord=None, map_lock=threading.RLock(), map=cluster(epoch=20))
    r = Node.op_heartbeat(fake, node="n3", boot="boot-n3", epoch=epoch)   # type: ignore[arg-type]
    assert r["not_coordinator"] and r["coordinator"] == "n1"
    assert (r["map"] is not None) == newer
