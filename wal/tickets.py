"""Tickets of group commit: one per waiter, finished by a sync thread, woken by a baton.

See ``groupcommit.py`` for the protocol. A ticket is a list (the cheapest mutable thing
to build per append); the waiters of one fsync are linked, and each wakes the next.
"""
from __future__ import annotations

import threading
from typing import Any, TypeAlias

# One waiter: [payload or None, type, gate, result, next, abandoned]. ``result`` is set
# by whoever finishes the ticket, before its gate opens: the LSN of the queued record (0
# for a bare waiter), -1 when the fsync failed or the log closed first, or the exception
# that kept the record from being written (a full disk). ``next`` is the following
# waiter of the same fsync: the baton goes there. A list, not an object: the cheapest
# mutable thing to build per append. Its slots differ in type, which a list type cannot
# say per index: the element type is Any.
Ticket: TypeAlias = list[Any]
# A ticket's gate: a plain lock, held until the ticket is finished.
new_gate = threading.Lock


def wait(ticket: Ticket) -> int:
    """Block until the ticket is finished. Returns the LSN of the queued record (0 when
    the ticket queued none); -1 when the fsync failed or the log closed. Raises the
    error that kept a queued record from being written (a full disk)."""
    gate = ticket[2]
    try:
        gate.acquire()
    except BaseException:
        # Interrupted (a signal in the main thread) before the baton came: mark the
        # ticket, then look again -- whichever of us and the waiter before us sees the
        # other's step hands the baton on, so the waiters behind never stall.
        ticket[5] = True
        if gate.acquire(False):
            _pass_baton(ticket[4])
        raise
    _pass_baton(ticket[4])
    r = ticket[3]
    if r.__class__ is not int:
        raise r
    return r


def _pass_baton(nxt: Ticket | None) -> None:
    """Wake the next waiter of the same fsync (and on past any that gave up)."""
    while nxt is not None:
        try:
            nxt[2].release()
        except RuntimeError:      # handed on twice (see wait): already open
            pass
        if not nxt[5]:
            return
        nxt = nxt[4]


def finish(items: list[Ticket], ok: bool, bare_ok: bool | None = None) -> None:
    """Finish every ticket of ``items``: wake the first waiter, which wakes the next
    (the baton, see the module doc). Not ok: the tickets without an error of their
    own fail (-1). ``bare_ok`` overrides ``ok`` for tickets that queued no record
    (their records were written and covered)."""
    for t in items:
        good = ok if bare_ok is None or t[0] is not None else bare_ok
        if not good and t[3].__class__ is int:
            t[3] = -1
    if items:
        for a, b in zip(items, items[1:]):
            a[4] = b
        _pass_baton(items[0])
