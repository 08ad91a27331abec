"""Linearizable reads on the primary's side (node/updates.py: op_get, node/visible.py),
driven step by step on the real UpdatePath and NodeContext of test_isr_admission
(real storage, state table, partition locks, map holder; stand-ins for the controller
and the peers).

- a primary serves a read only while its lease is valid, checked again after the
  value was read; a lapsed lease answers ``unavailable`` with "retry on another node"
  (before: reads went on without the lease, and a primary cut from etcd kept serving
  its old values after a new primary acknowledged newer ones);
- a key with an update in flight reads as its acknowledged value, and an update that
  failed to replicate stays invisible until a later acknowledgement covers it
  (before: the read saw it, and a value that may never exist);
- a replicate in a newer term (a new primary) stops the reads of the old one before
  its map changes; a fence (hand-off) is waited out as for a write;
- a new primary confirms its copy with the in-sync copies before its first read;
- ``consistency="stale"`` reads any OWNING copy, lease or not.
"""
from __future__ import annotations

import threading
import time

import pytest

from node.cluster_map import PartRecord
from node.errors import UNKNOWN, ControlPlaneDown, NotPrimary, StaleEpoch, Unavailable
from node.states import State

from test_isr_admission import BACKUP, CACHE, COPY, EPOCH, P, PRIMARY, TERM, WAIT, Call, Primary
from test_isr_admission import primary  # noqa: F401  (the fixture)


def get(node: Primary, key: bytes = b"k", **kw: object) -> bytes | None:
    return node.up.op_get(CACHE, key, **kw)


def lapse(node: Primary) -> None:
    node.ctx.session._valid_until = 0.0        # type: ignore[union-attr]


def etcd_down(node: Primary) -> None:
    """The controller cannot be reached: no in-sync set can shrink."""
    def alter_isr(cache: str, p: int, remove: list[str] = [], add: list[str] = []) -> PartRecord:  # noqa: B006
        raise ControlPlaneDown("etcd unreachable at every endpoint")
    node.control.alter_isr = alter_isr        # type: ignore[method-assign]


# -- the lease ---------------------------------------------------------------------------------
def test_a_primary_whose_lease_lapsed_refuses_reads(primary: Primary) -> None:
    assert primary.up.op_put(CACHE, b"k", b"v1") == 1
    assert get(primary) == b"v1"
    lapse(primary)
    with pytest.raises(Unavailable) as e:
        get(primary)
    assert "lease is not valid" in str(e.value) and "another node" in str(e.value)
    assert e.value.retry
    assert get(primary, consistency="stale") == b"v1"     # asked for: any OWNING copy


def test_a_lease_that_lapses_while_the_value_is_read_fails_the_read(primary: Primary) -> None:
    """The check that counts comes AFTER the value was read: a pause between a check
    before and the reply would otherwise serve a value a successor may have replaced."""
    primary.up.op_put(CACHE, b"k", b"v1")
    get(primary)                                # confirmed in this term
    real = primary.data.get

    def get_then_lapse(p: int, key: bytes) -> bytes | None:
        out = real(p, key)
        lapse(primary)                          # the process paused right here
        return out
    primary.data.get = get_then_lapse           # type: ignore[method-assign]
    with pytest.raises(Unavailable):
        get(primary)


def test_reads_of_a_partition_this_node_does_not_lead_are_redirected(primary: Primary) -> None:
    with primary.ctx.map.lock:
        primary.ctx.map.map.parts[CACHE][P] = PartRecord(BACKUP, (PRIMARY, BACKUP), EPOCH + 1, False, TERM + 1)
    with pytest.raises(NotPrimary) as e:
        get(primary)
    assert e.value.hint == "127.0.0.2:7001"


# -- updates in flight and updates that failed ---------------------------------------------
def test_a_key_with_an_update_in_flight_reads_as_its_acknowledged_value(primary: Primary) -> None:
    primary.up.op_put(CACHE, b"k", b"v1")
    entered, release = threading.Event(), threading.Event()

    def slow(c: Call) -> str:
        entered.set()
        assert release.wait(WAIT)
        return "applied"
    primary.peers.answers[BACKUP] = slow
    w = primary.bg.submit(primary.up.op_put, CACHE, b"k", b"v2")
    assert entered.wait(WAIT)
    assert primary.data.get(P, b"k") == b"v2"           # in the store already ...
    t0 = time.monotonic()
    assert get(primary) == b"v1"                        # ... not visible: no wait either
    assert time.monotonic() - t0 < 0.5
    assert get(primary, b"other") is None
    release.set()
    assert w.result(WAIT) == 2
    assert get(primary) == b"v2"                        # acknowledged: visible


def test_an_update_that_failed_to_replicate_stays_invisible(primary: Primary) -> None:
    primary.up.op_put(CACHE, b"k", b"v1")
    primary.peers.answers[BACKUP] = Unavailable("connection reset")
    etcd_down(primary)
    with pytest.raises(Unavailable) as e:
        primary.up.op_put(CACHE, b"k", b"v2")
    assert "NOT acknowledged" in str(e.value) and e.value.outcome == UNKNOWN
    assert primary.data.get(P, b"k") == b"v2"           # durable here ...
    assert get(primary) == b"v1"                        # ... but never seen
    assert get(primary, consistency="stale") == b"v1"
    assert primary.up.visible.held(CACHE, P) == 1


def test_a_later_acknowledgement_makes_a_failed_update_visible(primary: Primary) -> None:
    """Copies apply in counter order, so the acknowledgement of a later update means
    every in-sync copy holds the failed one too."""
    assert primary.up.op_put(CACHE, b"first", b"x") == 1    # acknowledged in this term
    primary.peers.answers[BACKUP] = Unavailable("connection reset")
    etcd_down(primary)
    with pytest.raises(Unavailable):
        primary.up.op_put(CACHE, b"k", b"v2")
    assert get(primary) is None
    del primary.peers.answers[BACKUP]                   # the backup is back (it applies #2)
    assert primary.up.op_put(CACHE, b"other", b"x") == 3
    assert get(primary) == b"v2"


def test_a_failed_update_in_a_term_not_yet_confirmed_fails_the_read(primary: Primary) -> None:
    """Nothing acknowledged in this term yet: the read must confirm first, and the
    confirmation fails like the write did (the copy lacks it, the set cannot shrink)."""
    primary.peers.answers[BACKUP] = Unavailable("connection reset")
    etcd_down(primary)
    with pytest.raises(Unavailable):
        primary.up.op_put(CACHE, b"k", b"v2")
    with pytest.raises(Unavailable) as e:
        get(primary)
    assert "confirmation" in str(e.value)


def test_a_write_that_is_not_even_tried_is_refused(primary: Primary) -> None:
    lapse(primary)
    with pytest.raises(Unavailable) as e:
        primary.up.op_put(CACHE, b"k", b"v")
    assert e.value.outcome == "refused"
    assert primary.data.counter(P) == 0


# -- a newer term, fences, a new primary -------------------------------------------------------
def test_a_replicate_in_a_newer_term_stops_the_reads_of_the_old_primary(primary: Primary) -> None:
    primary.up.op_put(CACHE, b"k", b"v1")
    assert get(primary) == b"v1"
    # the new primary's first update reaches this node before its map shows the change
    r = primary.up.backup.op_replicate(CACHE, P, b"k", b"v2", 2, 1, primary=BACKUP, epoch=TERM + 1)
    assert r == "applied"
    with pytest.raises(NotPrimary) as e:
        get(primary)
    assert f"term {TERM + 1}" in str(e.value)
    with pytest.raises(NotPrimary):
        primary.up.op_put(CACHE, b"k", b"v3")


def test_a_read_waits_out_a_fence_like_a_write(primary: Primary) -> None:
    primary.up.op_put(CACHE, b"k", b"v1")
    get(primary)
    primary.ctx.repl.fenced.set((CACHE, P), time.monotonic() + 10)
    threading.Timer(0.1, lambda: primary.ctx.repl.fenced.lift((CACHE, P))).start()
    t0 = time.monotonic()
    assert get(primary) == b"v1"                        # served once the fence lifted
    assert 0.05 < time.monotonic() - t0 < 1.0


def test_a_new_primary_confirms_its_copy_before_its_first_read(primary: Primary) -> None:
    primary.set_isr(PRIMARY, BACKUP, COPY)
    assert get(primary) is None
    conf = [c for c in primary.peers.calls if c.method == "replicate_batch"]
    assert {c.node for c in conf} == {BACKUP, COPY}
    assert all(c.args["updates"] == [] and c.args["prev"] == 0 and c.args["epoch"] == TERM for c in conf)
    get(primary)
    assert len([c for c in primary.peers.calls if c.method == "replicate_batch"]) == 2   # once per term


def test_an_in_sync_copy_that_fails_the_confirmation_leaves_the_in_sync_set(primary: Primary) -> None:
    primary.set_isr(PRIMARY, BACKUP, COPY)
    primary.peers.answers[COPY] = "resync"              # it holds another counter
    assert get(primary) is None
    assert primary.control.calls == [([COPY], [])]
    assert primary.record().isr == (PRIMARY, BACKUP)


def test_a_confirmation_that_cannot_shrink_the_in_sync_set_fails_the_read(primary: Primary) -> None:
    primary.set_isr(PRIMARY, BACKUP, COPY)
    primary.peers.answers[COPY] = Unavailable("connection refused")
    etcd_down(primary)
    with pytest.raises(Unavailable):
        get(primary)


def test_a_node_that_registered_under_a_new_lease_confirms_again(primary: Primary) -> None:
    """Its old lease ended (cut from etcd) and it registered again: it may have been
    deposed meanwhile with its map not showing it yet. Found by the harness: such a node
    served one stale read in the instant between its new lease and its map's catch-up;
    now the in-sync copy that knows the newer term refuses the confirmation."""
    primary.up.op_put(CACHE, b"k", b"v1")
    assert get(primary) == b"v1"                        # confirmed under lease 1
    primary.ctx.session.lease = 2                       # type: ignore[union-attr]
    primary.peers.answers[BACKUP] = StaleEpoch(f"n2 knows default/0 in primary epoch {TERM + 1}")
    with pytest.raises(Unavailable) as e:
        get(primary)
    assert "confirmation" in str(e.value) and "NOT acknowledged" in str(e.value)
    del primary.peers.answers[BACKUP]                   # (not deposed after all)
    assert get(primary) == b"v1"


def test_a_primary_alone_in_sync_confirms_without_a_call(primary: Primary) -> None:
    primary.set_isr(PRIMARY)
    assert get(primary) is None
    assert primary.peers.calls == []


# -- the backup's side of a confirmation -------------------------------------------------
def test_a_backup_answers_a_confirmation_by_its_counter(primary: Primary) -> None:
    with primary.ctx.map.lock:
        primary.ctx.map.map.parts[CACHE][P] = PartRecord(BACKUP, (PRIMARY, BACKUP), EPOCH, False, TERM)
    resynced: list[str] = []

    class Movers:
        def request_resync(self, cache: str, p: int, why: str) -> None:
            resynced.append(why)
    primary.up.bind(Movers())                   # type: ignore[arg-type]
    assert primary.up.backup.op_replicate_batch(CACHE, P, [], 0, primary=BACKUP, epoch=TERM) == "applied"
    assert primary.up.backup.op_replicate_batch(CACHE, P, [], 5, primary=BACKUP, epoch=TERM) == "resync"
    assert resynced and primary.data.counter(P) == 0
    primary.ctx.states.set(CACHE, P, State.MOVING, reason="test: a move")
    assert primary.up.backup.op_replicate_batch(CACHE, P, [], 5, primary=BACKUP, epoch=TERM) == "buffered"
