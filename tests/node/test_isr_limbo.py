"""An admission to the in-sync set whose outcome is unknown (node/updates.py,
UpdatePath.op_join_isr / _settle_limbo): the controller's alter_isr(add) raised
OutcomeUnknown (the request timed out and could not be withdrawn: it may still be
applied). The copy keeps counting as in sync (``repl.admissions``) until this node's map
is at or past the request's revision without the request key; then the record says
whether it was admitted, and the admission ends as any other.

The real UpdatePath and NodeContext of test_isr_admission.py, with its stand-in
controller (``refuse`` makes alter_isr(add) raise) and peers. The map's epoch and
pending requests are set the way node/membership.py's _on_view_change sets them.
"""
from __future__ import annotations

import pytest

from node.cluster_map import PartRecord
from node.errors import OutcomeUnknown, Unavailable
from node.states import State

from test_isr_admission import BACKUP, CACHE, COPY, EPOCH, OTHER, P, PRIMARY, TERM, WAIT, Primary
from test_isr_admission import primary  # noqa: F401  (the fixture)

REQ = f"/ferry/default/requests/{CACHE}/{P}/{PRIMARY}"
REV = 100                   # the revision of the request's put


def unknown(node: Primary) -> None:
    """op_join_isr(COPY) whose alter_isr(add) ends in OutcomeUnknown: the request is in
    etcd (in the map's pending requests), the map not yet past it."""
    node.register(COPY, State.OWNING)
    with node.ctx.map.lock:
        node.ctx.map.map.epoch = REV - 10
        node.ctx.map.pending_requests = {REQ}
    node.control.refuse = OutcomeUnknown("no answer, and the request could not be withdrawn",
                                          key=REQ, rev=REV)
    with pytest.raises(OutcomeUnknown):
        node.bg.submit(node.up.op_join_isr, CACHE, P, COPY).result(timeout=WAIT)
    assert node.control.calls == [([], [COPY])]
    in_limbo(node)


def in_limbo(node: Primary) -> None:
    assert node.ctx.repl.admissions.snapshot()[0] == {(CACHE, P): COPY}
    assert COPY in node.copies()


def map_shows(node: Primary, admitted: bool, epoch: int = REV + 1, pending: bool = False) -> None:
    """A watch batch at ``epoch``: the request gone (or not), the copy admitted (or not)."""
    with node.ctx.map.lock:
        if admitted:
            node.ctx.map.map.parts[CACHE][P] = PartRecord(PRIMARY, (PRIMARY, BACKUP, COPY), EPOCH + 1,
                                                          False, TERM)
        node.ctx.map.map.epoch = epoch
        node.ctx.map.pending_requests = {REQ} if pending else set()
    with node.ctx.map.changed:
        node.ctx.map.changed.notify_all()


def test_the_copy_counts_as_in_sync_while_the_outcome_is_unknown(primary):   # noqa: F811
    unknown(primary)
    # a write it applies is acknowledged; one it fails is not (and spoils the admission)
    assert primary.put(b"k1") == 1
    assert primary.peers.replicated(1) == {BACKUP, COPY}
    primary.peers.answers[COPY] = Unavailable("connection reset")
    with pytest.raises(Unavailable, match="NOT acknowledged"):
        primary.put(b"k2")
    assert primary.ctx.repl.admissions.snapshot()[1] == {(CACHE, P)}
    in_limbo(primary)
    # no second change of p's in-sync set meanwhile
    for node in (COPY, OTHER):
        primary.register(node, State.OWNING)
        with pytest.raises(Unavailable, match="in progress"):
            primary.bg.submit(primary.up.op_join_isr, CACHE, P, node).result(timeout=WAIT)
    primary.peers.answers[BACKUP] = Unavailable("connection reset")
    with pytest.raises(Unavailable, match="NOT acknowledged"):
        primary.put(b"k3")
    assert primary.control.calls == [([], [COPY])]
    in_limbo(primary)


@pytest.mark.parametrize("epoch, pending", [(REV, True), (REV - 1, False)],
                         ids=["request-still-pending", "map-not-yet-past-it"])
def test_the_limbo_lasts_until_the_map_is_past_the_request_and_it_is_gone(primary, epoch, pending):  # noqa: F811
    unknown(primary)
    map_shows(primary, admitted=False, epoch=epoch, pending=pending)
    primary.peers.answers[COPY] = Unavailable("connection reset")
    with pytest.raises(Unavailable, match="NOT acknowledged"):
        primary.put(b"k1")
    in_limbo(primary)
    with pytest.raises(Unavailable, match="in progress"):
        primary.up.op_join_isr(CACHE, P, COPY)
    assert primary.control.calls == [([], [COPY])]


def test_admitted_after_all_the_next_write_ends_the_admission(primary):     # noqa: F811
    unknown(primary)
    assert primary.put(b"k1") == 1
    map_shows(primary, admitted=True)
    assert primary.put(b"k2") == 2                  # ends the limbo first, under p's lock
    assert primary.ctx.repl.admissions.snapshot()[0] == {} and primary.ctx.repl.admissions.snapshot()[1] == set()
    assert COPY not in primary.copies()             # admitted: no longer a registered copy
    assert primary.peers.replicated(2) == {BACKUP, COPY}
    # in sync by the record now: its failure takes it out, as any in-sync copy's
    primary.peers.answers[COPY] = Unavailable("connection reset")
    assert primary.put(b"k3") == 3
    assert primary.control.calls == [([], [COPY]), ([COPY], [])]
    assert primary.record().isr == (PRIMARY, BACKUP)


def test_not_admitted_after_all_the_copy_stays_registered_and_counts_for_nothing(primary):  # noqa: F811
    unknown(primary)
    map_shows(primary, admitted=False)
    primary.peers.answers[COPY] = Unavailable("connection reset")
    assert primary.put(b"k1") == 1                  # acknowledged: it is not in sync
    assert primary.ctx.repl.admissions.snapshot()[0] == {} and primary.ctx.repl.admissions.snapshot()[1] == set()
    assert COPY not in primary.copies()             # it missed a write: dropped, as a MOVING copy
    assert primary.control.calls == [([], [COPY])]
    assert primary.record().isr == (PRIMARY, BACKUP)


def test_not_admitted_after_all_a_later_join_starts_again(primary):        # noqa: F811
    unknown(primary)
    map_shows(primary, admitted=False)
    assert primary.up.op_join_isr(CACHE, P, COPY) == "ok"      # settles, then admits anew
    assert primary.control.calls == [([], [COPY]), ([], [COPY])]
    assert primary.record().isr == (PRIMARY, BACKUP, COPY)
    assert primary.ctx.repl.admissions.snapshot()[0] == {} and COPY not in primary.copies()


def test_admitted_after_all_a_later_join_is_told_so(primary):             # noqa: F811
    unknown(primary)
    map_shows(primary, admitted=True)
    assert primary.up.op_join_isr(CACHE, P, COPY) == "ok"
    assert primary.control.calls == [([], [COPY])]             # nothing asked again
    assert primary.ctx.repl.admissions.snapshot()[0] == {} and COPY not in primary.copies()


@pytest.mark.parametrize("admitted", [True, False], ids=["admitted", "not-admitted"])
def test_a_spoiled_limbo_ends_with_the_copy_out(primary, admitted):        # noqa: F811
    unknown(primary)
    primary.peers.answers[COPY] = "resync"
    with pytest.raises(Unavailable, match="NOT acknowledged"):
        primary.put(b"k1")
    map_shows(primary, admitted=admitted)
    assert primary.put(b"k2") == 2                  # the copy no longer counts: acknowledged
    assert primary.ctx.repl.admissions.snapshot()[0] == {} and primary.ctx.repl.admissions.snapshot()[1] == set()
    assert COPY not in primary.copies()
    # admitted meanwhile: taken out again at once (it lacks the write it failed)
    assert primary.control.calls == [([], [COPY])] + ([([COPY], [])] if admitted else [])
    assert primary.record().isr == (PRIMARY, BACKUP)
