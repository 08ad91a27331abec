"""The rebalancer: starts and tracks the moves of partitions to this node (each one
run by the move engine, :mod:`node.move`, over the node's ports in
:mod:`node.filemove`), answers the primary's side of a move (``register``, and the
messages mode's ``demand`` / ``fetch`` / ``demand_done``) and hands the primary role
over.

A failure at any stage restarts the move from ``prepare``; a restart of the process
finds p MOVING and does the same. Old owners go RENTING -> EVICTED once every ideal
owner reports OWNING and they are not primary.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import uuid

from indexes import ScanPool
from transfer import Limits, SupplierServer

from .admission import Admission
from .config import NodeConfig
from .context import NodeContext
from .errors import NodeError, Unavailable
from .indexship import IndexShipper, live_docs
from .filemove import make_supplier_storage, node_move_engine, start_supplier
from .move import FETCH_BYTES, Move, MoveEngine, supply_batch  # noqa: F401  (public here too)
from .ports import Handlers, IsrControl, Leadership
from .rpcapi import Demanded, Fetched, Handoff, Holds, Registered, Unfence, Update
from .states import State

log = logging.getLogger("ferry.node.rebalance")
FENCE_SECONDS = 10.0           # a hand-off that is not confirmed in this time is undone


class Rebalancer:
    """Moves of partitions to this node (the demander side, through the move engine)
    and the primary's / supplier's side of moves to others."""

    def __init__(self, ctx: NodeContext, control: IsrControl, leader: Leadership) -> None:
        self.ctx = ctx
        self.control = control
        self.leader = leader
        cfg = ctx.cfg
        # index rebuilds of files moves scan in these processes (started on the first move)
        self.scan_pool = (ScanPool(cfg.index_workers, min_bytes=cfg.index_offload_min_bytes,
                                   when=cfg.index_offload) if cfg.index_workers > 0 else None)
        self.recv_limits = Limits(cfg.transfer_concurrency, cfg.transfer_rate_limit or None)
        self.send_limits: Limits | None = None
        self.supplier: SupplierServer | None = None
        # foreground protection sets the move limit, the receive limits and the replay
        # rate; the engine asks for the replay rate through its context's callable
        self.admission = Admission(ctx, self.recv_limits)
        # a move attempt replaces p's copy: the request ids it held describe other data
        self.engine = node_move_engine(ctx, self.recv_limits, self.scan_pool,
                                       replay_rate_limit=self.admission.replay_limit,
                                       replaced=leader.copy_replaced)
        # shipped indexes, supplier side: wants and exports (node/indexship.py)
        self.shipper = IndexShipper(ctx.id, sizer=self._file_size)
        # messages mode, primary side: session -> (entries at C, opened at)
        self.sessions: dict[str, tuple[list[tuple[bytes, bytes | None, int]], float]] = {}

    def handlers(self) -> Handlers:
        return {"demand": self.op_demand, "fetch": self.op_fetch, "demand_done": self.op_demand_done,
                "register": self.op_register, "handoff": self.op_handoff, "unfence": self.op_unfence,
                "ack_latency": self.admission.op_ack_latency, "admission": self.admission.status,
                "holds": self.op_holds, **self.shipper.handlers()}

    def start_supplier(self) -> str:
        """Serve this node's partition files; returns the address to advertise."""
        storage = make_supplier_storage(self.ctx.data, self.ctx.repl.in_use, self.can_supply,
                                        plock=self.ctx.plock, shipper=self.shipper)
        self.supplier, self.send_limits, address = start_supplier(self.ctx.cfg, self.ctx.secret, storage, self.ctx.tls)
        self.admission.start()          # (the node's start: its measurements begin too)
        return address

    def apply_limits(self, new: NodeConfig) -> None:
        """Transfer limits that change live (a cluster setting or the config file)."""
        if self.send_limits is not None:
            self.send_limits.set_rate(new.transfer_rate_limit or None)
            self.send_limits.set_max_transfers(new.transfer_concurrency)
        self.admission.config_changed(new)   # the receive side: the config, and the protection

    def stop(self) -> None:
        self.admission.stop()
        if self.supplier:
            self.supplier.stop()
        if self.scan_pool is not None:
            self.scan_pool.close()

    # -- demander -----------------------------------------------------------------
    def start_move(self, cache: str, p: int, why: str) -> bool:
        """Start pulling p unless it is already moving or the concurrency limit is
        reached (then the next reconcile tries again); True when started."""
        if self.ctx.events.stopping.is_set():
            return False          # a graceful stop: a pass in flight starts nothing new
        key = (cache, p)
        engine = self.engine
        # files mode: by default twice the transfer limit, so the index rebuild and
        # replay of some moves overlap the transfers of others; foreground protection
        # lowers it while writes slow down (node/admission.py)
        mv = self.ctx.moves.start(key, self.admission.admit,
                                  lambda: Move(cache, p, mode=self.ctx.cfg.rebalance_mode,
                                               on_stage=self._stage_done))
        if mv is None:
            return False
        self.admission.started()
        log.info("stage=prepare cache=%s partition=%d move starts: %s", cache, p, why)
        threading.Thread(target=self._run_move, args=(engine, mv), name=f"move-{cache}-{p}",
                         daemon=True).start()
        return True

    def request_resync(self, cache: str, p: int, why: str) -> None:
        """An OWNING copy that may be stale becomes MOVING and pulls p again."""
        self.ctx.states.set(cache, p, State.MOVING, reason=f"resync: {why}")
        self.ctx.wake()

    def _stage_done(self, stage: str, seconds: float) -> None:
        self.ctx.metrics.observe("ferry_node_move_stage_seconds", seconds, stage=stage)

    def _run_move(self, engine: MoveEngine, mv: Move) -> None:
        self.admission.nice_this_thread()
        try:
            if engine.run(mv):
                self.ctx.moves.done.append(mv.summary(self.ctx.id))
        except Exception:  # noqa: BLE001 - a move's bug: logged, and the move is cleaned up below
            log.exception("stage=%s cache=%s partition=%d move crashed", mv.stage, mv.cache, mv.p)
        finally:
            engine.finish(mv)
            with self.ctx.plock(mv.cache, mv.p):
                self.ctx.moves.end((mv.cache, mv.p))
            self.ctx.map.dirty.add([(mv.cache, mv.p)])     # what comes after the move
            self.ctx.wake()

    def buffer_update(self, mv: Move, cache: str, p: int, key: bytes, value: bytes | None,
                      counter: int, prev: int, durable: bool = True) -> str:
        """op_replicate for a MOVING copy (partition lock held): the engine's
        :meth:`~node.move.MoveEngine.buffer_update`."""
        return self.engine.buffer_update(mv, key, value, counter, prev, durable)

    def backpressure(self, mv: Move, records: int = 1) -> None:
        """After the partition lock is released: the engine's
        :meth:`~node.move.MoveEngine.backpressure` (a replay catches up with writes)."""
        self.engine.backpressure(mv, records)

    # -- primary / supplier ------------------------------------------------------------
    def op_register(self, cache: str, p: int, node: str, address: str,
                    epoch: int | None = None) -> Registered:
        """Primary: replicate p to ``node`` (a MOVING copy) from now on; returns the
        counter at registration (all earlier updates are replicated already)."""
        self.leader.require_serving()
        with self.ctx.plock(cache, p):
            self.leader.check_epoch(cache, p, epoch, node, demand=True)
            if not self.leader.leads(cache, p):
                raise self.leader.not_primary(cache, p)
            self.ctx.repl.copies.add((cache, p), node, address)
            return Registered(self.ctx.data[cache].counter(p))

    def op_holds(self, cache: str, p: int) -> Holds:
        """Which node this is and its copy of p: state and counter (a node asks before
        it evicts its own copy that the map gives to this one)."""
        st = self.ctx.states.get(cache, p)
        return Holds(node=self.ctx.id, state=st.value if st else None,
                     counter=self.ctx.data[cache].counter(p) if st == State.OWNING else 0)

    def _file_size(self, cache: str, p: int) -> tuple[int, int | None]:
        """(bytes of p's file, live entries of p) here: a want of ``index_transfer =
        auto`` is taken only below a size per entry."""
        store = self.ctx.data[cache].store
        try:
            size = os.path.getsize(store.partition_path(p))
        except OSError:
            return 0, None
        return size, live_docs(store, p)

    def can_supply(self, cache: str, p: int) -> str | None:
        """None when this node may send p's file; else why not."""
        if self.ctx.states.get(cache, p) != State.OWNING:
            return f"{self.ctx.id} does not own {cache}/{p} ({self.ctx.states.get(cache, p)})"
        if self.ctx.id not in self.ctx.map.record(cache, p).isr:
            return f"{self.ctx.id}'s copy of {cache}/{p} is not in sync (not confirmed by the primary)"
        if (cache, p) in self.ctx.returning:
            return f"{self.ctx.id}'s copy of {cache}/{p} is not confirmed current since its restart"
        return None

    # -- supplier -----------------------------------------------------------------
    def op_demand(self, cache: str, p: int, node: str, address: str,
                  epoch: int | None = None) -> Demanded:
        self.leader.require_serving()
        data = self.ctx.data[cache]
        with self.ctx.plock(cache, p):
            self.leader.check_epoch(cache, p, epoch, node, demand=True)
            if not self.leader.leads(cache, p):
                raise self.leader.not_primary(cache, p)
            self.ctx.repl.copies.add((cache, p), node, address)
            C = data.counter(p)
            entries = sorted(data.entries(p), key=lambda e: e[2])
        sid = uuid.uuid4().hex
        total = sum(len(k) + (len(v) if v else 0) for k, v, _ in entries)
        self.sessions[sid] = (entries, time.monotonic())
        log.info("stage=supply cache=%s partition=%d to %s: %d entries, %d bytes at counter %d",
                 cache, p, node, len(entries), total, C)
        return Demanded(session=sid, counter=C, count=len(entries), bytes=total)

    def op_fetch(self, session: str, offset: int, max_bytes: int | None = None) -> Fetched:
        if max_bytes is None:
            max_bytes = FETCH_BYTES
        got = self.sessions.get(session)
        if got is None:
            raise Unavailable(f"no transfer session {session} on {self.ctx.id} (restarted?)")
        entries, size = got[0], 0
        out: list[Update] = []
        i = offset
        while i < len(entries) and (size < max_bytes or not out):
            k, v, c = entries[i]
            out.append((k, v, c))
            size += len(k) + (len(v) if v else 0) + 16
            i += 1
        return Fetched(entries=tuple(out), next=i, done=i >= len(entries))

    def op_demand_done(self, session: str) -> bool:
        return self.sessions.pop(session, None) is not None

    # -- hand-off of the primary role ---------------------------------------------
    def op_handoff(self, cache: str, p: int, to: str) -> int:
        """Fence p (stop taking writes) so ``to`` can become primary; returns the counter."""
        with self.ctx.plock(cache, p):
            if not self.leader.leads(cache, p):
                raise self.leader.not_primary(cache, p)
            self.ctx.repl.fenced.set((cache, p), time.monotonic() + FENCE_SECONDS)
            return self.ctx.data[cache].counter(p)

    def op_unfence(self, cache: str, p: int) -> bool:
        return self.ctx.repl.fenced.lift((cache, p))

    def take_primary(self, cache: str, p: int, prim: str) -> bool:
        """Take p's primary role from ``prim`` (fence, compare counters, the controller's
        hand-off). True when this node leads p now; False when it did not happen (the
        reason is logged; the reconcile loop asks again later, backing off)."""
        got = self.ctx.map.address(prim)
        ok = False
        try:
            if got is None:
                raise Unavailable(f"{prim} is not a live member")
            addr = got
            theirs = self.ctx.pool.request(addr, Handoff(cache, p, self.ctx.id))
            with self.ctx.plock(cache, p):
                mine = self.ctx.data[cache].counter(p)
            if mine == theirs:
                try:
                    self.control.request(cache, p, {"op": "set_primary", "previous": prim},
                                 lambda r: r.primary == self.ctx.id)
                    ok = True
                except NodeError as e:
                    log.info("stage=handoff cache=%s partition=%d refused: %s", cache, p, e)
            if not ok:
                self.ctx.pool.request(addr, Unfence(cache, p))
                log.info("stage=handoff cache=%s partition=%d not taken (counter %d vs %d)",
                         cache, p, mine, theirs)
        except NodeError as e:
            log.info("stage=handoff cache=%s partition=%d from %s failed: %s", cache, p, prim, e)
        finally:
            self.ctx.repl.handoffs.end((cache, p))
            self.ctx.map.dirty.add([(cache, p)])
        return ok
