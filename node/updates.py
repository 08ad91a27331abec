"""The replicated update path (the primary's side; the backups' is :mod:`node.backup`)
and reads.

A put/remove reaches the primary of its partition, which, holding the partition lock:

1. checks it may lead: the map names it primary, p is OWNING here, no hand-off fence,
   and its control-plane lease is valid (:meth:`node.control.Session.valid`), and the
   in-sync set has at least ``min_in_sync`` copies;
2. gives it the next partition update counter and logs + applies it (data and
   indexes) through ``PartitionStore.put/remove``, durable per ``wal.sync`` on return;
3. sends ``replicate(counter, prev, epoch)`` to every copy: the in-sync set (ISR),
   the nodes the map shows OWNING or MOVING, and the MOVING copies registered by a
   DEMAND (so no update after the snapshot counter is missed);
4. acknowledges ("ok" to the client) only when every in-sync copy answered
   ``applied`` (it applied the update durably, in counter order). An in-sync copy that
   failed is first removed from the ISR through the controller (a compare-and-swap in
   etcd that bumps the partition epoch); only then, and only with ``min_in_sync``
   copies left, is the write acknowledged. A primary cut off from the controller or
   etcd cannot remove anyone, so it cannot acknowledge alone. A MOVING copy answers
   ``buffered``; a copy whose counter does not follow ``prev`` answers ``resync`` and
   re-pulls the partition; a copy that knows a newer epoch refuses (``stale_epoch``).

The partition lock keeps counters and replication in order, so a backup applies
updates exactly in the primary's order.

Reads (``get``) are linearizable by default: the primary serves one only while it may
take writes (the same check: map, OWNING, no fence, lease valid, no copy has shown it
a newer term), checked again after the value was read, and returns only acknowledged
updates (:mod:`node.visible`: a key with an update in flight or not acknowledged reads
as its last acknowledged value). A new primary, and a primary under a new lease,
confirms its copy with the in-sync copies (an empty ``replicate_batch``) before its
first read. ``consistency="stale"`` reads whatever an OWNING copy holds.

Every client write carries a request id (:mod:`node.dedup`); a retry of one already
applied is answered with its first outcome, never applied again. An error raised after
the update reached the primary's store says ``unknown`` (it may be applied); before,
``refused``.
"""
from __future__ import annotations

import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, Sequence

from .assignment import partition_of
from .backup import Backup, Update
from .context import NodeContext, PartKey
from .dedup import RequestId, Requests
from .ports import Handlers, IsrControl, MoveActions
from .rpcapi import LINEARIZABLE, MAX_BATCH, STALE, Replicate, ReplicateAnswer, ReplicateBatch
from .storage import CacheData
from .errors import BadRequest, NodeError, NotPrimary, OutcomeUnknown, StaleEpoch, TooLarge, Unavailable
from .states import State
from .visible import Tenure, Visibility

log = logging.getLogger("ferry.node.updates")
REPLICATE_TIMEOUT = 5.0
HANDOFF_WAIT_S = 1.0       # a write to a partition being handed off waits this long for the outcome
FANOUT_THREADS = 16        # replicate calls in flight at once beyond each writer's own


class UpdatePath:
    """The primary's and the backups' side of every update, and reads. ``control``
    changes in-sync sets; ``movers`` takes the updates of a partition MOVING here."""

    def __init__(self, ctx: NodeContext, control: IsrControl) -> None:
        self.ctx = ctx
        self.control = control
        self.movers: MoveActions | None = None     # bound once the rebalancer exists
        # admissions whose outcome is unknown (op_join_isr): p -> (request key, revision
        # of its put); the copy stays in repl.admissions until the map shows the outcome
        self._limbo: dict[PartKey, tuple[str, int]] = {}
        # replication fan-out (_fan_out); its threads start on first use
        self._pool = ThreadPoolExecutor(max_workers=FANOUT_THREADS, thread_name_prefix="ferry-replicate")
        self.visible = Visibility()       # what reads of a primary may see
        self.requests = Requests()        # applied request ids, per partition
        self.backup = Backup(ctx, self.visible, self.requests, self._movers)

    def bind(self, movers: MoveActions) -> None:
        self.movers = movers

    def _movers(self) -> MoveActions:
        if self.movers is None:
            raise Unavailable(f"node {self.ctx.id} is starting")
        return self.movers

    def handlers(self) -> Handlers:
        return {"put": self.op_put, "put_batch": self.op_put_batch, "get": self.op_get,
                "remove": self.op_remove, "lookup": self.op_lookup, "range": self.op_range,
                "replicate": self.backup.op_replicate, "replicate_batch": self.backup.op_replicate_batch,
                "join_isr": self.op_join_isr}

    # -- helpers ------------------------------------------------------------------
    def _locate(self, cache: str, key: bytes) -> tuple[CacheData, int, bytes]:
        """(the request's types are checked by its decoder, node/rpcapi.py) The cache's
        data and the key's partition; BadRequest or TooLarge for a key out of limits."""
        if cache not in self.ctx.data:
            raise BadRequest(f"unknown cache {cache!r}; caches: {', '.join(self.ctx.data)}")
        if not key:
            raise BadRequest("key must not be empty")
        if len(key) > self.ctx.cfg.max_key_bytes:
            raise TooLarge(f"key of {len(key)} bytes exceeds the limit of {self.ctx.cfg.max_key_bytes} bytes")
        return self.ctx.data[cache], partition_of(key, self.ctx.data[cache].cache.partitions), key

    def leads(self, cache: str, p: int, *, write: bool = True) -> bool:
        """Primary of p now. For a write (and a linearizable read) also: the lease is
        valid (the fence), no hand-off or validation fence is up, and no copy has shown
        this node a newer primary term. ``write=False`` (the index queries): an OWNING
        primary, whatever its lease."""
        if not write:
            with self.ctx.map.lock:
                prim = self.ctx.map.map.parts[cache][p].primary
            return prim == self.ctx.id and self.ctx.states.get(cache, p) == State.OWNING \
                and (cache, p) not in self.ctx.returning
        return self.tenure(cache, p) is not None

    def tenure(self, cache: str, p: int) -> Tenure | None:
        """(p's primary term, this node's lease) when this node may lead p now (see
        :meth:`leads`), else None. The lease is part of it: a node whose lease ended
        and that registered again may have been deposed meanwhile, before its map
        shows it (:mod:`node.visible`: it confirms again)."""
        # No map lock: a record is never changed, only replaced whole (node/mapview.py),
        # and taking one out of its list is atomic. Every read takes this twice, and the
        # lock is the one the watch thread and every writer take too.
        rec = self.ctx.map.map.parts[cache][p]
        prim, term = rec.primary, rec.term
        if prim != self.ctx.id:
            return None
        until = self.ctx.repl.fenced.until((cache, p))
        if until is not None and time.monotonic() < until:
            return None
        s = self.ctx.session
        lease = s.lease if s is not None else 0
        if s is None or not s.valid():
            return None
        if self.backup.newer_term(cache, p) > term:
            return None         # a new primary's update reached this node before its map
        if (cache, p) in self.ctx.returning:
            return None         # not confirmed current since this process started
        return (term, lease) if self.ctx.states.get(cache, p) == State.OWNING else None

    def not_primary(self, cache: str, p: int) -> NodeError:
        with self.ctx.map.lock:
            rec = self.ctx.map.map.parts[cache][p]
            prim, term = rec.primary, rec.term
            hint = self.ctx.map.map.address(prim) if prim != self.ctx.id else None
        if prim == self.ctx.id and self.ctx.states.get(cache, p) == State.OWNING:
            if not self.ctx.lease_valid():
                return Unavailable(f"node {self.ctx.id} is the primary of {cache}/{p} in its map, but its "
                                   "control-plane lease is not valid (etcd unreachable?): not serving "
                                   "reads or writes of it. Retry on another node: once this lease has "
                                   "ended in etcd, the map names a new primary")
            newer = self.backup.newer_term(cache, p)
            if newer > term:
                return NotPrimary(f"node {self.ctx.id} was sent updates of {cache}/{p} in primary term "
                                  f"{newer} (its map: {term}): another node leads it; refresh the map")
        return NotPrimary(f"node {self.ctx.id} is not the primary of {cache}/{p} (map epoch "
                          f"{self.ctx.map.map.epoch}); primary: {prim or 'none'}", hint)

    def require_serving(self) -> None:
        if not self.ctx.events.joined.is_set() or self.ctx.events.stopping.is_set():
            raise Unavailable(f"node {self.ctx.id} is {'stopping' if self.ctx.events.stopping.is_set() else 'joining'}")

    # -- client operations --------------------------------------------------------
    def op_put(self, cache: str, key: bytes, value: bytes, rid: object = None) -> int:
        if len(value) > self.ctx.cfg.max_value_bytes:
            raise TooLarge(f"value of {len(value)} bytes exceeds the limit of {self.ctx.cfg.max_value_bytes} bytes")
        return self._write(cache, key, value, rid)

    def op_remove(self, cache: str, key: bytes, rid: object = None) -> int:
        return self._write(cache, key, None, rid)

    @contextlib.contextmanager
    def _leading(self, cache: str, p: int) -> Iterator[Tenure]:
        """Hold p's lock as its primary (yields the tenure: :meth:`tenure`): refused before
        waiting for the lock (cheap redirect) and again under it. A hand-off's fence,
        met before the lock or set while this write queued for it (``op_handoff``
        queues on the same lock), is waited out once, outside the lock
        (:meth:`_await_handoff`)."""
        lock = self.ctx.plock(cache, p)
        term: Tenure | None = None
        for last in (False, True):
            if not self.leads(cache, p):
                self._await_handoff(cache, p)
                if not self.leads(cache, p):
                    raise self.not_primary(cache, p)
            lock.acquire()
            term = self.tenure(cache, p)
            if term is not None:
                break
            lock.release()
            if last or (cache, p) not in self.ctx.repl.fenced:
                raise self.not_primary(cache, p)
        assert term is not None
        try:
            with self.ctx.map.lock:
                n_isr = len(self.ctx.map.map.parts[cache][p].isr)
            if n_isr < self.ctx.cfg.min_in_sync:
                raise Unavailable(f"{cache}/{p} has {n_isr} in-sync cop{'y' if n_isr == 1 else 'ies'}, "
                                  f"fewer than cluster.min_in_sync = {self.ctx.cfg.min_in_sync}: writes "
                                  "refused until a copy catches up")
            yield term
        finally:
            lock.release()

    def _await_handoff(self, cache: str, p: int) -> None:
        """p is fenced for a hand-off of the primary role (:meth:`Rebalancer.op_handoff`):
        wait for its outcome, up to HANDOFF_WAIT_S, instead of sending the writer away
        to back off and ask again. The new primary shows in the map (the fence goes with
        it, and the writer is redirected there at once), or the fence is lifted (this
        node goes on leading). Outside p's lock: the hand-off itself needs it."""
        key = (cache, p)
        deadline = time.monotonic() + HANDOFF_WAIT_S
        with self.ctx.map.changed:
            while True:
                until = self.ctx.repl.fenced.until(key)
                now = time.monotonic()
                if until is None or now >= min(until, deadline):
                    return
                # the map's change notifies; an unfence does not: look again soon
                self.ctx.map.changed.wait(0.01)

    def _applied_before(self, cache: str, p: int, rid: RequestId | None, term: Tenure) -> list[int] | None:
        """(p's lock held, as primary) The counters a write with this request id got
        when it was applied, once that update is acknowledged (confirmed now if it is
        not: it is on this copy, and an earlier attempt may have failed after it
        reached the store); None when it was never applied. Superseded for a late copy
        of a request the client gave up on."""
        if rid is None:
            return None
        got = self.requests.table(cache, p).seen(rid)
        if got is None:
            return None
        if not self.visible.acknowledged(cache, p, got[1], term):
            try:
                self._confirm(cache, p, term)
            except NodeError as e:
                raise e.maybe_applied()
        return list(got)

    def _acknowledge(self, cache: str, p: int, ups: list[Update], prev: int, rid: RequestId | None,
                     term: Tenure) -> None:
        """(p's lock held) Updates now in this node's store: replicate them, then make
        them visible to reads. An error from here on may leave them applied: unknown."""
        self.requests.record(cache, p, rid, ups[0][2], ups[-1][2])
        try:
            self._replicate_many(cache, p, ups, prev, rid)
        except NodeError as e:
            raise e.maybe_applied()
        self.visible.release(cache, p, term, ups[-1][2])

    def _write(self, cache: str, key: bytes, value: bytes | None, rid: object = None) -> int:
        self.require_serving()
        data, p, key = self._locate(cache, key)
        req = RequestId.parse(rid)
        t0 = time.monotonic()
        with self._leading(cache, p) as term:
            done = self._applied_before(cache, p, req, term)
            if done is not None:
                return done[0]
            prev = data.counter(p)
            self.visible.hold(cache, p, data, (key,))
            counter = data.put(p, key, value)
            self._acknowledge(cache, p, [(key, value, counter)], prev, req, term)
        self.ctx.metrics.inc("ferry_node_updates_total", cache=cache, op="put" if value is not None else "remove")
        dt = time.monotonic() - t0
        self.ctx.metrics.observe("ferry_node_update_seconds", dt)
        self.ctx.metrics.acks.add(dt)          # foreground protection (node/admission.py)
        return counter

    def op_put_batch(self, cache: str, key: bytes, items: Sequence[tuple[bytes, bytes]],
                     rid: object = None) -> list[int]:
        """Bulk load: many puts of ONE partition (``key`` routes; every item must map to
        the same partition) in one request, replicated in one request per copy. Each
        item gets its own counter; acknowledged as a whole (if not, some items may be
        applied: put them again). Returns [first counter, last counter]."""
        self.require_serving()
        data, p, key = self._locate(cache, key)
        req = RequestId.parse(rid)
        if not 0 < len(items) <= MAX_BATCH:
            raise BadRequest(f"items must be a list of 1..{MAX_BATCH} [key, value] pairs")
        batch = []
        for i, (k0, v) in enumerate(items):
            _, q, k = self._locate(cache, k0)
            if len(v) > self.ctx.cfg.max_value_bytes:
                raise TooLarge(f"items[{i}]: value of {len(v)} bytes exceeds the limit of "
                               f"{self.ctx.cfg.max_value_bytes} bytes")
            if q != p:
                raise BadRequest(f"items[{i}] belongs to partition {q}, not {p}: one partition per batch")
            batch.append((k, v))
        t0 = time.monotonic()
        with self._leading(cache, p) as term:
            done = self._applied_before(cache, p, req, term)
            if done is not None:
                return done
            prev = data.counter(p)
            self.visible.hold(cache, p, data, (k for k, _ in batch))
            ups: list[Update] = [(k, v, c) for (k, v), c in zip(batch, data.put_many(p, batch))]
            self._acknowledge(cache, p, ups, prev, req, term)
        self.ctx.metrics.inc("ferry_node_updates_total", len(ups), cache=cache, op="put")
        dt = time.monotonic() - t0
        self.ctx.metrics.observe("ferry_node_update_seconds", dt)
        self.ctx.metrics.acks.add(dt)
        return [ups[0][2], ups[-1][2]]

    def op_get(self, cache: str, key: bytes, consistency: str = LINEARIZABLE) -> bytes | None:
        """``linearizable`` (default): only the primary, only while it may take writes
        (checked before and again after the value is read: a lease that ran out, a
        fence or a newer term meanwhile fails the read), only acknowledged updates.
        ``stale``: any OWNING copy, what it holds (docs/node.md, "Reads")."""
        self.require_serving()
        data, p, key = self._locate(cache, key)
        if consistency == STALE:
            if self.ctx.states.get(cache, p) != State.OWNING:
                raise Unavailable(f"node {self.ctx.id} holds no OWNING copy of {cache}/{p}; ask another owner")
            return self.visible.read(cache, p, data, key)
        term = self._read_tenure(cache, p)
        value = self.visible.read(cache, p, data, key)
        if self.tenure(cache, p) != term:
            # the lease ran out (or was renewed under another id), a fence or a newer
            # term came while the value was read: a successor may already exist
            raise self.not_primary(cache, p)
        return value

    def _read_tenure(self, cache: str, p: int) -> Tenure:
        """The tenure in which this node may serve a linearizable read of p: it leads p
        (a fence is waited out as for a write) and its copy is confirmed in it."""
        term = self.tenure(cache, p)
        if term is None:
            self._await_handoff(cache, p)
            term = self.tenure(cache, p)
            if term is None:
                raise self.not_primary(cache, p)
        if self.visible.confirmed(cache, p) == term:
            return term
        with self.ctx.plock(cache, p):
            term = self.tenure(cache, p)
            if term is None:
                raise self.not_primary(cache, p)
            if self.visible.confirmed(cache, p) != term:
                self._confirm(cache, p, term)
        return term

    def _confirm(self, cache: str, p: int, term: Tenure) -> None:
        """(p's lock held) Make sure every in-sync copy holds exactly this node's copy of
        p: an empty replicate at p's counter to each (a copy whose counter differs
        answers ``resync``, and is taken out of the in-sync set like a copy that failed
        a write). Then everything in this copy is acknowledged."""
        counter = self.ctx.data[cache].counter(p)
        self._replicate_many(cache, p, [], counter, None)
        self.visible.release(cache, p, term, counter)
        log.info("stage=replicate cache=%s partition=%d confirmed counter %d with the in-sync copies "
                 "(primary term %d, lease %x)", cache, p, counter, term[0], term[1])

    def _led_filter(self, cache: str, keys: list[bytes]) -> list[bytes]:
        parts = self.ctx.data[cache].cache.partitions
        return [k for k in keys if self.leads(cache, partition_of(k, parts), write=False)]

    def op_lookup(self, cache: str, index: str, value: object) -> list[bytes]:
        """Keys whose document has ``index`` == value, among partitions this node leads
        (the client asks every node and merges). Not linearizable: an OWNING primary
        answers whatever its lease, from its indexes (an update in flight included)."""
        self.require_serving()
        self._check_index(cache, index)
        return self._led_filter(cache, self.ctx.data[cache].lookup(index, value, self._led(cache)))

    def op_range(self, cache: str, index: str, lo: object, hi: object,
                 limit: int | None = None) -> list[list[object]]:
        self.require_serving()
        self._check_index(cache, index)
        parts = self.ctx.data[cache].cache.partitions
        led = self._led(cache)
        # only the partitions this node leads are read, and the scan stops at the limit
        rows = self.ctx.data[cache].range(index, lo, hi, limit or None, partitions=led)
        out = [list(r) for r in rows if self.leads(cache, partition_of(r[-1], parts), write=False)]
        return out[:limit] if limit else out

    def _led(self, cache: str) -> list[int]:
        """The partitions of ``cache`` this node leads now, each with an index that
        matches its data: one start-up did not trust (an unclean stop) is rebuilt
        first, under p's lock, as a write would."""
        me = self.ctx.id
        with self.ctx.map.lock:
            recs = self.ctx.map.map.parts[cache]
            mine = [p for p, r in enumerate(recs) if r.primary == me]
        led = [p for p in mine if self.leads(cache, p, write=False)]
        data = self.ctx.data[cache]
        for p in led:
            if not data.index_current(p):
                with self.ctx.plock(cache, p):
                    data.catch_up_index(p)
        return led

    def _check_index(self, cache: str, index: str) -> None:
        if index not in {i.name for i in self.ctx.data[cache].cache.indexes}:
            raise BadRequest(f"cache {cache} has no index {index!r}")

    # -- replication --------------------------------------------------------------
    def _targets(self, cache: str, p: int) -> tuple[dict[str, str | None], set[str], int]:
        """Every copy to send to, the in-sync ones among them, and p's epoch."""
        with self.ctx.map.lock:
            rec = self.ctx.map.map.parts[cache][p]
            out = {n: self.ctx.map.map.address(n) for n in self.ctx.map.map.holders(cache, p, State.OWNING, State.MOVING)}
            for n in rec.isr:
                out[n] = self.ctx.map.map.address(n)
            isr = set(rec.isr) - {self.ctx.id}
            epoch = rec.term
        out.update(self.ctx.repl.copies.of((cache, p)))
        out.pop(self.ctx.id, None)
        return {n: a for n, a in out.items() if a or n in isr}, isr, epoch

    def _send(self, addr: str | None, node: str, cache: str, p: int, ups: list[Update], prev: int,
              epoch: int, rid: RequestId | None) -> ReplicateAnswer | NodeError:
        """One copy's replicate call: its answer, or the NodeError it raised. No
        update: a confirmation (``replicate_batch`` of nothing at ``prev``)."""
        try:
            if addr is None:
                raise Unavailable(f"{node} is not a live member")
            if len(ups) == 1:
                key, value, counter = ups[0]
                return self.ctx.pool.request(addr, Replicate(cache, p, key, value, counter, prev, self.ctx.id,
                                                             epoch, rid), timeout=REPLICATE_TIMEOUT)
            return self.ctx.pool.request(addr, ReplicateBatch(cache, p, tuple(ups), prev, self.ctx.id, epoch, rid),
                                         timeout=REPLICATE_TIMEOUT * 4)
        except NodeError as e:
            return e

    def _fan_out(self, targets: dict[str, str | None], cache: str, p: int, ups: list[Update], prev: int,
                 epoch: int, rid: RequestId | None) -> dict[str, ReplicateAnswer | NodeError]:
        """Every copy's answer. With more than one copy (a move in progress: the backup
        and the MOVING or new copy) the calls go out at once, so a write waits for the
        slowest copy rather than for the sum of them; p's lock is held throughout, so
        each copy still sees p's updates one at a time, in counter order."""
        items = list(targets.items())
        if len(items) <= 1:
            return {n: self._send(a, n, cache, p, ups, prev, epoch, rid) for n, a in items}
        futs = {n: self._pool.submit(self._send, a, n, cache, p, ups, prev, epoch, rid)
                for n, a in items[1:]}
        out = {items[0][0]: self._send(items[0][1], items[0][0], cache, p, ups, prev, epoch, rid)}
        for n, f in futs.items():
            out[n] = f.result()
        return out

    def stop(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _replicate_many(self, cache: str, p: int, ups: list[Update], prev: int,
                        rid: RequestId | None = None) -> None:
        """(p's lock held) Send ``ups`` (applied here, after counter ``prev``) to every
        copy; return once every in-sync copy applied them, else raise Unavailable (NOT
        acknowledged). No update: a confirmation, sent to the in-sync copies only."""
        if self._limbo:
            self._settle_limbo(cache, p)
        targets, isr, epoch = self._targets(cache, p)
        admitting = self.ctx.repl.admissions.admitting((cache, p))
        if admitting is not None:
            isr.add(admitting)             # counts as in sync while it is admitted
        if not ups:
            targets = {n: a for n, a in targets.items() if n in isr}
        failed: dict[str, str] = {}
        stale: str | None = None
        for node, r in self._fan_out(targets, cache, p, ups, prev, epoch, rid).items():
            if isinstance(r, NodeError):
                if node in isr:
                    failed[node] = str(r)
                    if r.code == StaleEpoch.code:
                        stale = f"{node}: {r}"
                else:  # a MOVING copy that missed an update restarts its move (gap check)
                    self.ctx.repl.copies.discard((cache, p), node)
                continue
            if r != "applied" and node in isr:
                failed[node] = f"answered {r!r}"
            if r in ("absent", "resync"):
                self.ctx.repl.copies.discard((cache, p), node)
        if stale is None and not failed:
            return
        what = (f"update(s) {cache}/{p}#{ups[0][2]}..{ups[-1][2]}" if ups
                else f"confirmation of {cache}/{p} at #{prev}")
        if stale is not None:
            # a copy knows a newer epoch: this node may be deposed; never ack
            raise Unavailable(f"{what} refused by {stale}; NOT acknowledged")
        if failed:
            self.ctx.metrics.inc("ferry_node_replication_failures_total", cache=cache)
            durable = "are durable" if ups else "is the copy"
            if admitting is not None:
                # an admission's round trip is in flight (op_join_isr): no second change
                # of the in-sync set now; the copy being admitted is taken out after it
                if admitting in failed:
                    self.ctx.repl.admissions.spoil((cache, p))
                raise Unavailable(f"{what} {durable} on {self.ctx.id} but not on "
                                  f"{', '.join(f'{n} ({w})' for n, w in failed.items())} while "
                                  f"{admitting} joins the in-sync set: NOT acknowledged, retry")
            try:
                rec = self.control.alter_isr(cache, p, remove=sorted(failed))
            except NodeError as e:
                raise Unavailable(f"{what} {durable} on {self.ctx.id} but not on "
                                  f"{', '.join(f'{n} ({w})' for n, w in failed.items())}, and the "
                                  f"in-sync set could not shrink ({e}): NOT acknowledged, retry") from None
            log.warning("stage=replicate cache=%s partition=%d removed %s from the in-sync set "
                        "(epoch %d): %s", cache, p, ", ".join(sorted(failed)), rec.epoch,
                        "; ".join(f"{n}: {w}" for n, w in failed.items()))
            if len(rec.isr) < self.ctx.cfg.min_in_sync and ups:
                raise Unavailable(f"{what} are durable on {', '.join(rec.isr)} only, fewer than "
                                  f"cluster.min_in_sync = {self.ctx.cfg.min_in_sync}: NOT acknowledged")

    def op_join_isr(self, cache: str, p: int, node: str) -> str:
        """A copy that finished its move asks to count: admitted when it has been a
        registered copy of this primary since its DEMAND (every update since then was
        replicated to it, or it would have been dropped); otherwise "resync".

        The controller's round trip (etcd put, the controller's compare-and-swap, the
        watch back: tens of ms, more under load) runs WITHOUT p's lock, so writes of p
        go on meanwhile. For those writes the copy counts as in sync already
        (``repl.admissions``): a write it fails to apply is not acknowledged and spoils
        the admission, which then takes the copy out again and answers "resync". So
        from the moment the controller may have admitted it, the copy holds every
        acknowledged update, as if the lock had been held throughout."""
        self.require_serving()
        key = (cache, p)
        with self.ctx.plock(cache, p):
            if not self.leads(cache, p):
                raise self.not_primary(cache, p)
            self._settle_limbo(cache, p)
            rec = self.ctx.map.record(cache, p)
            if node in rec.isr:
                return "ok"
            if not self.ctx.repl.copies.has(key, node):
                return "resync"
            busy = self.ctx.repl.admissions.begin(key, node)
            if busy is not None:
                raise Unavailable(f"{cache}/{p}: a change of the in-sync set is in progress "
                                  f"({busy}); ask again")
        try:
            self.control.alter_isr(cache, p, add=[node])
        except OutcomeUnknown as e:
            # the controller may still admit it: it keeps counting as in sync (a write
            # it fails is not acknowledged, and spoils the admission) until the map
            # shows the outcome (_settle_limbo)
            with self.ctx.plock(cache, p):
                self._limbo[key] = (e.key, e.rev)
            log.warning("stage=isr cache=%s partition=%d admission of %s: outcome unknown (%s); "
                        "it counts as in sync until the map shows the outcome", cache, p, node,
                        str(e)[:160])
            raise
        except BaseException:
            with self.ctx.plock(cache, p):
                self._end_admission(cache, p, node, admitted=False)
            raise
        with self.ctx.plock(cache, p):
            return self._end_admission(cache, p, node, admitted=True)

    def _settle_limbo(self, cache: str, p: int) -> None:
        """(p's lock held) End an admission whose outcome was unknown (op_join_isr got
        OutcomeUnknown) once the map shows it: the map is at or past the request's put
        and the request is gone (applied, refused, withdrawn or dropped with the lease;
        the controller applies a request only as it read it, so a gone one never is).
        The record then says whether the copy was admitted; it ends as any admission
        (_end_admission). Until then the copy stays in repl.admissions."""
        key = (cache, p)
        pending = self._limbo.get(key)
        if pending is None:
            return
        req, rev = pending
        with self.ctx.map.lock:
            if not self.ctx.map.answered(req, rev):
                return
            rec = self.ctx.map.map.parts[cache][p]
        del self._limbo[key]
        node = self.ctx.repl.admissions.admitting(key)
        if node is None:
            return
        admitted = node in rec.isr
        log.info("stage=isr cache=%s partition=%d admission of %s settled: %s (epoch %d)", cache, p,
                 node, "admitted" if admitted else "not admitted", rec.epoch)
        self._end_admission(cache, p, node, admitted=admitted)

    def _end_admission(self, cache: str, p: int, node: str, admitted: bool) -> str:
        """(p's lock held) The admission of ``node`` is over: an admitted copy is no
        longer a registered one; a spoiled one (a write to it failed meanwhile, not
        acknowledged) is taken out of the in-sync set again. A refused or unanswered
        admission leaves the copy registered (it asks again)."""
        key = (cache, p)
        spoiled = self.ctx.repl.admissions.take_spoiled(key)
        if admitted or spoiled:
            self.ctx.repl.copies.discard(key, node)
        try:
            if spoiled and node in self.ctx.map.record(cache, p).isr:
                self.control.alter_isr(cache, p, remove=[node])
        finally:
            self.ctx.repl.admissions.end(key)
        return "resync" if spoiled else "ok"

    def copy_replaced(self, cache: str, p: int) -> None:
        """(p's lock held) A move attempt begins to replace this node's copy of p: the
        request ids recorded for it (an earlier attempt's buffered updates, the copy it
        had before) describe data the new copy may not hold, so none may answer a
        retry: an attempt that starts over from a new primary would otherwise keep the
        ids of updates the old primary never got acknowledged, and answer a retry of
        one "applied" at a counter the new history gave to another write."""
        self.requests.forget(cache, p)

    def check_epoch(self, cache: str, p: int, epoch: int | None, sender: str, *,
                    demand: bool = False) -> None:
        """The copy's epoch check of a replication or DEMAND (:meth:`Backup.check_epoch`)."""
        self.backup.check_epoch(cache, p, epoch, sender, demand=demand)
