"""Writes that cannot apply twice: request ids (node/dedup.py), the primary's and the
backups' tables (node/updates.py), and the client that sends them (node/client.py).

Before, ``Client`` retried a put that ended ``unavailable`` on a primary where it had
stayed applied, and the primary applied it again under a new counter: a history could
show a key going back to a value after a later write.
"""
from __future__ import annotations

import threading
from typing import Any, Iterator

import pytest

from node.client import Client
from node.cluster_map import ClusterMap, Member, PartRecord
from node.config import CacheConfig
from node.dedup import MAX_CLIENTS, MAX_PER_CLIENT, RequestId, RequestTable, Requests
from node.errors import REFUSED, UNKNOWN, BadRequest, NotPrimary, Superseded, Unavailable
from node.rpc import RpcServer
from node.states import State

from nodeharness import TEST_SECRET, free_port, write_secret
from test_isr_admission import BACKUP, CACHE, EPOCH, P, PRIMARY, TERM, Primary
from test_isr_admission import primary  # noqa: F401  (the fixture)
from test_linear_reads import etcd_down, get


def rid(seq: int, low: int | None = None, client: str = "c1") -> list[object]:
    return [client, seq, seq if low is None else low]


# -- the table ---------------------------------------------------------------------------------
def test_the_table_answers_applied_ids_and_refuses_late_copies() -> None:
    t = RequestTable()
    a = RequestId("c1", 5, 5)
    assert t.seen(a) is None
    t.record(a, 10, 10)
    assert t.seen(a) == (10, 10)
    t.record(RequestId("c1", 7, 6), 11, 11)          # the client is done with #5
    assert len(t) == 1
    with pytest.raises(Superseded):
        t.seen(RequestId("c1", 5, 5))                # a late copy of #5
    assert t.seen(RequestId("c2", 5, 5)) is None     # another client's #5


def test_the_table_is_bounded() -> None:
    t = RequestTable()
    for i in range(MAX_PER_CLIENT + 10):
        t.record(RequestId("c1", i, 0), i, i)        # low never moves: a misbehaving client
    assert len(t) == MAX_PER_CLIENT
    for i in range(MAX_CLIENTS + 5):
        t.record(RequestId(f"x{i}", 1, 1), 1, 1)
    assert len(t._clients) == MAX_CLIENTS and "c1" not in t._clients   # least recent first


def test_a_move_clears_what_the_table_held() -> None:
    r = Requests()
    r.record(CACHE, P, RequestId("c1", 1, 1), 1, 1)
    r.record(CACHE, P, RequestId("c1", 2, 1), 2, 2, moving=True)    # the copy re-pulls p
    t = r.table(CACHE, P)
    assert t.seen(RequestId("c1", 1, 1)) is None and t.seen(RequestId("c1", 2, 1)) == (2, 2)
    r.record(CACHE, P, RequestId("c1", 3, 1), 3, 3)                   # OWNING again: kept
    assert t.seen(RequestId("c1", 2, 1)) == (2, 2)


@pytest.mark.parametrize("raw", [["c", 1], ["", 1, 1], ["c", 1, 2], [1, 1, 1], "c:1", ["c" * 65, 1, 1]])
def test_malformed_request_ids_are_refused(raw: object) -> None:
    with pytest.raises(BadRequest):
        RequestId.parse(raw)


# -- the primary ------------------------------------------------------------------------------
def test_a_retry_of_an_applied_write_is_answered_not_applied(primary: Primary) -> None:
    assert primary.up.op_put(CACHE, b"k", b"v1", rid=rid(1)) == 1
    assert primary.up.op_put(CACHE, b"k", b"v2", rid=rid(2, 1)) == 2
    assert primary.up.op_put(CACHE, b"k", b"v1", rid=rid(1)) == 1     # the retry of #1
    assert primary.data.counter(P) == 2 and get(primary) == b"v2"
    sent = [c.args.get("rid") for c in primary.peers.calls if c.method == "replicate"]
    assert sent == [["c1", 1, 1], ["c1", 2, 1]]


def test_a_retry_of_a_write_that_failed_after_it_applied_is_not_applied_again(primary: Primary) -> None:
    assert primary.up.op_put(CACHE, b"k", b"v1", rid=rid(1)) == 1
    primary.peers.answers[BACKUP] = Unavailable("connection reset")
    etcd_down(primary)
    with pytest.raises(Unavailable) as e:
        primary.up.op_put(CACHE, b"k", b"v2", rid=rid(2))
    assert e.value.outcome == UNKNOWN
    # still failing: the retry confirms, fails again, says unknown again
    with pytest.raises(Unavailable) as e:
        primary.up.op_put(CACHE, b"k", b"v2", rid=rid(2))
    assert e.value.outcome == UNKNOWN
    del primary.peers.answers[BACKUP]                   # the backup answers again
    assert primary.up.op_put(CACHE, b"k", b"v2", rid=rid(2)) == 2
    assert primary.data.counter(P) == 2                 # applied once
    assert get(primary) == b"v2"


def test_a_retry_of_a_batch_answers_its_first_counters(primary: Primary) -> None:
    items = [[b"a", b"1"], [b"b", b"2"]]
    assert primary.up.op_put_batch(CACHE, b"a", items, rid=rid(1)) == [1, 2]
    assert primary.up.op_put_batch(CACHE, b"a", items, rid=rid(1)) == [1, 2]
    assert primary.data.counter(P) == 2
    assert [c.args.get("rid") for c in primary.peers.calls if c.method == "replicate_batch"
            and c.args["updates"]] == [["c1", 1, 1]]


def test_a_late_copy_of_a_request_the_client_gave_up_is_refused(primary: Primary) -> None:
    primary.up.op_put(CACHE, b"k", b"v3", rid=rid(3))   # the client's next write: #2 is over
    with pytest.raises(Superseded) as e:
        primary.up.op_put(CACHE, b"k", b"v2", rid=rid(2, 2)[:2] + [1])
    assert e.value.outcome == REFUSED and not e.value.retry
    assert primary.data.counter(P) == 1


def test_a_backup_that_becomes_primary_knows_what_it_applied(primary: Primary) -> None:
    """The node starts as the backup of p: the old primary's replicate carries the id;
    promoted, it answers the client's retry without applying the write again."""
    with primary.ctx.map.lock:
        primary.ctx.map.map.parts[CACHE][P] = PartRecord(BACKUP, (PRIMARY, BACKUP), EPOCH, False, TERM)
    assert primary.up.backup.op_replicate(CACHE, P, b"k", b"v1", 1, 0, primary=BACKUP, epoch=TERM,
                                   rid=rid(1)) == "applied"
    with pytest.raises(NotPrimary):
        primary.up.op_put(CACHE, b"k", b"v1", rid=rid(1))
    # the old primary failed; this node leads now (ISR: itself)
    with primary.ctx.map.lock:
        primary.ctx.map.map.parts[CACHE][P] = PartRecord(PRIMARY, (PRIMARY,), EPOCH + 1, False, TERM + 1)
    assert primary.up.op_put(CACHE, b"k", b"v1", rid=rid(1)) == 1
    assert primary.data.counter(P) == 1


def test_a_backup_that_resyncs_forgets_its_ids(primary: Primary) -> None:
    with primary.ctx.map.lock:
        primary.ctx.map.map.parts[CACHE][P] = PartRecord(BACKUP, (PRIMARY, BACKUP), EPOCH, False, TERM)

    class Movers:
        def request_resync(self, cache: str, p: int, why: str) -> None:
            pass
    primary.up.bind(Movers())                   # type: ignore[arg-type]
    primary.up.backup.op_replicate(CACHE, P, b"k", b"v1", 1, 0, primary=BACKUP, epoch=TERM, rid=rid(1))
    assert primary.up.requests.table(CACHE, P).seen(RequestId("c1", 1, 1)) == (1, 1)
    # a gap: this copy re-syncs, and its data will be the primary's, not what it applied
    assert primary.up.backup.op_replicate(CACHE, P, b"k", b"v9", 9, 8, primary=BACKUP, epoch=TERM) == "resync"
    assert primary.up.requests.table(CACHE, P).seen(RequestId("c1", 1, 1)) is None


def test_each_move_attempt_forgets_the_ids_of_the_copy_it_replaces(primary: Primary) -> None:
    """This node pulls p from the primary BACKUP. Its first attempt buffers an update
    carrying a client's id; that primary is deposed before it acknowledges it, and the
    next attempt copies the new primary's history, in which counter 4 is another write.
    Kept, the id would answer the client's retry "applied at 4" (two writes
    acknowledged at one counter, and the retried value never stored)."""
    from node.move.progress import Move
    from node.rebalance import Rebalancer
    reb = Rebalancer(primary.ctx, primary.control, primary.up)   # type: ignore[arg-type]
    primary.up.bind(reb)
    with primary.ctx.map.lock:
        primary.ctx.map.map.parts[CACHE][P] = PartRecord(BACKUP, (BACKUP,), EPOCH, False, TERM)
    mv = Move(CACHE, P, mode="files", source=BACKUP)
    primary.ctx.moves.running[(CACHE, P)] = mv
    table = primary.up.requests.table
    try:
        primary.up.requests.record(CACHE, P, RequestId("c1", 9, 9), 2, 2)     # the copy before
        reb.engine.prepare(mv)                                   # attempt 1: MOVING, a temp WAL
        assert primary.ctx.states.get(CACHE, P) == State.MOVING
        assert table(CACHE, P).seen(RequestId("c1", 9, 9)) is None
        assert primary.up.backup.op_replicate(CACHE, P, b"k", b"lost", 4, 3, primary=BACKUP,
                                              epoch=TERM, rid=rid(1)) == "buffered"
        assert table(CACHE, P).seen(RequestId("c1", 1, 1)) == (4, 4)
        reb.engine.prepare(mv)                                   # attempt 2, no update yet
        assert table(CACHE, P).seen(RequestId("c1", 1, 1)) is None
        # the ids the current attempt buffers are kept
        assert primary.up.backup.op_replicate(CACHE, P, b"k", b"kept", 5, 4, primary=BACKUP,
                                              epoch=TERM, rid=rid(2)) == "buffered"
        assert table(CACHE, P).seen(RequestId("c1", 2, 2)) == (5, 5)
    finally:
        primary.ctx.moves.running.pop((CACHE, P), None)
        if mv.sink is not None:
            mv.sink.destroy()
        reb.stop()


# -- the client --------------------------------------------------------------------------------
class FakeNode:
    """An RPC server answering get_map with one member (itself, primary of every
    partition) and ``put`` as ``answers`` says, in order; records every put's rid."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = list(answers)
        self.rids: list[Any] = []
        self.srv = RpcServer(f"127.0.0.1:{free_port()}", TEST_SECRET.encode(), self.dispatch)
        self.address = f"127.0.0.1:{self.srv.port}"
        m = ClusterMap({CACHE: CacheConfig(name=CACHE, partitions=1, backups=0)})
        m.members["n1"] = Member("n1", self.address, order=1)
        m.parts[CACHE][0] = PartRecord("n1", ("n1",), 1, False, 1)
        m.states[CACHE][0]["n1"] = State.OWNING.value
        self.map = m
        self.lock = threading.Lock()
        self.srv.start()

    def dispatch(self, method: str, args: dict, role: str) -> object:
        if method == "get_map":
            return self.map.to_wire()
        with self.lock:
            self.rids.append(args.get("rid"))
            a = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(a, BaseException):
            raise a
        return a


@pytest.fixture
def fake(request, tmp_path) -> Iterator[tuple[FakeNode, Client]]:
    node = FakeNode(request.param)
    secret = write_secret(str(tmp_path / "secret"))
    c = Client([node.address], secret_file=secret, timeout=2.0)
    try:
        yield node, c
    finally:
        c.close()
        node.srv.stop()


@pytest.mark.parametrize("fake", [[Unavailable("replication failed: NOT acknowledged").maybe_applied(),
                                   NotPrimary("moving"), 7]], indirect=True)
def test_the_client_retries_with_the_same_request_id(fake) -> None:
    node, c = fake
    assert c.put(CACHE, "k", "v") == 7
    assert len(node.rids) == 3 and len({tuple(r) for r in node.rids}) == 1
    cid, seq, low = node.rids[0]
    assert cid == c.id and seq == low == 1
    c.remove(CACHE, "k")
    assert node.rids[-1] == [c.id, 2, 2]                 # the next write: a new id, #1 done


@pytest.mark.parametrize("fake", [[Unavailable("replication failed").maybe_applied(),
                                   Unavailable("lease not valid")]], indirect=True)
def test_a_write_any_attempt_of_which_may_have_applied_ends_unknown(fake) -> None:
    node, c = fake
    with pytest.raises(Unavailable) as e:
        c.put(CACHE, "k", "v")
    assert e.value.outcome == UNKNOWN and len(node.rids) > 2     # retried until the timeout


@pytest.mark.parametrize("fake", [[Unavailable("lease not valid")]], indirect=True)
def test_a_write_no_attempt_of_which_applied_ends_refused(fake) -> None:
    node, c = fake
    with pytest.raises(Unavailable) as e:
        c.put(CACHE, "k", "v")
    assert e.value.outcome == REFUSED


@pytest.mark.parametrize("fake", [[BadRequest("no")]], indirect=True)
def test_a_request_refused_for_good_is_not_retried(fake) -> None:
    node, c = fake
    with pytest.raises(BadRequest):
        c.put(CACHE, "k", "v")
    assert len(node.rids) == 1
