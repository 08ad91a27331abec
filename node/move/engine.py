"""The move of ONE partition to this process (the demander), written once: the node
hosts this engine through the ports of :mod:`node.move.ports`. Stages (:class:`~node.move.stages.Stage`):

``prepare``         p -> MOVING (durable); a fresh temp WAL (:mod:`node.move.tempwal`)
                    becomes ``Move.sink``: from now on every update the primary
                    replicates here is appended to it durably before it may acknowledge
                    (the log is created on disk by the first such update).
``demand``          ``ReplicaFeed.register`` with the primary: under its partition lock
                    it adds this copy to the ones it replicates to (buffer before
                    snapshot: every update after this point reaches the temp WAL).
``transfer``        ``transfer.Demander.fetch`` from one supplier (the locator's order;
                    the next one, or the same one restarted, when it fails); the
                    supplier snapshots at counter C, copy-on-write.
``install``         verified file renamed into place (inside ``fetch``).
``index rebuild``   p's indexes loaded from the entries the supplier shipped at C
                    (``index_transfer``, checked against the file: :mod:`node.move.ship`),
                    or from the keys built while the file arrived (the streaming
                    install, :mod:`node.move.stream`), or rebuilt from the installed
                    file, while updates still go only to the temp WAL
                    (:mod:`node.move.rebuild`).
``replay``          temp-WAL updates with counter > C applied in order (idempotent by
                    counter; a gap restarts the move) while new ones keep arriving; the
                    reader never blocks appends. At the tail, under the partition lock,
                    the last records are applied and the copy switches to the direct
                    path (``Move.direct``: replicated updates are applied, prev-checked).
``checkpoint wait`` a checkpoint covering everything applied; then ``register`` again
                    confirms the primary's counter is not ahead of this copy.
``owning``          OWNING under the partition lock; then the temp WAL is deleted.

A crash point marks each stage edge (names in :mod:`faults.points`). A failure
restarts the move from ``prepare`` (the transfer resumes from the chunks it holds
durably); :meth:`MoveEngine.run` is that loop, with the fall-back to the messages mode
(:mod:`node.move.messages`) when the files cannot be installed here.
"""
from __future__ import annotations

import logging
import time
from functools import partial
from typing import Callable, TypedDict

from faults import crashpoint
from indexes import Progress as IndexProgress, RebuildResult
from transfer import Demander, FetchResult, PartitionStoreStorage, Progress, TransferError

from ..errors import NodeError, Unavailable
from ..states import State
from .apply import apply_chunked
from .context import MoveContext
from .errors import FilesImpossible, MoveRestart
from .messages import messages_once
from .ports import PartitionData
from .progress import MemorySink, Move
from .rebuild import index_installed
from .ship import index_shipped, ship_wanted
from .stages import Stage
from .stream import StreamFeed
from .tempwal import TempWalSink, Update

log = logging.getLogger("ferry.node.filemove")
# temp-WAL replay: records / payload bytes read and applied with ONE apply_many (one
# index commit, no node-WAL record); the bytes bound what the replay holds in memory
REPLAY_RECORDS = 16384
REPLAY_BYTES = 32 << 20
TAIL = 64                  # records left when the switch to the direct path happens
FETCH_GIVE_UP_S = 60.0     # every supplier failing this long restarts the whole move
CHECKPOINT_TIMEOUT_S = 120.0
BACKPRESSURE_MAX_S = 0.5  # below the primary's replicate timeout (5 s) by far


class _FetchOpts(TypedDict, total=False):
    """The Demander settings a node configures (absent: the Demander's default)."""
    chunk_size: int
    margin: int


class MoveEngine:
    def __init__(self, ctx: MoveContext, supplier_load: dict[str, int] | None = None) -> None:
        self.ctx = ctx
        # fetches of this process per supplier (shared with the host's locator)
        self.supplier_load: dict[str, int] = {} if supplier_load is None else supplier_load

    # -- the loop of attempts -------------------------------------------------------
    def run(self, mv: Move) -> bool:
        """Attempts until OWNING (True), p LOST, cancelled or stopping (False). The
        caller then calls :meth:`finish`."""
        ctx, data = self.ctx, self.ctx.data[mv.cache]
        while not mv.cancelled and not ctx.stopping.is_set():
            try:
                if self.attempt(mv, data):
                    return ctx.states.get(mv.cache, mv.p) == State.OWNING
            except FilesImpossible as e:
                log.warning("stage=%s cache=%s partition=%d %s; falling back to the messages "
                            "mode for this move", mv.stage, mv.cache, mv.p, e)
                with ctx.plock(mv.cache, mv.p):
                    sink = mv.to_messages()
                if isinstance(sink, TempWalSink):
                    sink.destroy()
                continue
            except NodeError as e:
                log.warning("stage=%s cache=%s partition=%d move attempt failed: %s; retrying",
                            mv.stage, mv.cache, mv.p, e)
            ctx.stopping.wait(ctx.retry_s)
        return False

    def attempt(self, mv: Move, data: PartitionData) -> bool:
        if mv.mode == "files":
            return self.files_once(mv, data)
        if self.ctx.entries is None:
            raise FilesImpossible(f"{mv.cache}/{mv.p}: this host has no messages mode")
        return messages_once(self.ctx, mv, data, self.ctx.entries)

    def finish(self, mv: Move) -> None:
        """After :meth:`run`: a cancelled move's temp WAL is deleted (nothing needs it);
        a move cut by a stop keeps it closed on disk (the restart starts over)."""
        with self.ctx.plock(mv.cache, mv.p):
            sink = mv.take_sink()
        if isinstance(sink, TempWalSink):
            if self.ctx.stopping.is_set():
                sink.close()
            else:
                sink.destroy()

    # -- one attempt, files mode ----------------------------------------------------
    def prepare(self, mv: Move, state: State | None = State.MOVING) -> TempWalSink:
        """A fresh temp WAL as ``mv.sink`` (p -> ``state`` first, unless None)."""
        ctx, cache, p = self.ctx, mv.cache, mv.p
        with ctx.plock(cache, p):
            if state is not None and ctx.states.get(cache, p) != state:
                ctx.states.set(cache, p, state, reason="move (files)")
            ctx.replaced(cache, p)
            old = mv.take_sink()
            if old is not None:
                # only the files mode prepares: never the messages mode's MemorySink
                assert isinstance(old, TempWalSink)
                old.close()
            sink = TempWalSink.fresh(ctx.data_dir, cache, p, sync=ctx.tmpwal_sync)
            mv.use_sink(sink)
            mv.fig.fresh_attempt(time.monotonic())
        return sink

    def files_once(self, mv: Move, data: PartitionData) -> bool:
        ctx, cache, p = self.ctx, mv.cache, mv.p
        mv.begin(Stage.PREPARE)
        self.prepare(mv)
        prim = ctx.locator.primary(cache, p)
        if prim is None:
            return True                       # LOST, reported
        mv.begin(Stage.DEMAND)
        ctx.feed.register(prim[1], cache, p)
        crashpoint("demander.after_demand")
        feed = StreamFeed(data.indexes, cache, p) if ctx.stream_index else None
        ship_mode = ctx.index_transfer()
        # (auto: only below index_ship_below bytes per entry, which the supplier tells)
        ship = ((ctx.index_ship_below() if ship_mode == "auto" else 0)
                if ship_wanted(ship_mode, ctx.index_supply, data) else None)
        shipping: set[str] = set()        # the suppliers that will export p's index
        try:
            res = self.fetch(mv, data, feed, ship=ship, shipping=shipping)
            mv.fig.snapshot_counter = res.counter
            crashpoint("demander.after_install")
            mv.begin(Stage.INDEX_REBUILD)

            def progress(pr: IndexProgress) -> None:
                mv.fig.index_progress = (pr.done, pr.total, pr.eta)

            def cancel() -> bool:
                return mv.cancelled or ctx.stopping.is_set()
            shipped: Callable[[], RebuildResult] | None = None
            supply, source = ctx.index_supply, mv.fig.source
            if supply is not None and source is not None and source in shipping:
                shipped = partial(index_shipped, cache, p, data, supply, source, res.counter,
                                  progress, cancel)
            mv.fig.index_source = index_installed(cache, p, data, feed, progress, pool=ctx.scan_pool,
                                                  cancel=cancel, shipped=shipped)
            data.index_rebuilt(p)         # made from the installed file: p's content now
        finally:
            if feed is not None:
                feed.close()
        mv.begin(Stage.REPLAY)
        self.replay(mv, data)
        mv.begin(Stage.CHECKPOINT_WAIT)
        upto = data.counter(p)
        if not data.store.wait_checkpoint_covering(p, upto, timeout=CHECKPOINT_TIMEOUT_S):
            raise Unavailable(f"no checkpoint covered {cache}/{p} at {upto} in {CHECKPOINT_TIMEOUT_S}s")
        # Confirm: once register returns, every update the primary made is replicated here.
        theirs = ctx.feed.register((ctx.locator.primary(cache, p) or prim)[1], cache, p)
        crashpoint("demander.before_owning")
        with ctx.plock(cache, p):
            if mv.gap:
                raise MoveRestart(mv.gap)
            mine = data.counter(p)
            if mine < theirs:
                raise MoveRestart(f"{cache}/{p} at counter {mine} but the primary is at {theirs}")
            ctx.states.set(cache, p, State.OWNING, reason="files move complete")
            sink = mv.take_sink()
            assert isinstance(sink, TempWalSink)
            mv.fig.buffered = sink.appended
        crashpoint("demander.after_owning")
        sink.destroy()
        mv.begin(Stage.OWNING)
        log.info("stage=owning cache=%s partition=%d from %s: %d bytes (%d on the wire), "
                 "%d updates replayed, counter %d, replay %.0f/s vs ingest %.0f/s before it, "
                 "stages %s", cache, p, mv.fig.source, mv.fig.bytes, mv.fig.wire, mv.fig.replayed, mine,
                 mv.fig.replay_rate, mv.fig.ingest_rate, mv.fig.stage_seconds)
        m = ctx.metrics
        m.inc("ferry_node_moves_done_total", cache=cache)
        m.inc("ferry_node_move_bytes_total", mv.fig.wire, cache=cache)
        m.inc("ferry_node_moves_by_copy_total", cache=cache, copy=str(mv.fig.copy.get("mode", "full")))
        pages, sent = mv.fig.copy.get("pages"), mv.fig.copy.get("pages_sent")
        if mv.fig.copy.get("mode") == "delta" and isinstance(pages, int) and isinstance(sent, int):
            m.inc("ferry_node_delta_pages_total", sent, cache=cache, kind="sent")
            m.inc("ferry_node_delta_pages_total", pages - sent, cache=cache, kind="kept")
        m.inc("ferry_node_replayed_updates_total", mv.fig.replayed, cache=cache)
        m.inc("ferry_node_buffered_updates_total", mv.fig.buffered, cache=cache)
        if mv.fig.replayed:
            m.observe("ferry_node_replay_rate", mv.fig.replay_rate)
        if mv.fig.ingest_rate > 0:
            m.observe("ferry_node_tempwal_ingest_rate", mv.fig.ingest_rate)
        return True

    def resubscribe(self, mv: Move, data: PartitionData) -> bool:
        """A copy that is OWNING here and may still be current (a host's restart):
        register again with a fresh temp WAL; when p's counter equals the primary's,
        replay what arrived meanwhile and take the direct path (True). Else (False)
        the copy is stale and needs a move."""
        self.prepare(mv, state=None)
        prim = self.ctx.locator.primary(mv.cache, mv.p)
        if prim is None or data.counter(mv.p) != self.ctx.feed.register(prim[1], mv.cache, mv.p):
            return False
        self.replay(mv, data)
        with self.ctx.plock(mv.cache, mv.p):
            sink = mv.take_sink()
        if isinstance(sink, TempWalSink):
            sink.destroy()
        return True

    # -- transfer + install -----------------------------------------------------------
    def fetch(self, mv: Move, data: PartitionData, observer: StreamFeed | None = None, *,
              ship: int | None = None, shipping: set[str] | None = None) -> FetchResult:
        """The file from one supplier after another (see the module doc). ``ship``: ask
        each supplier for p's index first (0: always; > 0: only below that many bytes
        per entry); ``shipping`` collects those that accepted."""
        ctx, cache, p = self.ctx, mv.cache, mv.p
        mv.begin(Stage.TRANSFER)
        give_up = time.monotonic() + FETCH_GIVE_UP_S
        storage = PartitionStoreStorage({cache: data.store})
        ctx.locator.check_files(cache, p)
        pool = ctx.scan_pool
        opts: _FetchOpts = {}
        if ctx.chunk_size is not None:
            opts["chunk_size"] = ctx.chunk_size
        if ctx.margin is not None:
            opts["margin"] = ctx.margin

        def progress(pr: Progress) -> None:
            if pool is not None and pr.total and pool.wants(pr.total):
                pool.warm()     # once per process: the workers' start runs during the transfer
            if pr.stage in ("verify", "install", "applied") and mv.stage != Stage.INSTALL:
                mv.begin(Stage.INSTALL)
            mv.fig.bytes, mv.fig.bytes_total, mv.fig.wire = pr.done, pr.total, mv.fig.wire_before + pr.wire
        while True:
            for node, addr in ctx.locator.suppliers(cache, p):
                if mv.cancelled or ctx.stopping.is_set():
                    raise Unavailable("move cancelled")
                if mv.gap:
                    raise MoveRestart(mv.gap)
                mv.fig.source, mv.fig.wire_before = node, mv.fig.wire
                self.supplier_load[node] = self.supplier_load.get(node, 0) + 1
                if ship is not None and ctx.index_supply is not None and shipping is not None:
                    shipping.discard(node)
                    try:        # the supplier exports p's index with its snapshot of p
                        if ctx.index_supply.want(node, cache, p, ship):
                            shipping.add(node)
                        else:
                            log.info("stage=transfer cache=%s partition=%d %s holds %d or more "
                                     "bytes per entry (index_transfer = auto): the index will "
                                     "be rebuilt", cache, p, node, ship)
                    except (NodeError, OSError) as e:
                        log.info("stage=transfer cache=%s partition=%d %s did not take the "
                                 "index request (%s); the index will be rebuilt", cache, p, node, e)
                try:
                    res = Demander(storage, addr, ctx.secret, limits=ctx.recv_limits,
                                   tls=ctx.tls, tls_peer=node,
                                   timeout=ctx.transfer_timeout, observer=observer,
                                   delta=ctx.delta, delta_limit=round(ctx.delta_limit * 1000),
                                   adopt=True, **opts).fetch(p, cache=cache, progress=progress)
                    mv.fig.bytes = mv.fig.bytes_total = res.bytes
                    mv.fig.wire = mv.fig.wire_before + res.bytes_wire
                    mv.fig.transfer_stages = {k: round(v, 3) for k, v in res.stages.items()}
                    mv.fig.copy = {"mode": res.mode, "pages": res.pages, "pages_sent": res.pages_sent,
                               "path": res.path}
                    if res.delta_refused:
                        mv.fig.copy["delta_refused"] = res.delta_refused
                    log.info("stage=install cache=%s partition=%d from %s: C=%d %s wire=%d reused=%d "
                             "preimages=%d%s", cache, p, node, res.counter, res.mode, res.bytes_wire,
                             res.bytes_reused, res.preimages,
                             f" delta: {res.pages_sent} of {res.pages} pages" if res.mode == "delta"
                             else f" (no delta: {res.delta_refused})" if res.delta_refused else "")
                    return res
                except (TransferError, OSError) as e:
                    log.warning("stage=transfer cache=%s partition=%d from %s (%s) failed: %s; "
                                "trying another owner", cache, p, node, addr, e)
                    mv.begin(Stage.TRANSFER)
                finally:
                    self.supplier_load[node] -= 1
            if time.monotonic() > give_up:
                raise Unavailable(f"no owner could supply {cache}/{p} for {FETCH_GIVE_UP_S:.0f}s")
            ctx.stopping.wait(0.5)

    # -- replay -----------------------------------------------------------------------
    def replay(self, mv: Move, data: PartitionData) -> None:
        """Apply the temp WAL in order while appends go on; switch at the tail.

        One open reader for the whole replay (:class:`TempWalCursor`), and batches of up
        to REPLAY_BYTES applied with ONE ``apply_many`` each: one index commit per batch,
        and no node-WAL record at all (``logged=False``: logging every value a second
        time bought nothing). Logging protects nothing here: the temp WAL holds these
        updates durably until OWNING; until then this copy counts for no
        acknowledgement (the primary acks on its OWNING copies; this one answers
        ``buffered``), a crash restarts the move from ``prepare`` with a fresh temp WAL
        and a fresh install (whose WAL INSTALL record voids every earlier record of p),
        and OWNING waits for a checkpoint that covers everything applied (pages
        fsynced, marker durable)."""
        ctx, cache, p, sink = self.ctx, mv.cache, mv.p, mv.sink
        assert isinstance(sink, TempWalSink)
        cursor = sink.cursor(sink.first_lsn)
        t0 = mv.fig.replay_started = time.monotonic()
        cpu0 = time.thread_time()
        at_start = sink.appended
        mv.fig.ingest_rate = at_start / max(t0 - mv.fig.buffer_started, 1e-6)

        def rates() -> None:
            span = max(time.monotonic() - t0, 1e-6)
            mv.fig.replay_cpu = time.thread_time() - cpu0
            mv.fig.replay_from_disk = cursor.from_disk
            mv.fig.replay_rate = mv.fig.replayed / span
            mv.fig.ingest_replay = (sink.appended - at_start) / span
        try:
            while True:
                if mv.cancelled or ctx.stopping.is_set():
                    raise Unavailable("move cancelled")
                if mv.gap:
                    raise MoveRestart(mv.gap)
                limit = ctx.replay_rate_limit()
                if sink.last_lsn - cursor.next + 1 < TAIL:
                    break
                # with a replay rate limit (records/s): batches of a tenth of a second
                batch = cursor.read(max(TAIL, limit // 10) if limit else REPLAY_RECORDS,
                                    REPLAY_BYTES)
                self._apply_records(mv, data, sink, batch)
                if limit:
                    ahead = mv.fig.replayed / limit - (time.monotonic() - t0)
                    if ahead > 0:
                        ctx.stopping.wait(ahead)
                rates()
                crashpoint("demander.mid_replay")
            with ctx.plock(cache, p):       # brief: the last few records, then the switch
                tail = cursor.read(None)    # appends hold this lock: this is all of them
                self._apply_records(mv, data, sink, tail)
                crashpoint("demander.mid_replay")
                mv.go_direct()
                rates()
        finally:
            cursor.close()

    def _apply_records(self, mv: Move, data: PartitionData, sink: TempWalSink,
                       records: list[tuple[int, Update]]) -> None:
        """Apply a batch of temp-WAL records of the replay (index changes in one
        commit, no node-WAL records: see :meth:`replay`)."""
        p = mv.p
        cur = data.counter(p)
        todo = []
        for _lsn, u in records:
            if u.counter > cur:
                if u.counter != cur + 1:
                    raise MoveRestart(f"{mv.cache}/{p}: buffered updates jump from {cur} to "
                                      f"{u.counter} (an update was missed); restarting the move")
                todo.append((u.key, u.value, u.counter))
                cur = u.counter
        mv.fig.replayed += apply_chunked(data, p, todo, REPLAY_RECORDS, REPLAY_BYTES, logged=False)
        if records:
            sink.replayed = records[-1][0]

    # -- the replica stream's side (partition lock held) --------------------------------
    def buffer_update(self, mv: Move, key: bytes, value: bytes | None, counter: int,
                      prev: int | None, durable: bool = True) -> str:
        """An update the primary replicated to this MOVING copy (partition lock held):
        "buffered" in the temp WAL, or "applied" on the direct path after the replay's
        switch ("absent": it does not follow ``prev``, the move restarts; a host whose
        stream carries no ``prev`` passes None and relies on the counters). With
        ``durable=False`` (a replicated batch) the caller syncs ``mv.sink`` before it
        answers."""
        if mv.direct:
            data = self.ctx.data[mv.cache]
            if prev is not None and data.counter(mv.p) != prev:
                mv.flag_gap(f"{mv.cache}/{mv.p}: replicated update {counter} follows {prev} but the "
                            f"copy is at {data.counter(mv.p)}; restarting the move")
                return "absent"
            data.apply(mv.p, key, value, counter)
            return "applied"
        sink = mv.sink
        if isinstance(sink, MemorySink):
            sink.append(counter, key, value)
        elif sink is not None:
            sink.append(counter, key, value, durable=durable)
        return "buffered"

    def backpressure(self, mv: Move, records: int = 1) -> None:
        """Called after the partition lock is released. While the replay runs, each
        acknowledgement of the partition waits 3 / (replay rate) per record it carried
        (a replicated batch: ``records``): the primary replicates under its partition
        lock, so the partition then takes at most a third of the replay rate and the
        backlog shrinks by at least two thirds of it - a sustained write load cannot
        keep the move from finishing."""
        sink = mv.sink
        if sink is None or mv.stage != Stage.REPLAY or mv.direct:
            return
        # On for the whole replay, not above a threshold: with a threshold the backlog
        # settles just above it and the tail (< TAIL records) is never reached.
        if sink.backlog() > 0:
            # a batch may wait longer: its replicate timeout is 4x the single one's
            cap = BACKPRESSURE_MAX_S * (4 if records > 1 else 1)
            delay = min(cap, 3.0 * records / mv.fig.replay_rate if mv.fig.replay_rate > 0 else 0.01)
            self.ctx.metrics.inc("ferry_node_backpressure_seconds_total", delay, cache=mv.cache)
            time.sleep(delay)
