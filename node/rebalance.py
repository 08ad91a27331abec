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
import threading
import time
import uuid

from .errors import NodeError, Unavailable
from .filemove import NodeView, node_move_engine
from .move import FETCH_BYTES, Move, MoveEngine, supply_batch  # noqa: F401  (public here too)
from .states import State

log = logging.getLogger("ferry.node.rebalance")
FENCE_SECONDS = 10.0           # a hand-off that is not confirmed in this time is undone


class Rebalancer:
    # -- demander -----------------------------------------------------------------
    def _engine(self) -> MoveEngine:
        eng: MoveEngine | None = self.__dict__.get("_move_engine")
        if eng is None:
            view: NodeView = self  # type: ignore[assignment]   # the node provides the view
            eng = self.__dict__["_move_engine"] = node_move_engine(view)
        return eng

    def start_move(self, cache: str, p: int, why: str) -> bool:
        """Start pulling p unless it is already moving or the concurrency limit is
        reached (then the next reconcile tries again); True when started."""
        key = (cache, p)
        engine = self._engine()
        with self.moves_lock:
            # files mode: twice the transfer limit, so the index rebuild and replay of
            # some moves overlap the transfers of others (transfers are limited anyway)
            limit = self.cfg.transfer_concurrency * (2 if self.cfg.rebalance_mode == "files" else 1)
            if key in self.moves or len(self.moves) >= limit:
                return False
            mv = Move(cache, p, mode=self.cfg.rebalance_mode, on_stage=self._stage_done)
            self.moves[key] = mv
        log.info("stage=prepare cache=%s partition=%d move starts: %s", cache, p, why)
        threading.Thread(target=self._run_move, args=(engine, mv), name=f"move-{cache}-{p}",
                         daemon=True).start()
        return True

    def request_resync(self, cache: str, p: int, why: str) -> None:
        """An OWNING copy that may be stale becomes MOVING and pulls p again."""
        self.states.set(cache, p, State.MOVING, reason=f"resync: {why}")
        self.wake()

    def _stage_done(self, stage: str, seconds: float) -> None:
        self.metrics.observe("ferry_node_move_stage_seconds", seconds, stage=stage)

    def _run_move(self, engine: MoveEngine, mv: Move) -> None:
        try:
            if engine.run(mv):
                self.moves_done.append(mv.summary(self.id))
        except Exception:
            log.exception("stage=%s cache=%s partition=%d move crashed", mv.stage, mv.cache, mv.p)
        finally:
            engine.finish(mv)
            with self.plock(mv.cache, mv.p):
                with self.moves_lock:
                    self.moves.pop((mv.cache, mv.p), None)
            self.wake()

    def buffer_update(self, mv: Move, cache: str, p: int, key: bytes, value: bytes | None,
                      counter: int, prev: int, durable: bool = True) -> str:
        """op_replicate for a MOVING copy (partition lock held): the engine's
        :meth:`~node.move.MoveEngine.buffer_update`."""
        return self._engine().buffer_update(mv, key, value, counter, prev, durable)

    def backpressure(self, mv: Move, records: int = 1) -> None:
        """After the partition lock is released: the engine's
        :meth:`~node.move.MoveEngine.backpressure` (a replay catches up with writes)."""
        self._engine().backpressure(mv, records)

    # -- primary / supplier ------------------------------------------------------------
    def op_register(self, cache: str, p: int, node: str, address: str,
                    epoch: int | None = None) -> dict[str, int]:
        """Primary: replicate p to ``node`` (a MOVING copy) from now on; returns the
        counter at registration (all earlier updates are replicated already)."""
        self._serving()
        with self.plock(cache, p):
            self.check_epoch(cache, p, epoch, node, demand=True)
            if not self.leads(cache, p):
                raise self._not_primary(cache, p)
            self.copies.setdefault((cache, p), {})[node] = address
            return {"counter": self.data[cache].counter(p)}

    def can_supply(self, cache: str, p: int) -> str | None:
        """None when this node may send p's file; else why not."""
        if self.states.get(cache, p) != State.OWNING:
            return f"{self.id} does not own {cache}/{p} ({self.states.get(cache, p)})"
        with self.map_lock:
            if self.id not in self.map.parts[cache][p].isr:
                return f"{self.id}'s copy of {cache}/{p} is not in sync (not confirmed by the primary)"
        return None

    # -- supplier -----------------------------------------------------------------
    def op_demand(self, cache: str, p: int, node: str, address: str,
                  epoch: int | None = None) -> dict[str, object]:
        self._serving()
        data = self.data[cache]
        with self.plock(cache, p):
            self.check_epoch(cache, p, epoch, node, demand=True)
            if not self.leads(cache, p):
                raise self._not_primary(cache, p)
            self.copies.setdefault((cache, p), {})[node] = address
            C = data.counter(p)
            entries = sorted(data.entries(p), key=lambda e: e[2])
        sid = uuid.uuid4().hex
        total = sum(len(k) + (len(v) if v else 0) for k, v, _ in entries)
        self.sessions[sid] = (entries, time.monotonic())
        log.info("stage=supply cache=%s partition=%d to %s: %d entries, %d bytes at counter %d",
                 cache, p, node, len(entries), total, C)
        return {"session": sid, "counter": C, "count": len(entries), "bytes": total}

    def op_fetch(self, session: str, offset: int, max_bytes: int = FETCH_BYTES) -> dict[str, object]:
        got = self.sessions.get(session)
        if got is None:
            raise Unavailable(f"no transfer session {session} on {self.id} (restarted?)")
        entries, size, out = got[0], 0, []
        i = offset
        while i < len(entries) and (size < max_bytes or not out):
            k, v, c = entries[i]
            out.append([k, v, c])
            size += len(k) + (len(v) if v else 0) + 16
            i += 1
        return {"entries": out, "next": i, "done": i >= len(entries)}

    def op_demand_done(self, session: str) -> bool:
        return self.sessions.pop(session, None) is not None

    # -- hand-off of the primary role ---------------------------------------------
    def op_handoff(self, cache: str, p: int, to: str) -> int:
        """Fence p (stop taking writes) so ``to`` can become primary; returns the counter."""
        with self.plock(cache, p):
            if not self.leads(cache, p):
                raise self._not_primary(cache, p)
            self.fenced[(cache, p)] = time.monotonic() + FENCE_SECONDS
            return self.data[cache].counter(p)

    def op_unfence(self, cache: str, p: int) -> bool:
        return self.fenced.pop((cache, p), None) is not None

    def _take_primary(self, cache: str, p: int, prim: str) -> None:
        addr = self.map.address(prim)
        try:
            theirs = self.pool.call(addr, "handoff", cache=cache, p=p, to=self.id)
            with self.plock(cache, p):
                mine = self.data[cache].counter(p)
            ok = False
            if mine == theirs:
                try:
                    self.request(cache, p, {"op": "set_primary", "previous": prim},
                                 lambda r: r.primary == self.id)
                    ok = True
                except NodeError as e:
                    log.info("stage=handoff cache=%s partition=%d refused: %s", cache, p, e)
            if not ok:
                self.pool.call(addr, "unfence", cache=cache, p=p)
                log.info("stage=handoff cache=%s partition=%d not taken (counter %d vs %d)",
                         cache, p, mine, theirs)
        except NodeError as e:
            log.info("stage=handoff cache=%s partition=%d from %s failed: %s", cache, p, prim, e)
        finally:
            self.handoffs.discard((cache, p))
