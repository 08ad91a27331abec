"""The messages mode (``rebalance.mode = "messages"``): the fallback when files cannot
move (another page size) and the baseline of ``bench/rebalance_bench.py``. Entries
travel instead of the file, and are applied through the same path as the temp-WAL
replay (:func:`node.move.apply.apply_chunked`).

``prepare``  p -> MOVING (durable); local data of p dropped; a buffer (:class:`MemorySink`)
             takes the updates the primary replicates to this MOVING copy.
``demand``   DEMAND to the primary: under its partition lock it registers this copy
             (every later update is replicated here) and snapshots the entries with
             their counters as of counter C.
``fetch``    supply batches of entries (ascending counter, at most FETCH_BYTES each),
             each applied as ONE batch like a real message-based rebalancer (Ignite's
             supply messages). Counters at or below the partition's are skipped, so an
             entry is never applied over a newer update of p. The fetch holds one of the
             node's receive slots and takes its bytes from the node's receive rate (the
             host's ``recv_limits``), as a file transfer does: foreground protection
             paces both modes by the same measure, bytes received per second.
``catchup``  under the partition lock: buffered updates with counter > C applied in
             order, batched the same way (they must be contiguous from C+1, else the
             move restarts), then p -> OWNING; later updates take the normal path.
"""
from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from faults import crashpoint
from transfer import Priority

from ..errors import NodeError, Unavailable
from ..states import State
from .apply import apply_chunked
from .ports import EntrySupply, PartitionData, Updates
from .progress import MemorySink, Move
from .stages import Stage

if TYPE_CHECKING:
    from .context import MoveContext

log = logging.getLogger("ferry.node.rebalance")
FETCH_BYTES = 512 * 1024       # per batch: well under one 1 MiB frame


def supply_batch(cache: str, p: int, entries: list[object], last: int, C: int) -> Updates:
    """One supply message's entries as ``(key, value or None, counter)``, checked:
    counters strictly ascending after ``last`` (the previous message's) and at most the
    snapshot's C. apply_many skips a counter at or below the partition's, so an entry
    out of order would be dropped silently; such a message restarts the move instead."""
    out: Updates = []
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


def messages_once(ctx: "MoveContext", mv: Move, data: PartitionData, supply: EntrySupply) -> bool:
    """One attempt of a messages-mode move; True when it ended (OWNING, LOST, cancelled)."""
    cache, p = mv.cache, mv.p
    mv.begin(Stage.PREPARE)
    mv.fig.bytes, mv.fig.bytes_total = 0, 0
    with ctx.plock(cache, p):
        if ctx.states.get(cache, p) != State.MOVING:
            ctx.states.set(cache, p, State.MOVING, reason="move")
        ctx.replaced(cache, p)
        data.drop(p)
        data.create(p)
        sink = MemorySink()
        mv.use_sink(sink)
    prim = ctx.locator.primary(cache, p)
    if prim is None:
        return True                       # LOST, reported
    mv.fig.source, addr = prim
    mv.begin(Stage.DEMAND)
    sid, C, mv.fig.bytes_total = supply.demand(addr, cache, p)
    crashpoint("demander.after_demand")
    mv.begin(Stage.FETCH)
    with contextlib.ExitStack() as held:
        limits = ctx.recv_limits
        if limits is not None:
            held.enter_context(limits.slots.acquire(Priority.REBALANCE))
        offset, last = 0, 0
        while True:
            if mv.cancelled:
                return True
            entries, offset, done = supply.fetch(addr, sid, offset, FETCH_BYTES)
            batch = supply_batch(cache, p, entries, last, C)
            with ctx.plock(cache, p):
                apply_chunked(data, p, batch)      # the whole supply message at once
            if batch:
                last = batch[-1][2]
            n = sum(len(k) + (len(v) if v else 0) for k, v, _ in batch)
            mv.fig.bytes += n
            crashpoint("demander.mid_receive")   # a supply message applied, more may come
            if done:
                break
            if limits is not None:
                limits.bucket.take(n)            # paced as a file transfer's bytes are
    mv.begin(Stage.CATCHUP)
    with ctx.plock(cache, p):
        items = [it for it in sink.drain() if it[0] > C]
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
        ctx.states.set(cache, p, State.OWNING, reason="messages move complete")
        mv.take_sink()
    crashpoint("demander.after_owning")
    mv.begin(Stage.OWNING)
    log.info("stage=owning cache=%s partition=%d from %s: %d bytes, counter %d, stages %s",
             cache, p, mv.fig.source, mv.fig.bytes, want, mv.fig.stage_seconds)
    ctx.metrics.inc("ferry_node_moves_done_total", cache=cache)
    ctx.metrics.inc("ferry_node_move_bytes_total", mv.fig.bytes, cache=cache)
    try:
        supply.done(addr, sid)
    except NodeError:
        pass
    return True
