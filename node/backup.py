"""The backup's side of the update path: ``replicate`` and ``replicate_batch`` from the
primary (and a new primary's confirmation, an empty ``replicate_batch``), and the epoch
check every replication and DEMAND passes.

A backup applies an update only in the primary's counter order (its counter must equal
``prev``; otherwise it answers ``resync`` and re-pulls the partition), durably, before it
answers ``applied``; a MOVING copy buffers it (``buffered``: the move's temp WAL or
list). Every applied or buffered client write records its request id
(:mod:`node.dedup`), so this copy can answer a retry if it becomes primary. A
replication in a newer primary term than this node's map shows, while the map still
names this node primary, means another node leads p: :meth:`Backup.newer_term` tells
the update path to stop serving p at once (node/updates.py, ``UpdatePath.term``).
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable, Sequence

from .context import NodeContext, PartKey
from .dedup import RequestId, Requests
from .errors import StaleEpoch
from .ports import MoveActions
from .states import State
from .storage import CacheData
from .tempwal import TempWalSink
from .visible import Visibility

if TYPE_CHECKING:
    from .move import Move

log = logging.getLogger("ferry.node.updates")

Update = tuple[bytes, "bytes | None", int]        # key, value (None: remove), counter


class Backup:
    """``movers``: the rebalancer (buffer an update of a MOVING partition, backpressure,
    resync), once bound."""

    def __init__(self, ctx: NodeContext, visible: Visibility, requests: Requests,
                 movers: Callable[[], MoveActions]) -> None:
        self.ctx = ctx
        self.visible = visible
        self.requests = requests
        self.movers = movers
        # p -> the newest primary term a replication showed while this node's map still
        # named itself primary of p
        self._newer: dict[PartKey, int] = {}

    def newer_term(self, cache: str, p: int) -> int:
        """The newest primary term a copy has shown this node for p (-1: none)."""
        return self._newer.get((cache, p), -1)

    def check_epoch(self, cache: str, p: int, epoch: int | None, sender: str, *,
                    demand: bool = False) -> None:
        """Refuse a message carrying an older primary epoch (term) of p than this node
        knows: a replication from a deposed primary, or a DEMAND from a node whose view
        of who leads is out of date. A replication in the same term must also come from
        the record's primary. The term changes only with the primary: an in-sync change
        alone refuses nobody. A replication in a NEWER term while this node's map still
        names it primary means another node leads p: this one stops serving it at once
        (:meth:`term`), before its map catches up."""
        if epoch is None:
            return
        with self.ctx.map.lock:
            rec = self.ctx.map.map.parts[cache][p]
            prim, term = rec.primary, rec.term
        if demand:
            if epoch < term:
                raise StaleEpoch(f"DEMAND of {cache}/{p} from {sender} in primary epoch {epoch}; "
                                 f"{self.ctx.id} knows primary epoch {term}: refresh and demand again")
        elif epoch < term or (epoch == term and prim not in (None, sender)):
            raise StaleEpoch(f"{self.ctx.id} knows {cache}/{p} in primary epoch {term} (primary "
                             f"{prim}); {sender} sent primary epoch {epoch}")
        elif epoch > term and prim == self.ctx.id and sender != self.ctx.id:
            if self._newer.get((cache, p), -1) < epoch:
                self._newer[(cache, p)] = epoch
                log.info("stage=replicate cache=%s partition=%d %s sent primary term %d (this map: "
                         "%d, primary here): not serving it until the map catches up", cache, p,
                         sender, epoch, term)

    def op_replicate_batch(self, cache: str, p: int, updates: Sequence[Update], prev: int, primary: str,
                           epoch: int | None = None, rid: object = None) -> str:
        """Consecutive updates of one partition (a bulk load): applied one by one under one
        hold of the partition lock; the first answer other than applied/buffered ends it.
        No update: a new primary confirming that this copy holds exactly its counter
        ``prev`` ("applied"; "resync" when it does not: the copy re-syncs)."""
        req = RequestId.parse(rid)
        mv = None
        r = "applied"
        try:
            with self.ctx.plock(cache, p):
                self.check_epoch(cache, p, epoch, primary)
                self.visible.forget(cache, p)          # a backup of p: it serves no read of p
                data = self.ctx.data[cache]
                st = self.ctx.states.get(cache, p)
                if not updates:
                    return self._confirmation(data, cache, p, prev, primary, st)
                if st == State.OWNING and data.counter(p) == prev \
                        and all(u[2] == prev + 1 + i for i, u in enumerate(updates)):
                    data.apply_many(p, [(k, v, c) for k, v, c in updates])   # the common case
                    self.ctx.repl.last_applied.touch((cache, p), time.time())
                    self.requests.record(cache, p, req, updates[0][2], updates[-1][2])
                    return "applied"
                try:
                    for key, value, counter in updates:
                        # a MOVING copy's temp WAL: written in order now, made durable
                        # once for the whole batch below (still before the answer)
                        r, mv = self._replicate_one(cache, p, key, value, counter, prev, primary,
                                                    durable=False)
                        if r not in ("applied", "buffered"):
                            break
                        prev = counter
                    else:
                        self.requests.record(cache, p, req, updates[0][2], updates[-1][2],
                                             moving=st == State.MOVING)
                finally:
                    if mv is not None and isinstance(mv.sink, TempWalSink):
                        mv.sink.sync()
            return r
        finally:
            if mv is not None and mv.mode == "files":
                self.movers().backpressure(mv, records=len(updates))

    def _confirmation(self, data: CacheData, cache: str, p: int, prev: int, primary: str,
                      st: State | None) -> str:
        """(p's lock held) An empty replicate_batch: does this copy hold exactly the
        primary's counter ``prev``? A MOVING copy has nothing to confirm."""
        if st == State.MOVING:
            return "buffered"
        if st != State.OWNING:
            return "absent"
        cur = data.counter(p)
        if cur != prev:
            log.warning("stage=replicate cache=%s partition=%d confirmation by %s at %d: this copy "
                        "is at %d; re-syncing", cache, p, primary, prev, cur)
            self.requests.forget(cache, p)
            self.movers().request_resync(cache, p, f"counter {cur} at the confirmation of {prev}")
            return "resync"
        return "applied"

    def op_replicate(self, cache: str, p: int, key: bytes, value: bytes | None, counter: int,
                     prev: int, primary: str, epoch: int | None = None, rid: object = None) -> str:
        req = RequestId.parse(rid)
        mv = None
        try:
            self.check_epoch(cache, p, epoch, primary)
            r, mv = self._replicate_one(cache, p, key, value, counter, prev, primary, rid=req)
            return r
        finally:
            if mv is not None and mv.mode == "files":
                self.movers().backpressure(mv)

    def _replicate_one(self, cache: str, p: int, key: bytes, value: bytes | None, counter: int,
                       prev: int, primary: str, durable: bool = True,
                       rid: RequestId | None = None) -> tuple[str, Move | None]:
        """One replicated update (the result, and the move of p if it is MOVING here).
        ``durable=False``: a temp-WAL append is not yet synced; the caller syncs.
        ``rid``: the request id of the client write, recorded once applied or buffered."""
        data = self.ctx.data[cache]
        mv = None
        with self.ctx.plock(cache, p):
            self.visible.forget(cache, p)              # a backup of p: it serves no read of p
            st = self.ctx.states.get(cache, p)
            if st == State.MOVING:
                mv = self.ctx.moves.get((cache, p))
                if mv is not None and mv.mode == "files" and (mv.sink is not None or mv.direct):
                    r = self.movers().buffer_update(mv, cache, p, key, value, counter, prev,
                                                     durable=durable)
                elif mv is not None and mv.sink is not None:
                    mv.sink.append(counter, key, value)
                    r = "buffered"
                else:
                    return "absent", mv
                if r in ("applied", "buffered"):
                    self.requests.record(cache, p, rid, counter, counter, moving=True)
                return r, mv
            r = self._apply_replicated(data, cache, p, key, value, counter, prev, primary, st)
            if r == "applied":
                self.requests.record(cache, p, rid, counter, counter)
            return r, mv

    def _apply_replicated(self, data: CacheData, cache: str, p: int, key: bytes, value: bytes | None,
                          counter: int, prev: int, primary: str, st: State | None) -> str:
        """The normal backup path (partition lock held): apply in counter order."""
        if st != State.OWNING:
            return "absent"
        cur = data.counter(p)
        if cur != prev:
            log.warning("stage=replicate cache=%s partition=%d counter gap: have %d, primary %s "
                        "sent %d after %d; re-syncing", cache, p, cur, primary, counter, prev)
            self.requests.forget(cache, p)
            self.movers().request_resync(cache, p, f"counter gap at {counter}")
            return "resync"
        data.apply(p, key, value, counter)
        self.ctx.repl.last_applied.touch((cache, p), time.time())
        return "applied"
