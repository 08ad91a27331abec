"""The reconcile loop: act on each new map. It starts moves of partitions assigned
here, asks the primary to count a copy that finished its move as in sync, takes the
primary role when this node is the ideal first owner, and evicts copies the map no
longer assigns here once their new owners are in sync (RENTING -> EVICTED).

It runs on its own thread, woken by :meth:`NodeContext.wake` (a map change, a state
change, a finished move) and at least once a second.
"""
from __future__ import annotations

import logging
import threading
from typing import Protocol

from checkpoint import SnapshotBusyError
from faults import crashpoint

from .context import NodeContext, PartKey
from .errors import NodeError
from .ports import IsrControl, MoveActions
from .states import State

log = logging.getLogger("ferry.node.reconcile")


class Leaving(IsrControl, Protocol):
    """The control plane as the reconcile loop sees it: the in-sync requests plus the
    two steps of a graceful leave."""

    def start_leave(self) -> None: ...

    def finish_leave(self) -> None: ...


class Reconciler:
    def __init__(self, ctx: NodeContext, control: Leaving, movers: MoveActions) -> None:
        self.ctx = ctx
        self.control = control
        self.movers = movers
        self._isr_joins: set[PartKey] = set()   # copies asking their primary to count

    def run(self) -> None:
        while not self.ctx.events.stopping.is_set():
            self.ctx.events.reconcile.wait(1.0)
            self.ctx.events.reconcile.clear()
            if self.ctx.events.stopping.is_set() or not self.ctx.events.joined.is_set():
                continue
            if self.ctx.events.leaving.is_set() and self.ctx.map.map.members.get(self.ctx.id) is not None \
                    and not self.ctx.map.map.members[self.ctx.id].leaving:
                self.control.start_leave()
            try:
                self.reconcile()
            except Exception:
                log.exception("stage=reconcile failed")

    def reconcile(self) -> None:
        with self.ctx.map.lock:
            m = self.ctx.map.map.clone()
        me = self.ctx.id
        if me not in m.members:
            return          # not registered (lease lost): act on nothing until registered again
        for cache, data in self.ctx.data.items():
            for p in range(data.cache.partitions):
                key = (cache, p)
                st = self.ctx.states.get(cache, p)
                rec = m.parts[cache][p]
                prim = rec.primary
                ideal = m.ideal(cache, p)
                # registered MOVING copies that died or left need no registration
                regs = self.ctx.repl.copies.get(key)
                if regs:
                    for n in list(regs):
                        if n not in m.members:
                            regs.pop(n, None)
                if key in self.ctx.moves.running:
                    if me not in ideal and m.state(cache, p, me) == State.MOVING and prim != me:
                        self.ctx.moves.running[key].cancelled = True
                    continue
                if st == State.OWNING and me not in rec.isr:
                    if rec.lost or (prim is None and not rec.isr):
                        continue
                    if prim is None:
                        continue        # waiting for an in-sync copy or the controller
                    if key not in self._isr_joins:
                        self._isr_joins.add(key)
                        threading.Thread(target=self._join_isr, args=(cache, p), daemon=True).start()
                    continue
                if me in ideal:
                    if st in (None, State.EVICTED, State.LOST):
                        # (a LOST partition is reported by the controller's record; no
                        # local state is needed for a copy this node never had)
                        if prim is not None and prim != me:
                            self.movers.start_move(cache, p, "assigned by the map")
                    elif st == State.MOVING:
                        self.movers.start_move(cache, p, "resuming after restart or resync")
                    elif st == State.RENTING:
                        self.evict(cache, p, "assigned again while renting: re-pull")
                    elif (st == State.OWNING and ideal[0] == me and prim not in (me, None)
                          and prim in m.members and key not in self.ctx.repl.handoffs
                          and m.state(cache, p, prim) == State.OWNING):
                        self.ctx.repl.handoffs.add(key)
                        threading.Thread(target=self.movers.take_primary, args=(cache, p, prim),
                                         daemon=True).start()
                else:
                    if st == State.MOVING:
                        self.ctx.states.set(cache, p, State.EVICTED, reason="move cancelled: not assigned")
                        with self.ctx.plock(cache, p):
                            data.drop(p)
                    elif st == State.OWNING and prim != me and ideal and all(
                            n in rec.isr and m.state(cache, p, n) == State.OWNING for n in ideal):
                        self.ctx.states.set(cache, p, State.RENTING, reason="new owners are in sync")
                        self.evict(cache, p, "no longer an owner")
                    elif st == State.RENTING:
                        self.evict(cache, p, "finishing eviction")
        if self.ctx.events.leaving.is_set() and not any(
                s in (State.OWNING, State.MOVING, State.RENTING) for _, s in self.ctx.states.items()):
            self.control.finish_leave()

    def evict(self, cache: str, p: int, why: str) -> None:
        """RENTING -> EVICTED: the file is deleted once no transfer reads it (else the
        partition stays RENTING and the next reconcile tries again)."""
        if self.ctx.repl.in_use.get((cache, p)):
            log.info("stage=evict cache=%s partition=%d still being sent; eviction waits", cache, p)
            return
        with self.ctx.plock(cache, p):
            crashpoint("owner.mid_eviction")
            try:
                self.ctx.data[cache].drop(p)
            except SnapshotBusyError:
                log.info("stage=evict cache=%s partition=%d still being sent; eviction waits", cache, p)
                return
            self.ctx.states.set(cache, p, State.EVICTED, reason=why)
        log.info("stage=evict cache=%s partition=%d evicted: %s", cache, p, why)

    def _join_isr(self, cache: str, p: int) -> None:
        key = (cache, p)
        try:
            with self.ctx.map.lock:
                prim = self.ctx.map.map.parts[cache][p].primary
                addr = self.ctx.map.map.address(prim)
            if addr is None or prim == self.ctx.id:
                return
            # the controller keeps in the set only copies that report OWNING: the report
            # must be in etcd before the primary admits this copy
            self.control.put_report()
            r = self.ctx.pool.call(addr, "join_isr", timeout=10.0, cache=cache, p=p, node=self.ctx.id)
            if r == "resync":
                with self.ctx.map.lock:
                    ideal = self.ctx.map.map.ideal(cache, p)
                if self.ctx.id in ideal:
                    log.info("stage=isr cache=%s partition=%d not admitted by %s: resyncing", cache, p, prim)
                    self.movers.request_resync(cache, p, "not in sync with the primary")
                else:
                    self.ctx.states.set(cache, p, State.RENTING, reason="copy not in sync, not an owner")
                    self.evict(cache, p, "out-of-sync copy of a partition owned elsewhere")
            else:
                log.info("stage=isr cache=%s partition=%d admitted to the in-sync set by %s", cache, p, prim)
        except NodeError as e:
            log.info("stage=isr cache=%s partition=%d join failed: %s", cache, p, str(e)[:160])
        finally:
            self._isr_joins.discard(key)
            self.ctx.wake()


__all__ = ["Reconciler"]
