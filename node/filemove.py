"""File-based rebalancing (``rebalance.mode = "files"``, the default): the seed's flow
inside the node. Stages of one move of partition p to this node (the demander):

``prepare``         p -> MOVING (durable); a fresh temp WAL (:mod:`node.tempwal`) becomes
                    ``Move.sink``: from now on every update the primary replicates here
                    is appended to it durably before the primary may acknowledge.
``demand``          ``register`` with the primary: under its partition lock it adds this
                    node to the copies it replicates to (buffer before snapshot: every
                    update after this point reaches the temp WAL).
``transfer``        ``transfer.Demander.fetch`` from one OWNING copy (suppliers chosen to
                    spread load; another owner, or the same one restarted, when it
                    fails); the supplier snapshots at counter C, copy-on-write.
``install``         verified file renamed into place (inside ``fetch``).
``index rebuild``   the partition's LMDB indexes rebuilt from the installed file while
                    updates still go only to the temp WAL.
``replay``          temp-WAL updates with counter > C applied in order (idempotent by
                    counter; a gap restarts the move) while new ones keep arriving; the
                    reader never blocks appends. At the tail, under the partition lock,
                    the last records are applied and the copy switches to the direct
                    path (``Move.direct``: replicated updates are applied, prev-checked).
``checkpoint wait`` a checkpoint covering everything applied; then ``register`` again
                    confirms the primary's counter is not ahead of this copy.
OWNING              under the partition lock; then the temp WAL is deleted.

A failure restarts the move from ``prepare`` (the transfer resumes from the chunks it
holds durably). A process restart finds p MOVING and does the same; an OWNING p whose
temp WAL survived (crash after OWNING) gets it deleted at start-up.
"""
from __future__ import annotations

import logging
import random
import time
from typing import Any

from faults import crashpoint

from .errors import Unavailable
from .states import State
from .tempwal import TempWalSink

log = logging.getLogger("ferry.node.filemove")
APPLY_CHUNK = 2048         # messages mode: records per WAL batch / durability wait / index commit
APPLY_CHUNK_BYTES = 4 << 20
# temp-WAL replay: records / payload bytes read and applied with ONE apply_many (one
# index commit, no node-WAL record); the bytes bound what the replay holds in memory
REPLAY_RECORDS = 16384
REPLAY_BYTES = 32 << 20
TAIL = 64                  # records left when the switch to the direct path happens
FETCH_GIVE_UP_S = 60.0     # every owner failing this long restarts the whole move
CHECKPOINT_TIMEOUT_S = 120.0
BACKPRESSURE_MAX_S = 0.5  # below the primary's replicate timeout (5 s) by far


def apply_chunked(data: Any, p: int, updates: list[tuple[bytes, bytes | None, int]],
                  max_records: int = APPLY_CHUNK, max_bytes: int = APPLY_CHUNK_BYTES, *,
                  logged: bool = True) -> int:
    """Apply ``(key, value or None, counter)`` updates of p (partition lock held) in
    chunks of at most ``max_records`` records / ``max_bytes`` (the messages mode: a
    supply message's APPLY_CHUNK / APPLY_CHUNK_BYTES): each chunk ONE WAL batch,
    ONE durability wait and ONE index commit (``CacheData.apply_many``); counters at or
    below the partition's are skipped. Returns how many were applied. Both the temp-WAL
    replay (``logged=False``: no WAL batch, no wait) and the messages mode's supply
    batches and catch-up go through here."""
    done = 0
    chunk: list[tuple[bytes, bytes | None, int]] = []
    size = 0
    for u in updates:
        chunk.append(u)
        size += len(u[0]) + len(u[1] or b"")
        if len(chunk) >= max_records or size >= max_bytes:
            done += data.apply_many(p, chunk, logged=logged)
            chunk, size = [], 0
    if chunk:
        done += data.apply_many(p, chunk, logged=logged)
    return done


class MoveRestart(Unavailable):
    """The move must start over (gap in the buffered updates, counter behind)."""


class FilesImpossible(Unavailable):
    """The owners' files cannot be installed here (other page size): use messages."""


class FileMoves:
    # -- demander -----------------------------------------------------------------
    def _move_files_once(self, mv: Any, data: Any) -> bool:
        cache, p = mv.cache, mv.p
        mv.begin("prepare")
        with self.plock(cache, p):
            if self.states.get(cache, p) != State.MOVING:
                self.states.set(cache, p, State.MOVING, reason="move (files)")
            if mv.sink is not None:
                mv.sink.close()
                mv.sink = None
            mv.direct, mv.gap, mv.replayed = False, None, 0
            mv.replay_rate = mv.ingest_rate = mv.ingest_replay = 0.0
            mv.sink = TempWalSink.fresh(self.cfg.data, cache, p, sync=self._tmpwal_sync())
            mv.buffer_started = time.monotonic()
        prim_addr = self._primary_addr(mv)
        if prim_addr is None:
            return True                       # LOST, reported
        mv.begin("demand")
        self.pool.call(prim_addr, "register", cache=cache, p=p, node=self.id, address=self.cfg.address,
                       epoch=self._epoch(cache, p))
        crashpoint("demander.after_demand")
        res = self._fetch_file(mv, data)
        mv.snapshot_counter = res.counter
        crashpoint("demander.after_install")
        mv.begin("index rebuild")

        def progress(pr: Any) -> None:
            mv.index_progress = (pr.done, pr.total, pr.eta)
        self._rebuild_installed(mv, data, progress)
        mv.begin("replay")
        self._replay(mv, data)
        mv.begin("checkpoint wait")
        upto = data.counter(p)
        if not data.store.wait_checkpoint_covering(p, upto, timeout=CHECKPOINT_TIMEOUT_S):
            raise Unavailable(f"no checkpoint covered {cache}/{p} at {upto} in {CHECKPOINT_TIMEOUT_S}s")
        # Confirm: once register returns, every update the primary made is replicated here.
        theirs = int(self.pool.call(self._primary_addr(mv) or prim_addr, "register", cache=cache, p=p,
                                    node=self.id, address=self.cfg.address,
                                    epoch=self._epoch(cache, p))["counter"])
        crashpoint("demander.before_owning")
        with self.plock(cache, p):
            if mv.gap:
                raise MoveRestart(mv.gap)
            mine = data.counter(p)
            if mine < theirs:
                raise MoveRestart(f"{cache}/{p} at counter {mine} but the primary is at {theirs}")
            self.states.set(cache, p, State.OWNING, reason="files move complete")
            sink, mv.sink = mv.sink, None
            mv.buffered = sink.appended
        crashpoint("demander.after_owning")
        sink.destroy()
        mv.begin("owning")
        log.info("stage=owning cache=%s partition=%d from %s: %d bytes (%d on the wire), "
                 "%d updates replayed, counter %d, replay %.0f/s vs ingest %.0f/s before it, "
                 "stages %s", cache, p, mv.source, mv.bytes, mv.wire, mv.replayed, mine,
                 mv.replay_rate, mv.ingest_rate, mv.stage_seconds)
        self.metrics.inc("ferry_node_moves_done_total", cache=cache)
        self.metrics.inc("ferry_node_move_bytes_total", mv.wire, cache=cache)
        self.metrics.inc("ferry_node_replayed_updates_total", mv.replayed, cache=cache)
        self.metrics.inc("ferry_node_buffered_updates_total", mv.buffered, cache=cache)
        if mv.replayed:
            self.metrics.observe("ferry_node_replay_rate", mv.replay_rate)
        if mv.ingest_rate > 0:
            self.metrics.observe("ferry_node_tempwal_ingest_rate", mv.ingest_rate)
        return True

    def _rebuild_installed(self, mv: Any, data: Any, progress: Any) -> None:
        """Rebuild p's indexes from the file just installed, with the page decoder's bulk
        path (``PartitionFileSource.scan_batches``, ~3x cheaper per entry than scanning
        the store). Between install and replay that file is exactly p's content:

        - the pre-images were applied to the temp file before it was verified and
          renamed into place (transfer's demander), so it is the snapshot at counter C;
        - ``install_partition`` dropped p's page memory: no dirty page of p exists, so
          no checkpoint writes the file;
        - p is MOVING and not ``direct``: every replicated update goes to the temp WAL
          (``buffer_update``), this node is not p's primary (``leads`` wants OWNING),
          and the replay, the only writer of p's data, starts after this returns;
        - eviction waits while the move is registered (reconcile skips ``self.moves``).

        While a CPU is idle (``[rebalance] index_offload``), the scan goes to the node's
        scan pool (``index_workers`` processes, :class:`indexes.ScanPool`): decoding
        pages and parsing documents there leaves this process's GIL to the transfers,
        installs and replays of the other moves; this thread only serves page ranges,
        merges the sorted keys and loads LMDB.

        Should the file not read (a fault after install), the store, which reads the
        same pages through its page memory, is the fallback (in this process)."""
        from checkpoint.pagefile import CheckpointError
        from indexes import IndexStoreError, OutOfDiskError, PartitionFileSource, RebuildCancelled
        cache, p = mv.cache, mv.p
        path = data.store.partition_path(p)
        try:
            data.indexes.rebuild(p, PartitionFileSource(path), progress=progress,
                                 pool=self.scan_pool, cancel=lambda: mv.cancelled or self.stopping.is_set())
        except RebuildCancelled as e:
            raise Unavailable(f"index rebuild of {cache}/{p} stopped: {e}") from None
        except OutOfDiskError:
            raise                       # the index's disk: the store cannot help
        except (IndexStoreError, CheckpointError, OSError) as e:
            log.warning("stage=index cache=%s partition=%d rebuild from %s failed (%s); "
                        "rebuilding from the store", cache, p, path, e)
            data.indexes.rebuild(p, data.store, progress=progress)

    def _tmpwal_sync(self) -> str:
        return "none" if self.cfg.wal_sync == "none" else "group"

    def _epoch(self, cache: str, p: int) -> int:
        """The primary epoch (term) this node knows for p, carried by its DEMANDs."""
        with self.map_lock:
            return self.map.parts[cache][p].term

    def _primary_addr(self, mv: Any) -> str | None:
        cache, p = mv.cache, mv.p
        with self.map_lock:
            rec = self.map.parts[cache][p]
            prim = rec.primary
            addr = self.map.address(prim)
        if prim is None or prim == self.id or addr is None:
            if rec.lost:
                self.states.set(cache, p, State.LOST, reason="no in-sync copy left to pull from")
                log.error("stage=demand cache=%s partition=%d LOST: no in-sync copy left", cache, p)
                return None
            raise Unavailable(f"no primary for {cache}/{p} yet")
        return addr

    def _suppliers(self, cache: str, p: int) -> list[tuple[str, str]]:
        """OWNING, confirmed copies with a file supplier, least used by this node first."""
        with self.map_lock:
            m = self.map
            isr = m.parts[cache][p].isr
            nodes = [n for n in m.holders(cache, p, State.OWNING)
                     if n != self.id and n in isr and m.transfer_address(n)]
            out = [(n, m.transfer_address(n)) for n in nodes]
        random.shuffle(out)
        out.sort(key=lambda x: self.supplier_load.get(x[0], 0))
        return out  # type: ignore[return-value]

    def _fetch_file(self, mv: Any, data: Any) -> Any:
        from transfer import Demander, PartitionStoreStorage, TransferError
        cache, p = mv.cache, mv.p
        mv.begin("transfer")
        give_up = time.monotonic() + FETCH_GIVE_UP_S
        storage = PartitionStoreStorage({cache: data.store})

        self._check_page_size(mv)

        pool = self.scan_pool

        def progress(pr: Any) -> None:
            if pool is not None and pr.total and pool.wants(pr.total):
                pool.warm()     # once per node: the workers' start runs during the transfer
            if pr.stage in ("verify", "install", "applied") and mv.stage != "install":
                mv.begin("install")
            mv.bytes, mv.bytes_total, mv.wire = pr.done, pr.total, mv.wire_before + pr.wire
        while True:
            for node, addr in self._suppliers(cache, p):
                if mv.cancelled or self.stopping.is_set():
                    raise Unavailable("move cancelled")
                if mv.gap:
                    raise MoveRestart(mv.gap)
                mv.source, mv.wire_before = node, mv.wire
                self.supplier_load[node] = self.supplier_load.get(node, 0) + 1
                try:
                    res = Demander(storage, addr, self.secret, limits=self.recv_limits,
                                   timeout=30.0).fetch(p, cache=cache, progress=progress)
                    mv.bytes = mv.bytes_total = res.bytes
                    mv.wire = mv.wire_before + res.bytes_wire
                    mv.transfer_stages = {k: round(v, 3) for k, v in res.stages.items()}
                    return res
                except (TransferError, OSError) as e:
                    log.warning("stage=transfer cache=%s partition=%d from %s (%s) failed: %s; "
                                "trying another owner", cache, p, node, addr, e)
                    mv.begin("transfer")
                finally:
                    self.supplier_load[node] -= 1
            if time.monotonic() > give_up:
                raise Unavailable(f"no owner could supply {cache}/{p} for {FETCH_GIVE_UP_S:.0f}s")
            self.stopping.wait(0.5)

    def _check_page_size(self, mv: Any) -> None:
        """A file moves only between stores of one page size; else the move falls back
        to the messages mode (entries travel, this store writes its own pages)."""
        for node, _ in self._suppliers(mv.cache, mv.p)[:1]:
            with self.map_lock:
                addr = self.map.address(node)
                mem = self.map.members.get(node)
            if addr is None:
                return
            # a process keeps its page size: ask each boot of a node once, not per move
            known = self.page_sizes
            key = (node, mem.boot if mem else None, addr)
            theirs = known.get(key)
            if theirs is None:
                theirs = known[key] = self.pool.call(addr, "ping", timeout=5.0).get(
                    "page_size", self.cfg.page_size)
            if theirs != self.cfg.page_size:
                raise FilesImpossible(f"{node} stores {theirs}-byte pages, this node "
                                      f"{self.cfg.page_size}-byte pages: files cannot move")

    def _replay(self, mv: Any, data: Any) -> None:
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
        cache, p, sink = mv.cache, mv.p, mv.sink
        cursor = sink.cursor(sink.wal.first_lsn)
        t0 = mv.replay_started = time.monotonic()
        cpu0 = time.thread_time()
        at_start = sink.appended
        mv.ingest_rate = at_start / max(t0 - mv.buffer_started, 1e-6)

        def rates() -> None:
            span = max(time.monotonic() - t0, 1e-6)
            mv.replay_cpu = time.thread_time() - cpu0
            mv.replay_from_disk = cursor.from_disk
            mv.replay_rate = mv.replayed / span
            mv.ingest_replay = (sink.appended - at_start) / span
        try:
            while True:
                if mv.cancelled or self.stopping.is_set():
                    raise Unavailable("move cancelled")
                limit = self.cfg.replay_rate_limit
                if sink.last_lsn - cursor.next + 1 < TAIL:
                    break
                # with a replay rate limit (records/s): batches of a tenth of a second
                batch = cursor.read(max(TAIL, limit // 10) if limit else REPLAY_RECORDS,
                                    REPLAY_BYTES)
                self._apply_records(mv, data, batch)
                if limit:
                    ahead = mv.replayed / limit - (time.monotonic() - t0)
                    if ahead > 0:
                        self.stopping.wait(ahead)
                rates()
                crashpoint("demander.mid_replay")
            with self.plock(cache, p):      # brief: the last few records, then the switch
                tail = cursor.read(None)    # appends hold this lock: this is all of them
                self._apply_records(mv, data, tail)
                crashpoint("demander.mid_replay")
                mv.direct = True
                rates()
        finally:
            cursor.close()

    def _apply_records(self, mv: Any, data: Any, records: list[Any]) -> None:
        """Apply a batch of temp-WAL records of the replay (index changes in one
        commit, no node-WAL records: see :meth:`_replay`)."""
        p = mv.p
        cur = data.counter(p)
        todo = []
        for lsn, u in records:
            if u.counter > cur:
                if u.counter != cur + 1:
                    raise MoveRestart(f"{mv.cache}/{p}: buffered updates jump from {cur} to "
                                      f"{u.counter} (an update was missed); restarting the move")
                todo.append((u.key, u.value, u.counter))
                cur = u.counter
        mv.replayed += apply_chunked(data, p, todo, REPLAY_RECORDS, REPLAY_BYTES, logged=False)
        if records:
            mv.sink.replayed = records[-1][0]

    def buffer_update(self, mv: Any, cache: str, p: int, key: bytes, value: bytes | None,
                      counter: int, prev: int, durable: bool = True) -> str:
        """op_replicate for a MOVING copy (partition lock held). ``durable=False``
        (a replicated batch): the caller calls ``mv.sink.sync()`` before answering."""
        if mv.direct:
            data = self.data[cache]
            if data.counter(p) != prev:
                mv.gap = (f"{cache}/{p}: replicated update {counter} follows {prev} but the copy is at "
                          f"{data.counter(p)}; restarting the move")
                return "absent"
            data.apply(p, key, value, counter)
            return "applied"
        mv.sink.append(counter, key, value, durable=durable)
        return "buffered"

    def backpressure(self, mv: Any, records: int = 1) -> None:
        """Called after the partition lock is released. While the replay runs, each
        acknowledgement of the partition waits 3 / (replay rate) per record it carried
        (a replicated batch: ``records``): the primary replicates under its partition
        lock, so the partition then takes at most a third of the replay rate and the
        backlog shrinks by at least two thirds of it - a sustained write load cannot
        keep the move from finishing."""
        sink = mv.sink
        if sink is None or mv.stage != "replay" or mv.direct:
            return
        # On for the whole replay, not above a threshold: with a threshold the backlog
        # settles just above it and the tail (< TAIL records) is never reached.
        if sink.backlog() > 0:
            # a batch may wait longer: its replicate timeout is 4x the single one's
            cap = BACKPRESSURE_MAX_S * (4 if records > 1 else 1)
            delay = min(cap, 3.0 * records / mv.replay_rate if mv.replay_rate > 0 else 0.01)
            self.metrics.inc("ferry_node_backpressure_seconds_total", delay, cache=mv.cache)
            time.sleep(delay)

    # -- primary / supplier ------------------------------------------------------------
    def op_register(self, cache: str, p: int, node: str, address: str,
                    epoch: int | None = None) -> dict[str, Any]:
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


def make_supplier_storage(node: Any) -> Any:
    """transfer's PartitionStoreStorage limited to partitions this node OWNS (confirmed),
    counting open snapshots so an eviction waits until no transfer reads the file."""
    from transfer import NotHeld, PartitionStoreStorage

    class NodeSupplierStorage(PartitionStoreStorage):
        def open_snapshot(self, cache: str, partition: int) -> Any:
            why = node.can_supply(cache, partition) if cache in node.data else f"no cache {cache!r}"
            if why:
                raise NotHeld(why, partition=partition)
            key = (cache, partition)
            snap = super().open_snapshot(cache, partition)
            node.in_use[key] = node.in_use.get(key, 0) + 1
            inner = snap._close

            def close() -> None:
                try:
                    inner()
                finally:
                    node.in_use[key] -= 1
            snap._close = close
            return snap

    return NodeSupplierStorage({name: d.store for name, d in node.data.items()})


def start_supplier(node: Any) -> str:
    """Start the node's file supplier; returns the address to advertise."""
    from transfer import Limits, SupplierServer
    rate = node.cfg.transfer_rate_limit or None
    node.send_limits = Limits(node.cfg.transfer_concurrency, rate)
    host, port = node.cfg.supplier_listen
    node.supplier = SupplierServer(make_supplier_storage(node), node.secret, host, port,
                                   limits=node.send_limits, timeout=30.0).start()
    adv_host = node.cfg.address.rpartition(":")[0]
    return f"{adv_host}:{node.supplier.address[1]}"


__all__ = ["FileMoves", "MoveRestart", "FilesImpossible", "start_supplier", "make_supplier_storage"]
