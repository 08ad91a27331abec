"""Per-move bookkeeping that must not grow with the partitions: the reconcile loop's
queue of waiting moves and the primary's table of registered MOVING copies."""
from __future__ import annotations

import collections
import types

from node.context import Copies
from node.reconcile import Reconciler


def test_copies_keep_no_entry_for_a_partition_without_registrations() -> None:
    c = Copies()
    for p in range(1000):                     # a join: each copy registers, then is admitted
        c.add(("default", p), "n4", "a4")
        c.discard(("default", p), "n4")
    assert len(c) == 0 and not c.any()
    c.add(("default", 1), "n4", "a4")
    c.add(("default", 1), "n5", "a5")
    c.add(("default", 2), "n5", "a5")
    c.discard(("default", 1), "n4")
    assert len(c) == 2 and c.of(("default", 1)) == {"n5": "a5"}
    c.keep_members({"n4"})                    # n5 left: its registrations go, and the entries
    assert len(c) == 0 and not c.any() and c.of(("default", 2)) == {}


class _Movers:
    def __init__(self, slots: int, running: set) -> None:
        self.slots, self.running, self.asked = slots, running, []

    def start_move(self, cache: str, p: int, why: str) -> bool:
        self.asked.append(p)
        if (cache, p) in self.running or self.slots == 0:
            return False
        self.slots -= 1
        self.running.add((cache, p))
        return True


def test_waiting_moves_start_in_the_order_they_came() -> None:
    running: set = {("default", 5)}           # already moving: dropped from the queue
    ctx = types.SimpleNamespace(moves=running)
    rec = Reconciler.__new__(Reconciler)
    rec.ctx = ctx                              # type: ignore[assignment]
    rec.movers = _Movers(2, running)           # type: ignore[assignment]
    rec._to_move = collections.OrderedDict()
    for p in (7, 5, 3, 9, 1):
        rec._to_move[("default", p)] = "assigned by the map"
    rec._to_move[("default", 7)] = "again"     # assigned again: keeps its place
    rec._start_moves()
    assert rec.movers.asked == [7, 5, 3, 9]    # 9 found no slot: the pass stops there
    assert list(rec._to_move) == [("default", 9), ("default", 1)]
    rec.movers.slots = 5
    rec._start_moves()
    assert list(rec._to_move) == [] and rec.movers.asked[-2:] == [9, 1]
