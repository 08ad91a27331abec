"""Requests to the controller through etcd (``P/requests/<cache>/<p>/<node>``) are
applied only as the controller read them, and a primary withdraws one it gave up on,
against a real etcd:

- the controller's write that applies a request also compares the request's mod
  revision (node/controller.py, ``alter_isr`` / ``set_primary`` with ``req_mod``): a
  request deleted or put again after the controller read it is not applied;
- ``ControlPlane.request`` (node/membership.py) deletes its request when its wait runs
  out, only if it is still the one it put: withdrawn, it is never applied; decided by
  the controller just before, the record in etcd says how (applied: the record is
  returned, once this node's map shows it); the withdrawal failing (etcd unreachable):
  ``OutcomeUnknown``.

A ControlPlane for node "a" with its session, view and map, but none of its threads
(no reporter, no controller campaign): the controller is the test's, run when the test
says, with the World of test_controller.py.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterator

import pytest
from prometheus_client import generate_latest

from node.cluster_map import ClusterMap, PartRecord
from node.config import NodeConfig
from node.context import Events, MapHolder, MoveTable, NodeContext, PartitionLocks, Replication
from node.control import Etcd, Session, View
from node.errors import ControlPlaneDown, OutcomeUnknown, Unavailable
from node.membership import ControlPlane
from node.metrics import Metrics
from node.states import StateTable

from test_controller import CACHE, PREFIX, World

P = 0
REQ_A = f"{PREFIX}/requests/default/{P}/a"
REQ_B = f"{PREFIX}/requests/default/{P}/b"
SHORT = 0.3                 # the primary's wait for an answer, in these tests


def admit(who: str = "b", term: int = 1) -> dict[str, object]:
    """The request ControlPlane.alter_isr(add=[who]) leaves."""
    return {"op": "alter_isr", "term": term, "remove": [], "add": [who]}


def admitted(who: str = "b") -> Callable[[PartRecord], bool]:
    """ControlPlane.alter_isr's test of the answer (epoch 1 was the record's)."""
    return lambda r: r.epoch > 1 and who in r.isr and r.primary == "a"


@pytest.fixture
def world(etcd: Etcd) -> World:            # noqa: F811
    """a created the cluster and leads every partition alone (epoch 1, term 1); b is a
    live member reporting p OWNING (ready to be admitted)."""
    w = World(etcd)
    w.member("a", owning=[0, 1, 2, 3])
    w.member("b", owning=[P])
    assert w.decide() == 4
    assert w.rec(P) == PartRecord("a", ("a",), 1, False, 1)
    return w


class Racing:
    """etcd as the ControlPlane sees it, with ``before_withdraw`` run just before the
    first delete-only transaction (the withdrawal), or ``down`` raised instead of it."""

    def __init__(self, etcd: Etcd) -> None:    # noqa: F811
        self.etcd = etcd
        self.before_withdraw: Callable[[], None] | None = None
        self.down = False
        self.withdrawals = 0
        self.put_txns: list[list[str]] = []     # the keys of each transaction that put

    def __getattr__(self, name: str) -> Any:
        return getattr(self.etcd, name)

    def txn(self, compare: list[Any], puts: list[Any],
            deletes: list[str] = ()) -> tuple[bool, int]:  # type: ignore[assignment]
        if puts:
            self.put_txns.append([p[0] for p in puts])
        if deletes and not puts:
            self.withdrawals += 1
            if self.down:
                raise ControlPlaneDown("control plane (etcd) unreachable: test")
            hook, self.before_withdraw = self.before_withdraw, None
            if hook is not None:
                hook()
        return self.etcd.txn(compare, puts, deletes)


@pytest.fixture
def node_a(etcd: Etcd, world: World, tmp_path) -> Iterator[ControlPlane]:    # noqa: F811
    cfg = NodeConfig(id="a", data=str(tmp_path / "a"), caches=(CACHE,), wal_sync="none",
                     control_plane=tuple(etcd.endpoints), control_prefix=PREFIX)
    (tmp_path / "a").mkdir()
    ctx = NodeContext(cfg=cfg, id="a", boot="b", secret=b"s" * 32, metrics=Metrics(), data={},
                      states=StateTable(cfg.data), pool=None,  # type: ignore[arg-type]
                      map=MapHolder(ClusterMap({CACHE.name: CACHE})), plock=PartitionLocks(),
                      events=Events(), repl=Replication(), moves=MoveTable())
    cp = ControlPlane(ctx, lambda old, new: None)
    cp.etcd = Racing(etcd)  # type: ignore[assignment]
    cp.session = Session(etcd, cfg.lease_ttl_s, cfg.lease_margin_s)
    cp.session.grant()
    cp.session.start()
    ctx.session = cp.session
    cp.view = View(etcd, PREFIX, cp._on_view_change)
    cp.view.load()
    cp.view.start()
    assert ctx.map.record("default", P) == PartRecord("a", ("a",), 1, False, 1)
    try:
        yield cp
    finally:
        cp.view.stop()
        cp.session.stop(revoke=True)


def racing(cp: ControlPlane) -> Racing:
    assert isinstance(cp.etcd, Racing)
    return cp.etcd


# -- the controller applies a request only as it read it -----------------------------------
def test_a_request_still_there_as_read_is_applied_and_deleted(world, etcd):   # noqa: F811
    etcd.put(REQ_A, admit())
    world.view.load()
    assert world.ctl.handle_requests() == 1
    assert world.rec(P) == PartRecord("a", ("a", "b"), 2, False, 1)
    assert etcd.get(REQ_A) is None


@pytest.mark.parametrize("how", ["withdrawn", "put-again"])
def test_an_alter_isr_request_gone_after_the_controller_read_it_is_not_applied(world, etcd, how):  # noqa: F811
    etcd.put(REQ_A, admit())
    world.view.load()                          # the controller read it ...
    if how == "withdrawn":
        etcd.delete(REQ_A)                     # ... and its primary withdrew it
    else:
        etcd.put(REQ_A, admit())               # ... and its primary asked again since
    world.ctl.handle_requests()
    assert world.rec(P) == PartRecord("a", ("a",), 1, False, 1)
    if how == "withdrawn":
        assert etcd.get(REQ_A) is None
    else:
        # the new one is left for the next round, which applies it as read then
        assert etcd.get(REQ_A) is not None
        world.view.load()
        assert world.ctl.handle_requests() == 1
        assert world.rec(P) == PartRecord("a", ("a", "b"), 2, False, 1)
        assert etcd.get(REQ_A) is None


def test_a_set_primary_request_withdrawn_after_the_controller_read_it_is_not_applied(world, etcd):  # noqa: F811
    world.ctl.alter_isr("default", P, "a", 1, [], ["b"])       # b in sync: it may take over
    etcd.put(REQ_B, {"op": "set_primary", "previous": "a"})
    world.view.load()
    etcd.delete(REQ_B)                         # b gave up (and lifted a's fence)
    world.ctl.handle_requests()
    assert world.rec(P) == PartRecord("a", ("a", "b"), 2, False, 1)
    assert etcd.get(REQ_B) is None
    # as read, it is applied
    rev = etcd.put(REQ_B, {"op": "set_primary", "previous": "a"})
    world.view.load()
    assert world.view.get(REQ_B).mod == rev
    world.ctl.handle_requests()
    assert world.rec(P) == PartRecord("b", ("a", "b"), 3, False, 2)
    assert etcd.get(REQ_B) is None


# -- the primary withdraws a request it gave up on ---------------------------------------------
def test_an_unanswered_request_is_withdrawn_and_never_applied_afterwards(node_a, world, etcd):  # noqa: F811
    # the controller reads the request just before the withdrawal lands (its view then
    # still shows it), and runs after it
    racing(node_a).before_withdraw = world.view.load
    t0 = time.monotonic()
    with pytest.raises(Unavailable, match="withdrawn") as e:
        node_a.request("default", P, admit(), admitted(), timeout=SHORT)
    assert SHORT <= time.monotonic() - t0 < SHORT + 2.0
    assert not isinstance(e.value, OutcomeUnknown)
    assert racing(node_a).withdrawals == 1
    assert etcd.get(REQ_A) is None
    assert world.view.get(REQ_A) is not None       # the controller's stale view
    world.ctl.handle_requests()
    assert world.rec(P) == PartRecord("a", ("a",), 1, False, 1)
    world.view.load()                              # a controller that starts afterwards
    assert world.ctl.handle_requests() == 0
    assert world.decide() == 0
    assert world.rec(P) == PartRecord("a", ("a",), 1, False, 1)


def test_a_request_applied_as_the_wait_ran_out_returns_the_applied_record(node_a, world, etcd):  # noqa: F811
    def controller_round() -> None:
        world.view.load()
        assert world.ctl.handle_requests() == 1
    racing(node_a).before_withdraw = controller_round
    rec = node_a.request("default", P, admit(), admitted(), timeout=SHORT)
    assert rec == PartRecord("a", ("a", "b"), 2, False, 1) == world.rec(P)
    assert node_a.ctx.map.record("default", P) == rec          # in this node's map on return
    assert etcd.get(REQ_A) is None


def test_a_request_refused_as_the_wait_ran_out_is_refused(node_a, world, etcd):   # noqa: F811
    def controller_round() -> None:
        world.view.load()
        world.ctl.handle_requests()              # zz is not a member: refused and deleted
    racing(node_a).before_withdraw = controller_round
    with pytest.raises(Unavailable, match="refused") as e:
        node_a.request("default", P, admit("zz"), admitted("zz"), timeout=SHORT)
    assert not isinstance(e.value, OutcomeUnknown)
    assert etcd.get(REQ_A) is None
    assert world.rec(P) == PartRecord("a", ("a",), 1, False, 1)


def test_a_withdrawal_that_cannot_reach_etcd_leaves_the_outcome_unknown(node_a, world, etcd):   # noqa: F811
    racing(node_a).down = True
    with pytest.raises(OutcomeUnknown) as e:
        node_a.request("default", P, admit(), admitted(), timeout=SHORT)
    assert isinstance(e.value, Unavailable) and e.value.code == "outcome_unknown" and e.value.retry
    kv = etcd.get(REQ_A)
    assert kv is not None                       # still there: the controller may apply it
    assert (e.value.key, e.value.rev) == (REQ_A, kv.mod)
    world.view.load()
    assert world.ctl.handle_requests() == 1
    assert world.rec(P).isr == ("a", "b")


# -- patience: a busy controller is waited for, a missing one is not ----------------------------
def test_a_patient_request_waits_for_a_busy_controller(node_a, world, etcd):   # noqa: F811
    """The controller answers only after 3 waits' worth of time, while the control
    plane keeps moving (other keys change): the request is not withdrawn but applied."""
    import threading
    stop = threading.Event()

    def busy() -> None:           # other nodes' traffic: the map moves on meanwhile
        i = 0
        while not stop.wait(SHORT / 4):
            i += 1
            etcd.put(f"{PREFIX}/reports/b/default/1", ["OWNING", i])

    def controller() -> None:
        time.sleep(3 * SHORT)
        world.view.load()
        world.ctl.handle_requests()

    threads = [threading.Thread(target=busy), threading.Thread(target=controller)]
    for t in threads:
        t.start()
    try:
        t0 = time.monotonic()
        rec = node_a.request("default", P, admit(), admitted(), timeout=SHORT, patience=10 * SHORT)
        assert 3 * SHORT <= time.monotonic() - t0 < 10 * SHORT
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert rec == PartRecord("a", ("a", "b"), 2, False, 1) == world.rec(P)
    assert racing(node_a).withdrawals == 0 and etcd.get(REQ_A) is None


def test_a_patient_request_is_withdrawn_when_nothing_moves(node_a, world, etcd):   # noqa: F811
    """No controller round and no other change: the first wait's end withdraws it, as
    without patience (a missing controller is not waited for)."""
    t0 = time.monotonic()
    with pytest.raises(Unavailable, match="withdrawn"):
        node_a.request("default", P, admit(), admitted(), timeout=SHORT, patience=20 * SHORT)
    assert SHORT <= time.monotonic() - t0 < 2 * SHORT
    assert racing(node_a).withdrawals == 1 and etcd.get(REQ_A) is None


# -- requests made together share a transaction ---------------------------------------------
def test_requests_made_together_share_one_transaction_and_each_gets_its_answer(node_a, world, etcd):  # noqa: F811
    node_a.requests.linger = 0.5          # both in the first transaction, whatever the scheduling
    stop = threading.Event()

    def controller() -> None:
        while not stop.is_set():
            world.view.load()
            world.ctl.handle_requests()
            time.sleep(0.05)
    ctl = threading.Thread(target=controller, daemon=True)
    ctl.start()
    got: dict[int, object] = {}

    def ask(p: int) -> None:
        try:
            got[p] = node_a.request("default", p, admit(), lambda r: "b" in r.isr, timeout=5.0)
        except Exception as e:                  # noqa: BLE001 (the test looks at it)
            got[p] = e
    asks = [threading.Thread(target=ask, args=(p,)) for p in (0, 1)]
    try:
        for t in asks:
            t.start()
        for t in asks:
            t.join(15)
    finally:
        stop.set()
        ctl.join(5)
    for p in (0, 1):
        rec = got[p]
        assert isinstance(rec, PartRecord) and rec.isr == ("a", "b") and world.rec(p) == rec, got
    txns = racing(node_a).put_txns
    assert len(txns) == 1 and sorted(txns[0]) == [f"{PREFIX}/requests/default/{p}/a" for p in (0, 1)]
    exposed = generate_latest(node_a.ctx.metrics.registry).decode()
    assert "ferry_node_controller_requests_total 2.0" in exposed
    assert "ferry_node_controller_request_txns_total 1.0" in exposed
