"""The primary's side of a copy's admission to the in-sync set and of the replication
fan-out (node/updates.py, UpdatePath.op_join_isr and _fan_out), driven step by step.

A real UpdatePath over a real NodeContext (real storage in tmp_path, state table,
partition locks, map holder and cluster map). Two stand-ins, for what lies outside the
node: the controller (``alter_isr`` waits until the test lets it answer, then changes
the record the way the controller would: new in-sync set, epoch + 1, the map's waiters
notified) and the other nodes (``ctx.pool``: each answers ``replicate`` as the test
says, and every call is recorded with its thread and times). So the race a cluster hits
only by chance (a write while the controller's round trip is in flight) is hit every
time. No etcd, no sockets; no sleep longer than a few tens of ms.
"""
from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pytest

from node.cluster_map import ClusterMap, Member, PartRecord
from node.config import CacheConfig, NodeConfig
from node.context import Events, MapHolder, MoveTable, NodeContext, PartitionLocks, Replication
from node.control import Session
from node.errors import NodeError, StaleEpoch, Unavailable
from node.metrics import Metrics
from node.rpcapi import Requester
from node.states import State, StateTable
from node.storage import CacheData
from node.updates import UpdatePath

CACHE, P = "default", 0            # one partition: every key is p's
PRIMARY, BACKUP, COPY, OTHER = "n1", "n2", "n3", "n4"
ADDR = {n: f"127.0.0.{i}:7001" for i, n in enumerate((PRIMARY, BACKUP, COPY, OTHER), 1)}
NODE_AT = {a: n for n, a in ADDR.items()}
TERM, EPOCH = 2, 5
WAIT = 5.0                          # bound on every wait: a hang fails instead of blocking


# -- stand-ins for what is outside the node ------------------------------------------------
@dataclass
class Call:
    node: str
    method: str
    args: dict[str, Any]
    thread: int
    thread_name: str
    start: float
    end: float | None = None


Answer = Callable[[Call], object]


class Peers(Requester):
    """``ctx.pool``: the other nodes. ``answers[node]`` is what ``node`` answers (a
    value), raises (a NodeError) or does (a callable of the Call); default "applied"."""

    def __init__(self) -> None:
        self.answers: dict[str, object] = {}
        self.calls: list[Call] = []
        self._lock = threading.Lock()

    def call(self, address: str, method: str, /, timeout: float | None = None, **args: Any) -> Any:
        c = Call(NODE_AT[address], method, args, threading.get_ident(),
                 threading.current_thread().name, time.monotonic())
        with self._lock:
            self.calls.append(c)
        try:
            how = self.answers.get(c.node, "applied")
            if isinstance(how, BaseException):
                raise how
            return how(c) if callable(how) else how
        finally:
            c.end = time.monotonic()

    def replicated(self, counter: int) -> set[str]:
        """Nodes sent the replicate of ``counter``."""
        with self._lock:
            return {c.node for c in self.calls if c.method == "replicate" and c.args["counter"] == counter}


class Controller:
    """The control plane as the update path sees it (node.ports.IsrControl). An
    ``alter_isr`` that admits waits for ``gate``; ``refuse`` makes the next admission
    fail after the gate, as a controller's refusal or a timeout would."""

    def __init__(self, holder: MapHolder) -> None:
        self.holder = holder
        self.calls: list[tuple[list[str], list[str]]] = []      # (remove, add) per call
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()                         # an admission is waiting
        self.refuse: NodeError | None = None
        self._lock = threading.Lock()

    def alter_isr(self, cache: str, p: int, remove: list[str] = [],   # noqa: B006 (read only)
                  add: list[str] = []) -> PartRecord:                  # noqa: B006
        with self._lock:
            self.calls.append((sorted(remove), sorted(add)))
        if add:
            self.entered.set()
            if not self.gate.wait(WAIT):
                raise AssertionError("the test never released the admission")
            if self.refuse is not None:
                err, self.refuse = self.refuse, None
                raise err
        with self.holder.lock:
            rec = self.holder.map.parts[cache][p]
            isr = tuple([n for n in rec.isr if n not in remove] + [n for n in add if n not in rec.isr])
            new = PartRecord(rec.primary, isr, rec.epoch + 1, False, rec.term)
            self.holder.map.parts[cache][p] = new
        with self.holder.changed:
            self.holder.changed.notify_all()
        return new

    def request(self, cache: str, p: int, doc: dict[str, object],
                done: Callable[[PartRecord], bool], timeout: float = 0.0) -> PartRecord:
        raise AssertionError("the update path asks the controller only through alter_isr")

    def put_report(self) -> None:
        raise AssertionError("the update path sends no report")


class _LeaseGranter:
    """What a Session asks of etcd: a lease granted for an hour, and kept alive."""

    def grant(self, ttl: int) -> tuple[int, int]:
        return 1, 3600

    def keepalive(self, lease: int) -> int:
        return 3600


# -- the node under test -----------------------------------------------------------------
@dataclass
class Primary:
    ctx: NodeContext
    up: UpdatePath
    control: Controller
    peers: Peers
    data: CacheData
    bg: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(4, thread_name_prefix="test"))

    def record(self) -> PartRecord:
        return self.ctx.map.record(CACHE, P)

    def copies(self) -> dict[str, str]:
        return self.ctx.repl.copies.of((CACHE, P))

    def register(self, node: str, state: State) -> None:
        """``node`` DEMANDed p (a registered MOVING copy) and reports ``state``."""
        self.ctx.repl.copies.add((CACHE, P), node, ADDR[node])
        with self.ctx.map.lock:
            self.ctx.map.map.states[CACHE][P][node] = state.value

    def set_isr(self, *nodes: str) -> None:
        with self.ctx.map.lock:
            self.ctx.map.map.parts[CACHE][P] = PartRecord(PRIMARY, nodes, EPOCH, False, TERM)
            for n in nodes:
                self.ctx.map.map.states[CACHE][P][n] = State.OWNING.value

    def put(self, key: bytes, value: bytes = b"v") -> int:
        """A client's put, in a thread of its own: one that waits for an admission
        (p's lock held across the controller's round trip) fails here after WAIT."""
        return self.bg.submit(self.up.op_put, CACHE, key, value).result(timeout=WAIT)

    @contextlib.contextmanager
    def admitting(self, node: str = COPY) -> Iterator[Future[str]]:
        """``op_join_isr(node)`` running, its alter_isr(add) waiting for the controller.
        The admission is released when the block ends (or fails)."""
        self.control.gate.clear()
        self.control.entered.clear()
        fut = self.bg.submit(self.up.op_join_isr, CACHE, P, node)
        try:
            assert self.control.entered.wait(WAIT), "op_join_isr never asked the controller"
            assert self.ctx.repl.admissions.snapshot()[0] == {(CACHE, P): node}
            yield fut
        finally:
            self.control.gate.set()
            with contextlib.suppress(BaseException):
                fut.exception(timeout=WAIT)


@pytest.fixture
def primary(tmp_path) -> Iterator[Primary]:
    cache = CacheConfig(name=CACHE, partitions=1, backups=2)
    cfg = NodeConfig(id=PRIMARY, data=str(tmp_path), caches=(cache,), wal_sync="none")
    data = CacheData(cfg, cache)
    data.create(P)
    states = StateTable(cfg.data)
    states.set(CACHE, P, State.OWNING, reason="test: this node is p's primary")
    m = ClusterMap({CACHE: cache})
    for i, n in enumerate(ADDR, 1):
        m.members[n] = Member(n, ADDR[n], order=i)
    holder = MapHolder(m)
    session = Session(_LeaseGranter(), ttl=3, margin=0.5)  # type: ignore[arg-type]
    session.grant()
    peers = Peers()
    ctx = NodeContext(cfg=cfg, id=PRIMARY, boot="test", secret=b"s" * 32, metrics=Metrics(),
                      data={CACHE: data}, states=states, pool=peers,  # type: ignore[arg-type]
                      map=holder, plock=PartitionLocks(), events=Events(), repl=Replication(),
                      moves=MoveTable(), session=session)
    ctx.events.joined.set()
    control = Controller(holder)
    node = Primary(ctx, UpdatePath(ctx, control), control, peers, data)
    node.set_isr(PRIMARY, BACKUP)
    try:
        yield node
    finally:
        control.gate.set()
        node.bg.shutdown(wait=True)
        node.up.stop()
        data.close()


def assert_admission_over(node: Primary) -> None:
    assert node.ctx.repl.admissions.snapshot()[0] == {}
    assert node.ctx.repl.admissions.snapshot()[1] == set()


# -- the admission ---------------------------------------------------------------------------
def test_a_write_during_the_admission_goes_on_and_reaches_the_admitted_copy(primary):
    primary.register(COPY, State.OWNING)          # its move ended: it asks to count
    with primary.admitting() as join:
        c = primary.put(b"k1", b"during")         # ends while the admission waits
        assert not join.done()                    # the controller has not answered yet
        assert primary.ctx.repl.admissions.snapshot()[0] == {(CACHE, P): COPY}
        assert c == 1 and primary.data.get(P, b"k1") == b"during"
        assert primary.peers.replicated(c) == {BACKUP, COPY}
        sent = next(x for x in primary.peers.calls if x.node == COPY)
        assert sent.args | {"key": None} == {"cache": CACHE, "p": P, "key": None, "value": b"during",
                                             "counter": 1, "prev": 0, "primary": PRIMARY,
                                             "epoch": TERM}
    assert join.result(timeout=WAIT) == "ok"
    rec = primary.record()
    assert rec.isr == (PRIMARY, BACKUP, COPY) and rec.epoch == EPOCH + 1
    assert primary.control.calls == [([], [COPY])]
    assert COPY not in primary.copies()           # admitted: no longer a registered copy
    assert_admission_over(primary)
    # in sync now by the record: its failure is an in-sync failure (it is taken out)
    primary.peers.answers[COPY] = Unavailable("connection reset")
    assert primary.put(b"k2") == 2
    assert primary.control.calls[-1] == ([COPY], [])
    assert primary.record().isr == (PRIMARY, BACKUP)


@pytest.mark.parametrize("failure", [Unavailable("connection refused"), "resync"],
                         ids=["raises", "answers-resync"])
def test_a_write_the_admitted_copy_fails_is_not_acknowledged_and_spoils_the_admission(primary, failure):
    primary.register(COPY, State.OWNING)
    with primary.admitting() as join:
        primary.peers.answers[COPY] = failure
        with pytest.raises(Unavailable) as e:
            primary.put(b"k1")
        assert "NOT acknowledged" in str(e.value) and COPY in str(e.value)
        assert primary.data.counter(P) == 1       # durable here, just not acknowledged
        assert primary.ctx.repl.admissions.snapshot()[1] == {(CACHE, P)}
        assert primary.control.calls == [([], [COPY])]   # no second in-sync change meanwhile
        assert not join.done()
    assert join.result(timeout=WAIT) == "resync"
    # the controller admitted it; the primary took it out again at once
    assert primary.control.calls == [([], [COPY]), ([COPY], [])]
    rec = primary.record()
    assert rec.isr == (PRIMARY, BACKUP) and rec.epoch == EPOCH + 2
    assert COPY not in primary.copies()
    assert_admission_over(primary)
    # it counts for nothing now: a write it still fails is acknowledged
    assert primary.put(b"k2") == 2
    assert primary.control.calls[-1] == ([COPY], [])      # nothing more asked


def test_an_in_sync_copy_failing_during_the_admission_is_not_removed_meanwhile(primary):
    primary.register(COPY, State.OWNING)
    primary.peers.answers[BACKUP] = Unavailable("connection reset")
    with primary.admitting() as join:
        with pytest.raises(Unavailable) as e:
            primary.put(b"k1")
        assert "NOT acknowledged" in str(e.value) and BACKUP in str(e.value)
        assert primary.control.calls == [([], [COPY])]   # no alter_isr(remove) during it
        assert primary.ctx.repl.admissions.snapshot()[1] == set()         # the admitted copy has the write
        assert primary.peers.replicated(1) == {BACKUP, COPY}
    assert join.result(timeout=WAIT) == "ok"
    assert primary.record().isr == (PRIMARY, BACKUP, COPY)
    assert_admission_over(primary)
    # once the admission is over, the failing copy is removed as usual and writes go on
    assert primary.put(b"k2") == 2
    assert primary.control.calls == [([], [COPY]), ([BACKUP], [])]
    assert primary.record().isr == (PRIMARY, COPY)


@pytest.mark.parametrize("second", [COPY, OTHER])
def test_a_second_admission_of_the_partition_meanwhile_is_refused(primary, second):
    primary.register(COPY, State.OWNING)
    primary.register(OTHER, State.OWNING)
    with primary.admitting(COPY) as join:
        with pytest.raises(Unavailable, match="in progress"):
            primary.bg.submit(primary.up.op_join_isr, CACHE, P, second).result(timeout=WAIT)
        assert primary.ctx.repl.admissions.snapshot()[0] == {(CACHE, P): COPY}
    assert join.result(timeout=WAIT) == "ok"
    assert primary.control.calls == [([], [COPY])]
    assert primary.record().isr == (PRIMARY, BACKUP, COPY)
    assert primary.copies() == {OTHER: ADDR[OTHER]}       # the refused one is still registered
    assert_admission_over(primary)


def test_a_refused_admission_leaves_the_copy_registered(primary):
    primary.register(COPY, State.OWNING)
    primary.control.refuse = Unavailable("the controller refused alter_isr of default/0")
    with pytest.raises(Unavailable, match="controller refused"):
        primary.up.op_join_isr(CACHE, P, COPY)
    assert primary.control.calls == [([], [COPY])]
    assert primary.record().isr == (PRIMARY, BACKUP) and primary.record().epoch == EPOCH
    assert primary.copies() == {COPY: ADDR[COPY]}
    assert_admission_over(primary)
    # no longer counted in sync: a write it fails is acknowledged (it is dropped)
    primary.peers.answers[COPY] = Unavailable("connection reset")
    assert primary.put(b"k1") == 1
    assert primary.copies() == {}
    assert primary.control.calls == [([], [COPY])]


def test_a_refused_admission_that_a_write_spoiled_unregisters_the_copy(primary):
    primary.register(COPY, State.OWNING)
    with primary.admitting() as join:
        primary.peers.answers[COPY] = Unavailable("connection reset")
        with pytest.raises(Unavailable, match="NOT acknowledged"):
            primary.put(b"k1")
        primary.control.refuse = Unavailable("no answer from the controller")
    with pytest.raises(Unavailable, match="no answer from the controller"):
        join.result(timeout=WAIT)
    assert primary.control.calls == [([], [COPY])]        # not in the set: nothing to remove
    assert primary.record().isr == (PRIMARY, BACKUP)
    assert COPY not in primary.copies()
    assert_admission_over(primary)


def test_a_refused_admission_can_be_asked_again(primary):
    primary.register(COPY, State.OWNING)
    primary.control.refuse = Unavailable("the controller refused alter_isr of default/0")
    with pytest.raises(Unavailable):
        primary.up.op_join_isr(CACHE, P, COPY)
    assert primary.up.op_join_isr(CACHE, P, COPY) == "ok"
    assert primary.up.op_join_isr(CACHE, P, COPY) == "ok"      # already in: nothing asked
    assert primary.control.calls == [([], [COPY]), ([], [COPY])]
    assert primary.record().isr == (PRIMARY, BACKUP, COPY)


def test_an_unregistered_copy_is_told_to_resync_without_asking_the_controller(primary):
    with primary.ctx.map.lock:
        primary.ctx.map.map.states[CACHE][P][COPY] = State.OWNING.value
    assert primary.up.op_join_isr(CACHE, P, COPY) == "resync"
    assert primary.control.calls == []
    assert_admission_over(primary)


# -- the fan-out -------------------------------------------------------------------------------
def meeting(answers: dict[str, object], overlapped: dict[str, bool]) -> dict[str, Answer]:
    """Each node's answer (``answers[node]``), given only once every one of them is in
    flight at the same time (one barrier): sequential calls cannot all meet, and record
    that (``overlapped[node] = False``) instead of answering late."""
    barrier = threading.Barrier(len(answers), timeout=2.0)

    def when_all_are_in(answer: object) -> Answer:
        def answer_then(c: Call) -> object:
            try:
                barrier.wait()
                overlapped[c.node] = True
            except threading.BrokenBarrierError:
                overlapped[c.node] = False
            return answer
        return answer_then
    return {n: when_all_are_in(a) for n, a in answers.items()}


def test_two_copies_are_sent_to_at_once(primary):
    primary.register(COPY, State.MOVING)          # a move in progress: backup + new copy
    overlapped: dict[str, bool] = {}
    primary.peers.answers.update(meeting({BACKUP: "applied", COPY: "buffered"}, overlapped))
    caller = threading.get_ident()
    assert primary.up.op_put(CACHE, b"k1", b"v") == 1
    calls = {c.node: c for c in primary.peers.calls}
    assert set(calls) == {BACKUP, COPY} and {c.method for c in calls.values()} == {"replicate"}
    assert overlapped == {BACKUP: True, COPY: True}
    b, m = calls[BACKUP], calls[COPY]
    assert b.end is not None and m.end is not None
    assert max(b.start, m.start) < min(b.end, m.end)      # both in flight at once
    # one of them inline on the writer's thread, the other on the fan-out pool
    assert sorted(c.thread == caller for c in calls.values()) == [False, True]
    assert any(c.thread_name.startswith("ferry-replicate") for c in calls.values())
    assert COPY in primary.copies()               # "buffered" keeps the copy registered


def test_a_batch_to_two_copies_is_sent_to_at_once(primary):
    primary.register(COPY, State.MOVING)
    overlapped: dict[str, bool] = {}
    primary.peers.answers.update(meeting({BACKUP: "applied", COPY: "buffered"}, overlapped))
    assert primary.up.op_put_batch(CACHE, b"a", [[b"a", b"1"], [b"b", b"2"], [b"c", b"3"]]) == [1, 3]
    assert {c.node: c.method for c in primary.peers.calls} == {BACKUP: "replicate_batch",
                                                               COPY: "replicate_batch"}
    assert overlapped == {BACKUP: True, COPY: True}
    assert all(c.args["updates"] == [[b"a", b"1", 1], [b"b", b"2", 2], [b"c", b"3", 3]]
               for c in primary.peers.calls)


def test_one_copy_is_sent_to_on_the_writers_thread(primary):
    assert primary.up.op_put(CACHE, b"k1", b"v") == 1
    assert primary.up.op_put(CACHE, b"k2", b"v") == 2
    assert [(c.node, c.args["counter"], c.args["prev"]) for c in primary.peers.calls] == [
        (BACKUP, 1, 0), (BACKUP, 2, 1)]
    assert all(c.thread == threading.get_ident() for c in primary.peers.calls)


@pytest.mark.parametrize("stale", [BACKUP, COPY])
def test_stale_epoch_from_an_in_sync_copy_is_not_acknowledged_after_every_answer(primary, stale):
    primary.set_isr(PRIMARY, BACKUP, COPY)
    other = COPY if stale == BACKUP else BACKUP

    def slow_applied(c: Call) -> str:
        time.sleep(0.05)
        return "applied"
    primary.peers.answers[stale] = StaleEpoch(f"{stale} knows default/0 in primary epoch {TERM + 1}")
    primary.peers.answers[other] = slow_applied
    with pytest.raises(Unavailable) as e:
        primary.up.op_put(CACHE, b"k1", b"v")
    # every answer was in before the refusal
    assert all(c.end is not None for c in primary.peers.calls)
    assert {c.node for c in primary.peers.calls} == {BACKUP, COPY}
    assert "NOT acknowledged" in str(e.value) and stale in str(e.value)
    assert primary.control.calls == []            # possibly deposed: no in-sync change
    assert primary.record().isr == (PRIMARY, BACKUP, COPY)


def test_stale_epoch_from_a_registered_copy_only_drops_it(primary):
    primary.register(COPY, State.MOVING)
    primary.peers.answers[COPY] = StaleEpoch("n3 knows a newer primary epoch")
    assert primary.up.op_put(CACHE, b"k1", b"v") == 1
    assert primary.copies() == {}
    assert primary.control.calls == []
