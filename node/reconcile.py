"""The reconcile loop: act on each new map. It starts moves of partitions assigned
here, asks the primary to count a copy that finished its move as in sync, takes the
primary role when this node is the ideal first owner, and evicts copies the map no
longer assigns here once their new owners are in sync (RENTING -> EVICTED).

It runs on its own thread, woken by :meth:`NodeContext.wake` (a map change, a state
change, a finished move) and at least once a second.
"""
from __future__ import annotations

import collections
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Hashable, Protocol

from checkpoint import SnapshotBusyError
from faults import crashpoint

from .backoff import Backoff
from .context import NodeContext, PartKey
from .controller import INITIAL_WAIT_S
from .errors import NodeError
from .ports import IsrControl, MoveActions
from .rpcapi import HoldsQuery, JoinIsr
from .states import State

log = logging.getLogger("ferry.node.reconcile")


class Leaving(IsrControl, Protocol):
    """The control plane as the reconcile loop sees it: the in-sync requests plus the
    two steps of a graceful leave."""

    def start_leave(self) -> None: ...

    def finish_leave(self) -> None: ...


ACTIONS_AT_ONCE = 8      # in-sync joins and hand-offs in flight
FULL_SWEEP_S = 30.0       # every partition is looked at this often, whatever the deltas say
RETRY_BASE_S = 0.25       # a failed in-sync join or hand-off is asked again after this,
RETRY_CAP_S = 2.0         # doubling on each failure up to this (node/backoff.py): short, so
                          # a copy whose peers come back (nothing in etcd changed) asks soon


class Reconciler:
    """Acts on the partitions the map's deltas name (``ctx.map.dirty``: a record, a
    report or the ideal owners of p changed; a local state changed), plus the ones
    whose last look left something to wait for, plus every partition once per
    FULL_SWEEP_S as a safety net. A pass costs the size of the change, not of the
    cluster."""

    def __init__(self, ctx: NodeContext, control: Leaving, movers: MoveActions) -> None:
        self.ctx = ctx
        self.control = control
        self.movers = movers
        self._isr_joins: set[PartKey] = set()   # copies asking their primary to count
        # evictions: new owners being asked whether they hold p (``holds``), and the
        # (record, lease) token under which they all confirmed
        self._confirming: set[PartKey] = set()
        self._confirmed: dict[PartKey, Hashable] = {}
        self.backoff: Backoff[PartKey] = Backoff(RETRY_BASE_S, RETRY_CAP_S)   # failed joins, hand-offs
        self._again: set[PartKey] = set()       # to look at in the next pass too
        # partitions assigned here that wait for a move slot, in the order they came
        self._to_move: collections.OrderedDict[PartKey, str] = collections.OrderedDict()
        self._last_sweep = 0.0
        self._born = time.monotonic()
        self.looked_at = 0
        # in-sync joins and hand-offs run here: a few at a time, not a thread each (a
        # join of thousands of partitions would open thousands of connections at once)
        self._pool = ThreadPoolExecutor(ACTIONS_AT_ONCE, thread_name_prefix="reconcile-action")                      # partitions looked at, over all passes

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
            except Exception:  # noqa: BLE001 - the loop goes on: a bug in one pass is logged
                log.exception("stage=reconcile failed")
                self.ctx.map.dirty.everything()

    def _keys(self) -> "set[PartKey] | None":
        dirty = self.ctx.map.dirty.take()
        now = time.monotonic()
        if dirty is None or now - self._last_sweep >= FULL_SWEEP_S:
            self._last_sweep = now
            self._again.clear()
            return None
        dirty |= self._again
        self._again = set()
        return dirty

    def reconcile(self) -> None:
        me = self.ctx.id
        with self.ctx.map.lock:
            m = self.ctx.map.map
            registered = me in m.members
            members = set(m.members)
        if not registered:
            self.ctx.map.dirty.everything()    # not registered (lease lost): act on nothing
            return                              # until registered again, then on everything
        # registered MOVING copies that died or left need no registration
        self.ctx.repl.copies.keep_members(members)
        keys = self._keys()
        if keys is None:
            keys = {(c, p) for c, d in self.ctx.data.items() for p in range(d.cache.partitions)}
        for key in sorted(keys):
            if key[0] not in self.ctx.data:
                continue
            self.looked_at += 1
            if self._one(*key):
                self._again.add(key)
        self._start_moves()
        if self.ctx.events.leaving.is_set() and not any(
                s in (State.OWNING, State.MOVING, State.RENTING) for _, s in self.ctx.states.items()):
            self.control.finish_leave()

    def _start_moves(self) -> None:
        """Start the waiting moves while slots are free (in the order they came)."""
        # the first waiting one at a time (an OrderedDict's first item is O(1)): no copy
        # of the whole queue per pass, which holds every partition still to move
        while self._to_move:
            key, why = next(iter(self._to_move.items()))
            if not self.movers.start_move(key[0], key[1], why):
                if key in self.ctx.moves:
                    del self._to_move[key]
                    continue
                return                          # no slot: the next pass tries again
            del self._to_move[key]

    def _one(self, cache: str, p: int) -> bool:
        """Act on (cache, p); True when it should be looked at again next pass."""
        me = self.ctx.id
        key = (cache, p)
        data = self.ctx.data[cache]
        st = self.ctx.states.get(cache, p)
        with self.ctx.map.lock:
            m = self.ctx.map.map
            rec = m.parts[cache][p]
            unborn = (m.rec_mod[cache][p] == 0 and bool(m.initial_members) and m.creator == me
                      and not any(s == State.OWNING.value and n in m.members
                                  for n, s in m.states[cache][p].items()))
            ideal = m.ideal(cache, p)
            prim = rec.primary
            prim_alive = prim in m.members
            owning = {n for n in set(ideal) | ({prim} if prim else set())
                      if m.states[cache][p].get(n) == State.OWNING.value}
            my_reported = m.states[cache][p].get(me)
        # what a failed join or hand-off of p is remembered with: a new record or a new
        # lease (a cut healed) makes p ready to ask again at once (node/backoff.py)
        sess = self.ctx.session
        token = (prim, rec.epoch, sess.lease if sess is not None else 0)
        self._to_move.pop(key, None)            # put back below while it still applies
        if unborn and st is None:
            # a new cluster's partition none of its initial owners made (they did not
            # come): the creator makes it, empty, once they had their time
            if time.monotonic() - self._born < INITIAL_WAIT_S + 5.0:
                return True
            data.create(p)
            self.ctx.states.set(cache, p, State.OWNING, reason="new cluster: its initial owners did not come")
            return False
        running = self.ctx.moves.get(key)
        if running is not None:
            if me not in ideal and my_reported == State.MOVING.value and prim != me:
                running.cancel()
            return True                         # looked at again until the move has ended
        if st == State.OWNING and key in self.ctx.returning:
            if (me, self.ctx.boot) in rec.confirmed:
                self._current(key, "elected by the controller: every in-sync copy came back "
                              "and this one is at the highest counter")
            elif me in rec.isr:
                return True     # until the controller takes it out of the set, or elects it
            else:
                # out of the set: the join below asks the primary, which compares counters
                self._current(key, "not in the in-sync set: it joins like any copy")
        if st == State.OWNING and me not in rec.isr:
            if rec.lost or prim is None:
                return False                    # waiting for an in-sync copy or the controller
            if not self.backoff.ready(key, token):
                return True                     # its last join failed: not yet
            if key not in self._isr_joins:
                self._isr_joins.add(key)
                self._pool.submit(self._join_isr, cache, p, token)
            return False                        # the join's end marks p dirty
        if me in ideal:
            if st in (None, State.EVICTED, State.LOST):
                # (a LOST partition is reported by the controller's record; no
                # local state is needed for a copy this node never had)
                if prim is not None and prim != me:
                    self._to_move[key] = "assigned by the map"
            elif st == State.MOVING:
                self._to_move[key] = "resuming after restart or resync"
            elif st == State.RENTING:
                return not self.evict(cache, p, "assigned again while renting: re-pull")
            elif st == State.OWNING and ideal[0] == me and prim not in (me, None) and prim_alive:
                if key in self.ctx.repl.handoffs:
                    return True                 # a hand-off in progress: look again
                if prim in owning:
                    if not self.backoff.ready(key, token):
                        return True             # its last hand-off failed: not yet
                    if not self.ctx.repl.handoffs.begin(key):
                        return True
                    self._pool.submit(self._hand_off, cache, p, prim, token)
                    return True
        else:
            if st == State.MOVING:
                self.ctx.states.set(cache, p, State.EVICTED, reason="move cancelled: not assigned")
                with self.ctx.plock(cache, p):
                    data.drop(p)
            elif st == State.OWNING and prim != me and ideal and all(
                    n in rec.isr and n in owning for n in ideal):
                # the map says so; the new owners must say so too, over authenticated
                # RPC, before this copy goes (a forged map in etcd names owners that
                # do not hold p: nothing is deleted for it)
                if self._confirmed.get(key) != token:
                    if key not in self._confirming and self.backoff.ready(key, token):
                        self._confirming.add(key)
                        self._pool.submit(self._confirm_owners, cache, p, tuple(ideal), token)
                    return True
                self._confirmed.pop(key, None)
                self.ctx.states.set(cache, p, State.RENTING, reason="new owners are in sync")
                return not self.evict(cache, p, "no longer an owner")
            elif st == State.RENTING:
                return not self.evict(cache, p, "finishing eviction")
        return False

    def _current(self, key: PartKey, why: str) -> None:
        """A returning copy is confirmed (or needs no confirming): reported OWNING again."""
        self.ctx.returning.discard(key)
        log.info("stage=isr cache=%s partition=%d returning copy: %s", key[0], key[1], why)
        self.control.report_changed(*key)

    def _confirm_owners(self, cache: str, p: int, owners: tuple[str, ...], token: Hashable) -> None:
        """Each new owner says, over authenticated RPC (``holds``), that it is the node
        the map names and holds p OWNING at a counter at least this copy's. Only then
        may the copy be evicted (the next look, with the same record and lease)."""
        key = (cache, p)
        why = ""
        try:
            mine = self.ctx.data[cache].counter(p)
            for n in owners:
                with self.ctx.map.lock:
                    addr = self.ctx.map.map.address(n)
                if addr is None:
                    why = f"{n} has no address"
                    break
                try:
                    r = self.ctx.pool.request(addr, HoldsQuery(cache, p), timeout=5.0)
                except NodeError as e:
                    why = f"{n} at {addr} did not answer: {str(e)[:120]}"
                    break
                if r.node != n or r.state != State.OWNING.value or r.counter < mine:
                    why = f"{n} at {addr} answered {str(r)[:160]} (this copy is at {mine})"
                    break
        except Exception as e:  # noqa: BLE001 - a bug here must not take the eviction path with it
            why = f"confirmation failed: {e!r}"
            log.exception("stage=evict cache=%s partition=%d owner confirmation crashed", cache, p)
        finally:
            self._confirming.discard(key)
        if why:
            wait = self.backoff.failed(key, token)
            log.warning("stage=evict cache=%s partition=%d kept: the map names %s as its owners, "
                        "but %s; asked again in %.1fs", cache, p, ",".join(owners), why, wait)
        else:
            self.backoff.succeeded(key)
            self._confirmed[key] = token
        self.ctx.map.dirty.add([key])
        self.ctx.wake()

    def evict(self, cache: str, p: int, why: str) -> bool:
        """RENTING -> EVICTED: the file is deleted once no transfer reads it (else the
        partition stays RENTING and the next reconcile tries again: False)."""
        if self.ctx.repl.in_use.count((cache, p)):
            log.info("stage=evict cache=%s partition=%d still being sent; eviction waits", cache, p)
            return False
        with self.ctx.plock(cache, p):
            crashpoint("owner.mid_eviction")
            try:
                self.ctx.data[cache].drop(p)
            except SnapshotBusyError:
                log.info("stage=evict cache=%s partition=%d still being sent; eviction waits", cache, p)
                return False
            self.ctx.states.set(cache, p, State.EVICTED, reason=why)
        log.info("stage=evict cache=%s partition=%d evicted: %s", cache, p, why)
        return True

    def _hand_off(self, cache: str, p: int, prim: str, token: Hashable = None) -> None:
        try:
            ok = self.movers.take_primary(cache, p, prim)
        except Exception:  # noqa: BLE001 - a worker's bug: logged, and the hand-off backs off
            ok = False
            log.exception("stage=handoff cache=%s partition=%d crashed", cache, p)
        if ok:
            self.backoff.succeeded((cache, p))
        else:
            wait = self.backoff.failed((cache, p), token)
            log.info("stage=handoff cache=%s partition=%d asked again in %.1fs (failure %d)",
                     cache, p, wait, self.backoff.failures((cache, p)))

    def _join_isr(self, cache: str, p: int, token: Hashable = None) -> None:
        key = (cache, p)
        ok = counted = False
        try:
            with self.ctx.map.lock:
                prim = self.ctx.map.map.parts[cache][p].primary
                addr = self.ctx.map.map.address(prim)
            if prim == self.ctx.id:
                ok = True
                return
            if addr is None:
                return
            # the controller keeps in the set only copies that report OWNING: the report
            # must be in etcd before the primary admits this copy
            self.control.put_report()
            r = self.ctx.pool.request(addr, JoinIsr(cache, p, self.ctx.id), timeout=10.0)
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
            ok = True
        except NodeError as e:
            counted = True
            log.info("stage=isr cache=%s partition=%d join failed (asked again in %.1fs): %s", cache, p,
                     self.backoff.failed(key, token), str(e)[:160])
        finally:
            if ok:
                self.backoff.succeeded(key)
            elif not counted:
                self.backoff.failed(key, token)     # no primary to ask yet
            self._isr_joins.discard(key)
            self.ctx.map.dirty.add([key])
            self.ctx.wake()


__all__ = ["Reconciler"]
