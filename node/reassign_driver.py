"""The controller's part of reassignment plans (node/reassign.py has the format and
the rules): :class:`PlanDriver` takes every running plan a step further in each
controller round.

A step starts moves (in plan order, at most ``max_moves`` of a plan in flight, never a
partition another running plan is moving) by pinning their owners, records each
started move's stage as :func:`~node.reassign.assess` sees it, marks it done, and ends
the plan. A cancel puts back, for every move not done, the pin it replaced: the old
owners were never evicted (eviction waits for every new owner to be in sync and
OWNING), so they stay as they were and the partial copies go.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from .cluster_map import ClusterMap
from .config import CacheConfig
from .control import Etcd, View
from .errors import NodeError
from .jsonvalue import Json, JsonDoc
from .reassign import (CANCELLED, DONE, MOVING, RATE_SETTING, TERMINAL, Plan, Progress, assess, pin_key,
                       plan_key, plans_from, why_not_placeable)
from .schema import Malformed, log_malformed, pin

log = logging.getLogger("ferry.node.reassign")
TXN_UNITS = 40     # moves per transaction: 2 compares + 2 puts each (etcd's --max-txn-ops: 128)


# compares, puts, deletes, and what it does (logged once it is done)
Unit = tuple[list[JsonDoc], list[tuple[str, Json, int]], list[str], str]


class PlanDriver:
    """Applies the stored plans; :meth:`step` runs in each controller round. Every
    write compares what it read (the progress key, the pin, the setting) and the
    controller's election key (``guard``); after a write, the next step waits until
    the view has caught up with it, so a decision is never made twice from a stale
    view."""

    def __init__(self, prefix: str, etcd: Etcd, view: View, caches: dict[str, CacheConfig],
                 guard: Callable[[], JsonDoc]) -> None:
        self.prefix, self.etcd, self.view, self.caches, self.guard = prefix, etcd, view, caches, guard
        self._parsed: dict[tuple[str, int], Plan] = {}
        self._caught_up = 0            # the view must be at this revision before the next step

    def step(self, whole_map: Callable[[], tuple[ClusterMap, "AbstractContextManager[object]"]]) -> int:
        """One round over the running plans; returns the keys written."""
        if self.view.revision < self._caught_up:
            return 0
        plans = plans_from(self.view.items("reassign"), self.caches, self._parsed, running_only=True)
        running = [pl for pl in plans.values() if pl.end is None]
        if not running:
            return 0
        units: list[Unit] = []
        m, lock = whole_map()
        with lock:
            claimed = {(pl.moves[i].cache, pl.moves[i].partition): pl.name
                       for pl in running for i in pl.in_flight() if i < len(pl.moves)}
            for pl in running:
                self._one(pl, m, claimed, units, running)
        return self._commit(units)

    def _one(self, pl: Plan, m: ClusterMap, claimed: dict[tuple[str, int], str],
             units: list[Unit], running: list[Plan]) -> None:
        """The writes of one plan's round, into ``units``."""
        now = round(time.time(), 3)
        if pl.refused is not None:
            units.append(self._end(pl, "refused", now, running, reason=pl.refused))
            return
        finished = {i for i, pr in pl.progress.items() if pr.stage in TERMINAL}
        flying = 0
        for i in pl.in_flight():
            mv, pr = pl.moves[i], pl.progress[i]
            stage, waits = assess(m, mv.cache, mv.partition, mv.to)
            if stage == DONE:
                units.append(self._done(pl, i, m, now))
                finished.add(i)
            elif pl.cancel:
                units.append(self._stop(pl, i, now))
            else:
                flying += 1
                if (stage, waits) != (pr.stage, pr.waits):
                    new = Progress(stage, waits, now, pr.started, None, pr.pin_before)
                    units.append(([Etcd.mod_is(self._progress_key(pl, i), pr.mod)],
                                  [(self._progress_key(pl, i), new.to_json(), 0)], [], ""))
        if pl.cancel:
            units.append(self._end(pl, CANCELLED, now, running))
            return
        limit = pl.max_moves or math.inf
        for i, mv in enumerate(pl.moves):
            if flying >= limit:
                break
            if i in pl.progress or claimed.get((mv.cache, mv.partition), pl.name) != pl.name:
                continue                    # started, or another plan moves the partition now
            if any(why_not_placeable(m, n) for n in mv.to):
                continue                    # waits for its owners to be live members
            units.append(self._start(pl, i, now))
            claimed[(mv.cache, mv.partition)] = pl.name
            flying += 1
        if len(finished) == len(pl.moves):
            units.append(self._end(pl, DONE, now, running))

    # -- the writes ------------------------------------------------------------------------
    def _progress_key(self, pl: Plan, i: int) -> str:
        return f"{plan_key(self.prefix, pl.name)}/moves/{i}"

    def _start(self, pl: Plan, i: int, now: float) -> Unit:
        """Pin the move's owners; remember the pin it replaces (for a cancel)."""
        mv = pl.moves[i]
        pk = pin_key(self.prefix, mv.cache, mv.partition)
        old = self.view.get(pk)
        before: list[str] | None = None
        if old is not None:
            try:
                before = list(pin(pk, old))
            except Malformed as e:      # no valid pin to put back: rendezvous hashing then
                log_malformed(e, "replaced by the plan's pin")
        pr = Progress(MOVING, "the pin to reach the nodes", now, now, None, before)
        return ([Etcd.mod_is(self._progress_key(pl, i), 0), Etcd.mod_is(pk, old.mod if old else 0)],
                [(pk, list(mv.to), 0), (self._progress_key(pl, i), pr.to_json(), 0)], [],
                f"plan {pl.name}: {mv.cache}/{mv.partition} {list(mv.source)} -> {list(mv.to)} started")

    def _done(self, pl: Plan, i: int, m: ClusterMap, now: float) -> Unit:
        """Mark move i done. Its pin goes when the owners are what rendezvous hashing
        gives anyway (the partition then follows membership changes again)."""
        mv, pr = pl.moves[i], pl.progress[i]
        pk = pin_key(self.prefix, mv.cache, mv.partition)
        new = Progress(DONE, "", now, pr.started, now, pr.pin_before)
        cmp = [Etcd.mod_is(self._progress_key(pl, i), pr.mod)]
        dels: list[str] = []
        cur = self.view.get(pk)
        if cur is not None and cur.value == list(mv.to) and \
                m.placement(mv.cache).owners(mv.partition) == list(mv.to):
            cmp.append(Etcd.mod_is(pk, cur.mod))
            dels.append(pk)
        return (cmp, [(self._progress_key(pl, i), new.to_json(), 0)], dels,
                f"plan {pl.name}: {mv.cache}/{mv.partition} done ({list(mv.to)}) in {now - pr.started:.1f}s"
                + (", pin dropped (rendezvous hashing gives those owners)" if dels else ""))

    def _stop(self, pl: Plan, i: int, now: float) -> Unit:
        """Cancel move i: the pin it replaced goes back (the owners it had stay: the
        old copies were never evicted, as the new owners were not all in sync)."""
        mv, pr = pl.moves[i], pl.progress[i]
        pk = pin_key(self.prefix, mv.cache, mv.partition)
        cur = self.view.get(pk)
        cmp = [Etcd.mod_is(self._progress_key(pl, i), pr.mod), Etcd.mod_is(pk, cur.mod if cur else 0)]
        new = Progress(CANCELLED, "", now, pr.started, now, pr.pin_before)
        puts: list[tuple[str, Json, int]] = [(self._progress_key(pl, i), new.to_json(), 0)]
        dels: list[str] = []
        if pr.pin_before is not None:
            puts.append((pk, list(pr.pin_before), 0))
        elif cur is not None:
            dels.append(pk)
        return (cmp, puts, dels, f"plan {pl.name}: {mv.cache}/{mv.partition} cancelled (owners back to "
                                 f"{pr.pin_before or 'rendezvous hashing'})")

    def _end(self, pl: Plan, state: str, now: float, running: list[Plan], reason: str | None = None) -> Unit:
        """The plan's end marker; the transfer rate it set goes back to what it was
        unless someone changed it meanwhile (then their value stays)."""
        end = f"{plan_key(self.prefix, pl.name)}/end"
        cmp: list[JsonDoc] = [Etcd.mod_is(plan_key(self.prefix, pl.name), pl.mod), Etcd.mod_is(end, 0)]
        puts: list[tuple[str, Json, int]] = [(end, {"state": state, "at": now, "reason": reason}, 0)]
        sk = f"{self.prefix}/settings/{RATE_SETTING}"
        cur = self.view.get(sk)
        others = any(o.throttle is not None for o in running if o.name != pl.name)
        if pl.throttle is not None and cur is not None and cur.value == pl.throttle and not others:
            # no stored setting before: back to the default, 0 (unlimited); a cluster
            # setting cannot be unset (the nodes keep the last value they applied)
            back = pl.throttle_before if pl.throttle_before is not None else 0
            cmp.append(Etcd.mod_is(sk, cur.mod))
            puts.append((sk, back, 0))
        note = f"plan {pl.name} {state}" + (f": {reason}" if reason else "")
        if len(puts) > 1:
            note += f"; {RATE_SETTING} back to {puts[1][1]}"
        return cmp, puts, [], note

    def _commit(self, units: list[Unit]) -> int:
        written = 0
        for k in range(0, len(units), TXN_UNITS):
            chunk = units[k:k + TXN_UNITS]
            cmp = [self.guard()] + [c for u in chunk for c in u[0]]
            puts = [p for u in chunk for p in u[1]]
            dels = [d for u in chunk for d in u[2]]
            try:
                ok, rev = self.etcd.txn(cmp, puts, dels)
            except NodeError as e:
                log.info("stage=reassign plan writes not made (%s); next round", str(e)[:160])
                return written
            self._caught_up = max(self._caught_up, rev)
            if not ok:
                log.info("stage=reassign a plan's keys changed under this round; next round")
                return written
            written += len(puts) + len(dels)
            for u in chunk:
                if u[3]:
                    log.info("stage=reassign %s", u[3])
        return written


__all__ = ["PlanDriver"]
