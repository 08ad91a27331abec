"""A write that reaches a primary whose partition is fenced for a hand-off of the
primary role waits for the outcome instead of bouncing at once (node/updates.py,
UpdatePath._leading / _await_handoff), and the client follows a redirect that carries
the new primary's address at once, once per call (node/client.py, _call_primary).

Primary side: the real UpdatePath over the real NodeContext of test_isr_admission
(real storage, state table, partition locks, map holder; stand-ins only for the
controller and the peers), fenced and unfenced by the real Rebalancer.op_handoff /
op_unfence. The view change that ends a hand-off is done the way
node/membership.py's _on_view_change does it: under the map lock the fence is popped
and the map replaced, then ``map.changed`` is notified.

Client side: real RPC servers (node.rpc.RpcServer) in this process, each answering
``get_map`` with one cluster map and ``put`` as the test says; ``time`` in
node.client is replaced so each backoff sleep is recorded (and not slept).
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import pytest

import node.client as client_mod
import node.updates as updates
from node.client import Client
from node.cluster_map import ClusterMap, Member, PartRecord
from node.config import CacheConfig
from node.errors import NodeError, NotPrimary, RemoteFailure
from node.rebalance import FENCE_SECONDS, Rebalancer
from node.rpc import RpcServer

from nodeharness import free_port, write_secret
from test_isr_admission import ADDR, BACKUP, CACHE, P, PRIMARY, WAIT, Primary
from test_isr_admission import primary  # noqa: F401  (the fixture)

KEY = (CACHE, P)
DELAY = 0.1                 # when the other thread ends the hand-off
SLACK = 0.5                 # "well before HANDOFF_WAIT_S" (1 s), even on a busy 2-core box


# -- helpers ------------------------------------------------------------------------
@pytest.fixture
def reb(primary: Primary) -> Iterator[Rebalancer]:     # noqa: F811
    """The node's rebalancer (its hand-off side: op_handoff fences, op_unfence lifts)."""
    r = Rebalancer(primary.ctx, primary.control, primary.up)
    try:
        yield r
    finally:
        r.stop()


def timed(node: Primary, fn: Callable[[], Any]) -> Future[tuple[Any, float]]:
    """``fn`` in a thread of its own: (its result or the NodeError it raised, the
    monotonic time it ended)."""
    def run() -> tuple[Any, float]:
        try:
            r: Any = fn()
        except NodeError as e:
            r = e
        return r, time.monotonic()
    return node.bg.submit(run)


def put(node: Primary, key: bytes = b"k1", value: bytes = b"v") -> Future[tuple[Any, float]]:
    return timed(node, lambda: node.up.op_put(CACHE, key, value))


def after(delay: float, fn: Callable[[], None]) -> tuple[threading.Thread, list[float]]:
    """``fn`` on another thread after ``delay`` s; the list gets the time it ran."""
    when: list[float] = []

    def run() -> None:
        time.sleep(delay)
        when.append(time.monotonic())
        fn()
    t = threading.Thread(target=run, name="test-handoff-outcome", daemon=True)
    t.start()
    return t, when


def view_change_to(node: Primary, new_primary: str) -> None:
    """The map now names ``new_primary`` (a new term), as a watch batch brings it:
    node/membership.py _on_view_change pops the fence of a partition this node stops
    leading and replaces the map under the map lock, then notifies ``map.changed``."""
    with node.ctx.map.lock:
        m = node.ctx.map.map.clone()
        rec = m.parts[CACHE][P]
        m.parts[CACHE][P] = PartRecord(new_primary, (new_primary, PRIMARY), rec.epoch + 1, False,
                                       rec.term + 1)
        if m.parts[CACHE][P].primary != node.ctx.id and node.ctx.map.map.parts[CACHE][P].primary == node.ctx.id:
            node.ctx.repl.copies.drop(KEY)
            node.ctx.repl.fenced.lift(KEY)
        node.ctx.map.map = m
    with node.ctx.map.changed:
        node.ctx.map.changed.notify_all()


def nothing_written(node: Primary) -> None:
    assert node.data.counter(P) == 0
    assert node.data.get(P, b"k1") is None
    assert node.peers.calls == []


# -- the primary's side -----------------------------------------------------------------
def test_fence_is_what_op_handoff_sets(primary, reb):                 # noqa: F811
    """The fixture's fence is the real one: op_handoff under p's lock, FENCE_SECONDS."""
    t0 = time.monotonic()
    assert reb.op_handoff(CACHE, P, BACKUP) == 0
    assert t0 + FENCE_SECONDS <= (primary.ctx.repl.fenced.until(KEY) or 0.0) <= time.monotonic() + FENCE_SECONDS
    assert not primary.up.leads(CACHE, P)
    assert reb.op_unfence(CACHE, P) is True
    assert KEY not in primary.ctx.repl.fenced and primary.up.leads(CACHE, P)


def test_a_write_during_a_handoff_is_redirected_to_the_new_primary_once_the_map_names_it(primary, reb):  # noqa: F811
    reb.op_handoff(CACHE, P, BACKUP)
    t0 = time.monotonic()
    fut = put(primary)
    changer, changed_at = after(DELAY, lambda: view_change_to(primary, BACKUP))
    err, ended = fut.result(timeout=WAIT)
    changer.join(WAIT)
    assert isinstance(err, NotPrimary), err
    assert err.hint == ADDR[BACKUP]                       # the new primary's address
    assert err.code == "not_primary" and err.retry
    assert ended >= changed_at[0] >= t0 + DELAY           # it waited for the outcome...
    assert ended - t0 < SLACK                             # ...and went at once, well before 1 s
    assert KEY not in primary.ctx.repl.fenced
    nothing_written(primary)


def test_a_write_during_a_handoff_is_served_here_once_the_fence_is_lifted(primary, reb):  # noqa: F811
    reb.op_handoff(CACHE, P, BACKUP)
    t0 = time.monotonic()
    fut = put(primary, b"k1", b"after-unfence")
    changer, lifted_at = after(DELAY, lambda: reb.op_unfence(CACHE, P))   # the hand-off failed
    r, ended = fut.result(timeout=WAIT)
    changer.join(WAIT)
    assert r == 1, r
    assert ended >= lifted_at[0] >= t0 + DELAY
    assert ended - t0 < SLACK
    assert primary.data.get(P, b"k1") == b"after-unfence" and primary.data.counter(P) == 1
    assert primary.peers.replicated(1) == {BACKUP}       # replicated as any write
    assert primary.record().primary == PRIMARY


def test_a_notification_that_does_not_end_the_handoff_keeps_the_write_waiting(primary, reb):  # noqa: F811
    """``map.changed`` is notified on every map change (any partition's in-sync set,
    a member...): the write looks again and waits on while p is still fenced here."""
    reb.op_handoff(CACHE, P, BACKUP)
    t0 = time.monotonic()
    fut = put(primary)

    def unrelated_change() -> None:
        with primary.ctx.map.changed:
            primary.ctx.map.changed.notify_all()
    n1, _ = after(0.03, unrelated_change)
    n2, lifted_at = after(DELAY + 0.05, lambda: reb.op_unfence(CACHE, P))
    r, ended = fut.result(timeout=WAIT)
    n1.join(WAIT)
    n2.join(WAIT)
    assert r == 1 and ended >= lifted_at[0] >= t0 + DELAY
    assert primary.data.counter(P) == 1


def test_a_fence_that_stays_refuses_after_handoff_wait_s_without_holding_the_partition_lock(
        primary, reb, monkeypatch):                                      # noqa: F811
    monkeypatch.setattr(updates, "HANDOFF_WAIT_S", 0.2, raising=False)
    reb.op_handoff(CACHE, P, BACKUP)                     # fenced for FENCE_SECONDS (10 s)
    t0 = time.monotonic()
    fut = put(primary)
    time.sleep(0.05)
    assert not fut.done()                                # waiting for the outcome
    lock = primary.ctx.plock(CACHE, P)
    took: list[bool] = []

    def take_lock() -> None:                              # e.g. the hand-off's own work
        ok = lock.acquire(timeout=0.1)
        took.append(ok)
        if ok:
            lock.release()
    t = threading.Thread(target=take_lock)
    t.start()
    t.join(WAIT)
    assert took == [True], "p's lock is held while the write waits"
    assert not fut.done()                                # still waiting after that
    err, ended = fut.result(timeout=WAIT)
    assert isinstance(err, NotPrimary), err
    assert err.hint is None                               # the map still names this node
    assert PRIMARY in str(err) and "not the primary" in str(err)
    assert 0.2 <= ended - t0 < 0.2 + SLACK
    assert KEY in primary.ctx.repl.fenced                 # the fence is the hand-off's business
    nothing_written(primary)


def test_a_fence_that_expires_first_ends_the_wait_then(primary, monkeypatch):  # noqa: F811
    """A fence deadline earlier than HANDOFF_WAIT_S: the write is served once it passes."""
    monkeypatch.setattr(updates, "HANDOFF_WAIT_S", 1.0, raising=False)   # the default
    fenced_at = time.monotonic()
    primary.ctx.repl.fenced.set(KEY, fenced_at + DELAY)
    fut = put(primary, b"k1", b"after-expiry")
    r, ended = fut.result(timeout=WAIT)
    assert r == 1, r
    assert DELAY <= ended - fenced_at < SLACK
    assert primary.data.get(P, b"k1") == b"after-expiry"


def test_a_batch_during_a_handoff_waits_too(primary, reb):             # noqa: F811
    reb.op_handoff(CACHE, P, BACKUP)
    t0 = time.monotonic()
    fut = timed(primary, lambda: primary.up.op_put_batch(CACHE, b"a", [[b"a", b"1"], [b"b", b"2"]]))
    changer, lifted_at = after(DELAY, lambda: reb.op_unfence(CACHE, P))
    r, ended = fut.result(timeout=WAIT)
    changer.join(WAIT)
    assert r == [1, 2], r
    assert ended >= lifted_at[0] >= t0 + DELAY


def test_a_write_to_a_node_that_is_not_the_primary_is_redirected_without_waiting(primary):  # noqa: F811
    view_change_to(primary, BACKUP)                       # no fence: nothing to wait for
    t0 = time.monotonic()
    err, ended = put(primary).result(timeout=WAIT)
    assert isinstance(err, NotPrimary) and err.hint == ADDR[BACKUP]
    assert ended - t0 < 0.05
    nothing_written(primary)


def test_an_unfenced_write_is_served_at_once(primary):                 # noqa: F811
    primary.ctx.repl.fenced.set(KEY, time.monotonic() - 1.0)   # an expired fence left behind
    t0 = time.monotonic()
    r, ended = put(primary).result(timeout=WAIT)
    assert r == 1 and ended - t0 < 0.05


# -- the client's side ------------------------------------------------------------------
class Server:
    """A real RPC server; ``answers`` is a list of what each ``put`` does in turn (a
    value to return or a NodeError to raise; the last one repeats)."""

    def __init__(self, secret: bytes, cmap: Callable[[], dict[str, object]]) -> None:
        self.cmap = cmap
        self.answers: list[object] = [1]
        self.puts: list[dict[str, Any]] = []
        self.maps = 0
        self.address = f"127.0.0.1:{free_port()}"
        self.rpc = RpcServer(self.address, secret, self.dispatch)
        self.rpc.start()

    def dispatch(self, method: str, args: dict[str, Any], role: str) -> Any:
        if method == "get_map":
            self.maps += 1
            return self.cmap()
        if method != "put":
            raise NodeError(f"unexpected {method}")
        self.puts.append(args)
        how = self.answers[min(len(self.puts), len(self.answers)) - 1]
        if isinstance(how, BaseException):
            raise how
        return how


@pytest.fixture
def cluster(tmp_path, monkeypatch) -> Iterator[SimpleNamespace]:
    """Three servers a, b, c (members n1, n2, n3); every map they give names n1 (a) the
    primary of p. ``sleeps`` records the client's backoff sleeps."""
    secret_file = write_secret(str(tmp_path / "secret"))
    secret = open(secret_file, "rb").read().strip()
    cache = CacheConfig(name=CACHE, partitions=1, backups=2)
    servers: dict[str, Server] = {}

    def cmap() -> dict[str, object]:
        m = ClusterMap({CACHE: cache})
        m.epoch = 7
        for i, n in enumerate(("n1", "n2", "n3"), 1):
            m.members[n] = Member(n, servers[n].address, order=i)
        m.parts[CACHE][P] = PartRecord("n1", ("n1", "n2", "n3"), 3, False, 1)
        return m.to_wire()
    for n in ("n1", "n2", "n3"):
        servers[n] = Server(secret, cmap)
    sleeps: list[float] = []
    monkeypatch.setattr(client_mod, "time", SimpleNamespace(monotonic=time.monotonic,
                                                            sleep=sleeps.append))
    c = Client([servers["n1"].address], secret_file, timeout=5.0)
    try:
        yield SimpleNamespace(client=c, a=servers["n1"], b=servers["n2"], c=servers["n3"], sleeps=sleeps)
    finally:
        c.close()
        for s in servers.values():
            s.rpc.stop()


def test_the_client_follows_a_redirect_with_an_address_at_once(cluster):
    a, b = cluster.a, cluster.b
    a.answers = [NotPrimary("n1 handed default/0 over to n2", hint=b.address)]
    b.answers = [42]
    assert cluster.client.put(CACHE, b"k1", b"v") == 42
    assert [x["key"] for x in a.puts] == [b"k1"] and [x["value"] for x in b.puts] == [b"v"]
    assert cluster.sleeps == []                           # no backoff before the redirect
    assert a.maps == 2                                    # the first fetch + the refresh at the redirect
    assert cluster.c.puts == []


def test_a_second_redirect_in_the_same_call_backs_off(cluster):
    a, b, c = cluster.a, cluster.b, cluster.c
    a.answers = [NotPrimary("n1 handed default/0 over to n2", hint=b.address)]
    b.answers = [NotPrimary("n2 handed default/0 over to n3", hint=c.address)]
    c.answers = [43]
    assert cluster.client.put(CACHE, b"k1", b"v") == 43
    assert (len(a.puts), len(b.puts), len(c.puts)) == (1, 1, 1)   # each hint followed
    assert len(cluster.sleeps) == 1                       # only before the second redirect
    assert 0.025 <= cluster.sleeps[0] <= 0.075            # the first backoff step
    # a new call gets its own immediate redirect (the maps still name n1)
    c.answers = [44]
    assert cluster.client.put(CACHE, b"k2", b"v") == 44
    assert (len(a.puts), len(b.puts), len(c.puts)) == (2, 2, 2)
    assert len(cluster.sleeps) == 2


def test_a_retryable_error_without_an_address_backs_off_as_before(cluster):
    a = cluster.a
    a.answers = [NotPrimary("n1 is handing default/0 over"), NotPrimary("still"), 45]
    assert cluster.client.put(CACHE, b"k1", b"v") == 45
    assert len(a.puts) == 3
    assert len(cluster.sleeps) == 2
    assert 0.025 <= cluster.sleeps[0] <= 0.075 and 0.05 <= cluster.sleeps[1] <= 0.15


def test_the_redirect_reaches_the_client_with_its_address(cluster):
    """Over the wire, NotPrimary's hint survives (RemoteFailure, code not_primary)."""
    cluster.a.answers = [NotPrimary("x", hint="127.0.0.9:1")]
    with pytest.raises(RemoteFailure) as e:
        cluster.client.pool.call(cluster.a.address, "put", cache=CACHE, key=b"k", value=b"v")
    assert e.value.code == "not_primary" and e.value.retry and e.value.hint == "127.0.0.9:1"



def test_a_write_queued_on_the_lock_when_the_fence_is_set_waits_too(primary, reb):  # noqa: F811
    """op_handoff queues on p's lock like the writes: a write that passed the first
    check and waits for the lock when the fence lands waits for the outcome as well
    (here the fence is lifted 0.1 s later and the write is served, not bounced)."""
    lock = primary.ctx.plock(CACHE, P)
    lock.acquire()
    try:
        fut = put(primary)
        time.sleep(0.05)                  # the put passed the first check, queued on the lock
        assert not fut.done()
        assert reb.op_handoff(CACHE, P, BACKUP) == 0   # (the lock is re-entrant: fenced now)
    finally:
        lock.release()
    _, when = after(DELAY, lambda: reb.op_unfence(CACHE, P))
    r, ended = fut.result(WAIT)
    assert not isinstance(r, NodeError), r
    assert r == 1 and primary.data.get(P, b"k1") == b"v"
    assert when and ended >= when[0]      # served after the fence was lifted, not before
