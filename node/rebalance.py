"""Message-based rebalancing (``rebalance.mode = "messages"``) and the reconcile loop
that turns each new map into moves, hand-offs and evictions.

The move of partition p to this node (the demander), stage by stage:

``prepare``  p -> MOVING (durable); local data of p dropped; a buffer (:class:`MemorySink`,
             the hook that the file-based mode replaces by a temp WAL) starts taking the
             updates the primary replicates to this MOVING copy.
``demand``   DEMAND to the primary: under its partition lock it registers this node as
             a copy (every later update is replicated here) and snapshots the entries
             with their counters as of counter C.
``fetch``    supply batches of entries (ascending counter, at most FETCH_BYTES each),
             each applied as ONE batch like a real message-based rebalancer (Ignite's
             supply messages): ``apply_chunked`` -> ``CacheData.apply_many``, one WAL
             batch, one durability wait and one index commit per batch (the temp-WAL
             replay's code). Counters at or below the partition's are skipped, so an
             entry is never applied over a newer update of p.
``catchup``  under the partition lock: buffered updates with counter > C applied in
             order, batched the same way (they must be contiguous from C+1, else the
             move restarts), then p -> OWNING; later updates take the normal path.

A failure at any stage restarts the move from ``prepare``; a restart of the process
finds p MOVING and does the same. Old owners go RENTING -> EVICTED once every ideal
owner reports OWNING and they are not primary.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

from faults import crashpoint

from .errors import NodeError, Unavailable
from .filemove import FileMoves, FilesImpossible, apply_chunked
from .move import MemorySink, Move  # noqa: F401  (Move: public here too)
from .tempwal import TempWalSink
from .states import State

log = logging.getLogger("ferry.node.rebalance")
FETCH_BYTES = 512 * 1024       # per batch: well under one 1 MiB frame
FENCE_SECONDS = 10.0           # a hand-off that is not confirmed in this time is undone


def supply_batch(cache: str, p: int, entries: Any, last: int, C: int) -> list[tuple[bytes, bytes | None, int]]:
    """One supply message's entries as ``(key, value or None, counter)``, checked:
    counters strictly ascending after ``last`` (the previous message's) and at most the
    snapshot's C. apply_many skips a counter at or below the partition's, so an entry
    out of order would be dropped silently; such a message restarts the move instead."""
    out: list[tuple[bytes, bytes | None, int]] = []
    for e in entries:
        if not (isinstance(e, (list, tuple)) and len(e) == 3):
            raise Unavailable(f"supply message for {cache}/{p} holds a malformed entry "
                              f"{str(e)[:80]!r}; restarting the move")
        k, v, c = e
        if not isinstance(k, bytes) or not (v is None or isinstance(v, bytes)) or not isinstance(c, int):
            raise Unavailable(f"supply message for {cache}/{p} holds an entry of the wrong types "
                              f"({type(k).__name__}, {type(v).__name__}, {type(c).__name__}); "
                              f"restarting the move")
        if c <= last or c > C:
            raise Unavailable(f"supply message for {cache}/{p} has counter {c} after {last} "
                              f"(snapshot at {C}): not ascending or beyond the snapshot; "
                              f"restarting the move")
        out.append((k, v, c))
        last = c
    return out


class Rebalancer(FileMoves):
    # -- demander -----------------------------------------------------------------
    def start_move(self, cache: str, p: int, why: str) -> bool:
        """Start pulling p unless it is already moving or the concurrency limit is
        reached (then the next reconcile tries again); True when started."""
        key = (cache, p)
        with self.moves_lock:
            # files mode: twice the transfer limit, so the index rebuild and replay of
            # some moves overlap the transfers of others (transfers are limited anyway)
            limit = self.cfg.transfer_concurrency * (2 if self.cfg.rebalance_mode == "files" else 1)
            if key in self.moves or len(self.moves) >= limit:
                return False
            mv = Move(cache, p, mode=self.cfg.rebalance_mode, on_stage=self._stage_done)
            self.moves[key] = mv
        log.info("stage=prepare cache=%s partition=%d move starts: %s", cache, p, why)
        threading.Thread(target=self._run_move, args=(mv,), name=f"move-{cache}-{p}", daemon=True).start()
        return True

    def request_resync(self, cache: str, p: int, why: str) -> None:
        """An OWNING copy that may be stale becomes MOVING and pulls p again."""
        self.states.set(cache, p, State.MOVING, reason=f"resync: {why}")
        self.wake()

    def _stage_done(self, stage: str, seconds: float) -> None:
        self.metrics.observe("ferry_node_move_stage_seconds", seconds, stage=stage)

    def _run_move(self, mv: Move) -> None:
        cache, p, data = mv.cache, mv.p, self.data[mv.cache]
        once = self._move_files_once if mv.mode == "files" else self._move_once
        try:
            while not mv.cancelled and not self.stopping.is_set():
                try:
                    if once(mv, data):
                        if self.states.get(cache, p) == State.OWNING:
                            self.moves_done.append(mv.summary(self.id))
                        return
                except FilesImpossible as e:
                    log.warning("stage=%s cache=%s partition=%d %s; falling back to the messages "
                                "mode for this move", mv.stage, cache, p, e)
                    with self.plock(cache, p):
                        sink, mv.sink = mv.sink, None
                        mv.mode, once = "messages", self._move_once
                    if isinstance(sink, TempWalSink):
                        sink.destroy()
                    continue
                except NodeError as e:
                    log.warning("stage=%s cache=%s partition=%d move attempt failed: %s; retrying",
                                mv.stage, cache, p, e)
                self.stopping.wait(0.5)
        except Exception:
            log.exception("stage=%s cache=%s partition=%d move crashed", mv.stage, cache, p)
        finally:
            with self.plock(cache, p):
                sink, mv.sink = mv.sink, None
                with self.moves_lock:
                    self.moves.pop((cache, p), None)
            if isinstance(sink, TempWalSink):
                # a cancelled move: nothing needs the buffered updates any more; a move cut
                # by a stop keeps its temp WAL closed on disk (the restart starts over)
                if self.stopping.is_set():
                    sink.close()
                else:
                    sink.destroy()
            self.wake()

    def _move_once(self, mv: Move, data: Any) -> bool:
        cache, p = mv.cache, mv.p
        mv.begin("prepare")
        mv.bytes, mv.bytes_total = 0, 0
        with self.plock(cache, p):
            if self.states.get(cache, p) != State.MOVING:
                self.states.set(cache, p, State.MOVING, reason="move")
            data.drop(p)
            data.create(p)
            mv.sink = MemorySink()
        with self.map_lock:
            rec = self.map.parts[cache][p]
            prim, epoch = rec.primary, rec.term
            addr = self.map.address(prim)
        if prim is None or prim == self.id or addr is None:
            if rec.lost:
                self.states.set(cache, p, State.LOST, reason="no in-sync copy left to pull from")
                log.error("stage=demand cache=%s partition=%d LOST: no in-sync copy left", cache, p)
                return True
            raise Unavailable(f"no primary for {cache}/{p} yet")
        mv.source = prim
        mv.begin("demand")
        r = self.pool.call(addr, "demand", cache=cache, p=p, node=self.id, address=self.cfg.address,
                           epoch=epoch)
        sid, C = r["session"], int(r["counter"])
        mv.bytes_total = int(r["bytes"])
        crashpoint("demander.after_demand")
        mv.begin("fetch")
        offset, last = 0, 0
        while True:
            if mv.cancelled:
                return True
            b = self.pool.call(addr, "fetch", session=sid, offset=offset, max_bytes=FETCH_BYTES, timeout=30.0)
            batch = supply_batch(cache, p, b["entries"], last, C)
            with self.plock(cache, p):
                apply_chunked(data, p, batch)      # the whole supply message at once
            if batch:
                last = batch[-1][2]
            mv.bytes += sum(len(k) + (len(v) if v else 0) for k, v, _ in batch)
            crashpoint("demander.mid_receive")   # a supply message applied, more may come
            offset = b["next"]
            if b["done"]:
                break
        mv.begin("catchup")
        with self.plock(cache, p):
            items = [it for it in mv.sink.drain() if it[0] > C]
            for i, (c, _, _) in enumerate(items):
                if c != C + 1 + i:
                    raise Unavailable(f"buffered updates of {cache}/{p} have a gap at {C + 1 + i} "
                                      f"(got {c}); restarting the move")
            apply_chunked(data, p, [(k, v, c) for c, k, v in items])
            want = items[-1][0] if items else C
            if items:
                log.info("stage=catchup cache=%s partition=%d %d buffered updates applied after "
                         "the supplied entries (counters %d..%d)", cache, p, len(items), C + 1, want)
            if data.counter(p) != want:
                raise Unavailable(f"{cache}/{p} at counter {data.counter(p)} after catch-up, "
                                  f"expected {want}; restarting the move")
            crashpoint("demander.before_owning")
            self.states.set(cache, p, State.OWNING, reason="messages move complete")
            mv.sink = None
        crashpoint("demander.after_owning")
        mv.begin("owning")
        log.info("stage=owning cache=%s partition=%d from %s: %d bytes, counter %d, stages %s",
                 cache, p, mv.source, mv.bytes, want, mv.stage_seconds)
        self.metrics.inc("ferry_node_moves_done_total", cache=cache)
        self.metrics.inc("ferry_node_move_bytes_total", mv.bytes, cache=cache)
        try:
            self.pool.call(addr, "demand_done", session=sid)
        except NodeError:
            pass
        return True

    # -- supplier -----------------------------------------------------------------
    def op_demand(self, cache: str, p: int, node: str, address: str,
                  epoch: int | None = None) -> dict[str, Any]:
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

    def op_fetch(self, session: str, offset: int, max_bytes: int = FETCH_BYTES) -> dict[str, Any]:
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
