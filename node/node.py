"""The node process: storage recovery, the data-dir lock, the RPC server, and the
handlers every request is dispatched to.

Start-up order (nothing is served before recovery ends):
lock ``DATA/LOCK`` -> check/write ``DATA/node.id`` -> open every cache (checkpoint +
WAL recovery) -> load partition states -> listen -> register in the control plane
(etcd; the first node creates the cluster) -> watch the map, reconcile, metrics.
SIGTERM: stop serving, checkpoint every cache, close, exit 0.
"""
from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
import uuid

from faults import fileio
from transfer import auth
from transfer.tls import TlsContexts, TlsError

from . import metrics as metrics_mod
from . import tempwal
from .cluster_map import ClusterMap
from .config import NodeConfig, tls_files
from .context import Events, MapHolder, MoveTable, NodeContext, PartitionLocks, Replication
from .admission import nice_this_thread
from .errors import BadRequest, ConfigError, DataDirLocked, NodeError
from .membership import SETTINGS, ControlPlane, require_control_plane
from .move import STAGES
from .ports import Handler
from .rebalance import Rebalancer
from .reconcile import Reconciler
from .rpc import RpcServer
from .rpcapi import (CLIENT_METHODS, MOVES_PAGE, NODE_CLAIMS, Leave, MapPage, PingReply, Req,
                     decode_request, encode_reply)
from .livevalidate import LiveValidation
from .states import State, StateTable
from .storage import CacheData, check_data_dir, open_lock_file, read_node_id
from .updates import UpdatePath
from .watch import Watcher
from .wire import Pool, load_secret

log = logging.getLogger("ferry.node")


def load_tls(cfg: NodeConfig) -> TlsContexts | None:
    """The node's TLS contexts from [tls] (None: not configured), or ConfigError naming
    the file that does not load. The certificate must be a node's, for this node's id."""
    files = tls_files(cfg)
    if files is None:
        return None
    try:
        tls = TlsContexts(files)
    except TlsError as e:
        raise ConfigError(f"[tls]: {e.reason}") from None
    if tls.identity.role != "node" or tls.identity.name != cfg.id:
        raise ConfigError(f"[tls] cert {files.cert} is for {tls.identity}, not node {cfg.id!r}: "
                          f"issue one with `ferry certs issue CA_DIR {cfg.id} --node`")
    return tls


INDEX_CATCH_UP_DELAY_S = 2.0   # after serving starts: resyncs are decided first
CLEAN = "clean-shutdown"   # present only after a graceful stop: indexes need no rebuild


def lock_data_dir(data: str) -> int:
    check_data_dir(data)
    fd = open_lock_file(data)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 256).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise DataDirLocked(f"data dir {data} is in use by {holder}; stop that node first "
                            "(two nodes on one data dir would corrupt it)") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()}\n".encode())
    return fd


def claim_node_id(data: str, node_id: str) -> None:
    have = read_node_id(data)
    if have is None:
        fileio.atomic_write(os.path.join(data, "node.id"), (node_id + "\n").encode())
        return
    if have != node_id:
        raise NodeError(f"data dir {data} belongs to node {have!r}, not {node_id!r}; "
                        "use that id or another data dir")


def _warm_up(secret: bytes) -> None:
    """Run while recovery reads the data: the handshake key of the shared secret (scrypt,
    slow on purpose and run without the GIL, so on another core) that the RPC server and
    the file supplier derive when they start, and the imports of the control plane
    client and of the placement table (numpy), which the map needs once it loads.
    All would otherwise wait for recovery and then delay serving (docs/node.md,
    "Starting a node"). A failure here is left for the real use to raise with its own message."""
    try:
        if secret:
            auth.handshake_key(secret)
        import etcd3gw  # noqa: F401  (node.control imports it when it connects)

        from . import placement  # noqa: F401  (numpy: the map's first placement)
    except Exception as e:  # noqa: BLE001 - only a head start; start() meets it again
        log.debug("stage=start warm-up: %r", e)


class Node:
    """One node process: builds the shared :class:`NodeContext` and the parts that use
    it (control plane, update path, reconcile loop, rebalancer), and owns only the
    lifecycle (recovery, start, stop) and the one table of RPC handlers."""

    def __init__(self, cfg: NodeConfig) -> None:
        # the data dir first: a problem there is named before one with the secret
        lock_fd = lock_data_dir(cfg.data)
        try:
            claim_node_id(cfg.data, cfg.id)
            tls = load_tls(cfg)
            # with TLS the certificates authenticate every connection: no secret is read
            secret = b"" if tls is not None else load_secret(cfg.secret_file)
        except BaseException:
            os.close(lock_fd)
            raise
        self._lock_fd = lock_fd
        t0 = time.monotonic()
        # what start() needs after recovery and that touches no data, done meanwhile. Not
        # a daemon: a start that fails at once (a damaged data dir) exits only after it,
        # never while it runs C code (scrypt, an import) as the interpreter shuts down
        threading.Thread(target=_warm_up, args=(secret,), name="start-warm-up").start()
        clean_marker = os.path.join(cfg.data, CLEAN)
        clean = os.path.exists(clean_marker)
        if clean:
            fileio.layer().unlink(clean_marker)
            fileio.layer().fsync_dir(cfg.data)
        data = {c.name: CacheData(cfg, c, clean=clean) for c in cfg.caches}   # recovery here
        self.ctx = ctx = NodeContext(
            cfg=cfg, id=cfg.id, boot=uuid.uuid4().hex[:12], secret=secret,
            metrics=metrics_mod.Metrics(), data=data,
            states=StateTable(cfg.data, on_change=self._state_changed),
            pool=Pool(secret, role="node", tls=tls, expect=self._member_at),
            map=MapHolder(ClusterMap({c.name: c for c in cfg.caches})),
            plock=PartitionLocks(), events=Events(), repl=Replication(), moves=MoveTable(), tls=tls)
        self.control = ControlPlane(ctx, on_settings=self.apply_live_config)
        self.updates = UpdatePath(ctx, self.control)
        self.rebalancer = Rebalancer(ctx, self.control, self.updates)
        self.updates.bind(self.rebalancer)
        self.reconciler = Reconciler(ctx, self.control, self.rebalancer)
        self._finish_interrupted()
        # every copy held OWNING before this start is unconfirmed until the controller
        # or its primary says otherwise (its files may have gone back in time: a
        # restored backup, a disk that lost writes): docs/node.md, "Returning copies"
        ctx.returning = {k for k, s in ctx.states.items() if s == State.OWNING}
        log.info("stage=recovery node=%s recovered %d cache(s) in %.2fs", cfg.id,
                 len(data), time.monotonic() - t0)
        self.server: RpcServer | None = None
        self.http: metrics_mod.MetricsServer | None = None
        self._indexer: threading.Thread | None = None
        self.watcher: Watcher | None = None
        self.live_validation = LiveValidation.of(ctx, self.updates.leads)   # docs/validation.md
        self.handlers: dict[str, Handler] = {
            **self.updates.handlers(), **self.rebalancer.handlers(),
            **self.live_validation.handlers,
            "ping": self.op_ping, "get_map": self.op_get_map, "leave": self.op_leave,
            "moves": self.op_moves, "moves_done": self.op_moves_done, "metrics": self.op_metrics}
        ctx.metrics.collectors.append(self._collect)

    # -- recovery -------------------------------------------------------------------
    def _finish_interrupted(self) -> None:
        """A crash may leave RENTING partitions whose data is not yet deleted, and temp
        WALs: of an OWNING partition (crash after OWNING) or of a MOVING one, whose
        move starts over (updates missed while down make the old buffer useless)."""
        ctx = self.ctx
        for cache, p in tempwal.leftovers(ctx.cfg.data):
            log.info("stage=recovery cache=%s partition=%d deleting the temp WAL left by a crash "
                     "(state %s)", cache, p, ctx.states.get(cache, p))
            tempwal.remove(ctx.cfg.data, cache, p)
        for (cache, p), s in ctx.states.items():
            if s == State.RENTING:
                ctx.data[cache].drop(p)
                ctx.states.set(cache, p, State.EVICTED, reason="eviction resumed at restart")
            elif s in (State.EVICTED, State.LOST) and p in ctx.data[cache].partitions():
                ctx.data[cache].drop(p)

    def _state_changed(self, cache: str, p: int, old: State | None, new: State) -> None:
        if new != State.OWNING:
            self.ctx.returning.discard((cache, p))     # a copy that moves again is a new one
        log.info("stage=state cache=%s partition=%d %s -> %s", cache, p, old.value if old else "absent", new.value)
        # (called while the context is being built, by nothing but later changes)
        control = getattr(self, "control", None)
        if control is not None:
            control.report_changed(cache, p)
        else:
            self.ctx.events.report_dirty.set()
        self.ctx.map.dirty.add([(cache, p)])
        self.ctx.wake()

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> None:
        ctx = self.ctx
        require_control_plane(ctx.cfg)       # say so before binding anything
        self.server = RpcServer(ctx.cfg.listen, ctx.secret, self.dispatch, tls=ctx.tls,
                                claims=NODE_CLAIMS)
        self.server.start()
        ctx.transfer_address = self.rebalancer.start_supplier()
        log.info("stage=serving node=%s file supplier on %s", ctx.id, ctx.transfer_address)
        self.control.connect()
        ctx.events.joined.set()
        threading.Thread(target=self.reconciler.run, name="reconcile", daemon=True).start()
        if ctx.cfg.metrics_listen:
            self.http = metrics_mod.serve(ctx.cfg.metrics_listen, ctx.metrics)
        self.watcher = Watcher(ctx, self.apply_live_config)
        self.watcher.start()
        if any(d.stale_indexes() for d in ctx.data.values()):
            self._indexer = threading.Thread(target=self._rebuild_stale_indexes,
                                             name="index-catch-up", daemon=True)
            self._indexer.start()
        ctx.wake()
        log.info("stage=serving node=%s listening on %s", ctx.id, ctx.cfg.listen)

    def _rebuild_stale_indexes(self) -> None:
        """After an unclean stop, the indexes start-up did not trust, one partition at a
        time, at a low CPU priority, while the node serves: each under p's lock, only
        for a copy held OWNING that no move replaces (a move rebuilds the index of the
        file it installs; a write or an index read of p rebuilds it first anyway).
        Waits INDEX_CATCH_UP_DELAY_S first, so the copies the cluster no longer counts
        in sync are resyncing (MOVING) before this pass reaches them."""
        ctx = self.ctx
        nice_this_thread()                # yields to the write path as a move does
        if ctx.events.stopping.wait(INDEX_CATCH_UP_DELAY_S):
            return
        done = 0
        t0 = time.monotonic()
        for cache, d in ctx.data.items():
            for p in d.stale_indexes():
                if ctx.events.stopping.is_set():
                    return
                with ctx.plock(cache, p):
                    if ((cache, p) in ctx.moves or ctx.states.get(cache, p) != State.OWNING
                            or d.index_current(p)):
                        continue
                    try:
                        done += d.catch_up_index(p, cancel=ctx.events.stopping.is_set)
                    except Exception as e:  # noqa: BLE001 - p stays stale: its next change retries
                        if ctx.events.stopping.is_set():
                            return
                        log.warning("stage=storage cache=%s partition=%d index rebuild failed "
                                    "(%s); it is rebuilt before the partition's next change",
                                    cache, p, e)
        log.info("stage=storage node=%s %d indexes not trusted after an unclean stop rebuilt "
                 "in %.2fs", ctx.id, done, time.monotonic() - t0)

    def stop(self) -> None:
        """Graceful: stop serving, checkpoint, close. The data dir lock goes last."""
        ctx = self.ctx
        ctx.events.stopping.set()
        if self.watcher is not None:
            self.watcher.stop()
        ctx.events.reconcile.set()
        ctx.events.controller_wake.set()
        self.control.stop(leave=ctx.events.left.is_set())
        if self.server:
            self.server.stop()
        self.rebalancer.stop()
        self.updates.stop()
        if self.http:
            self.http.shutdown()
        if self._indexer is not None:
            self._indexer.join()          # a rebuild in progress ends at its next batch
        for name, d in ctx.data.items():
            t0 = time.monotonic()
            try:
                d.checkpoint()
            except Exception as e:  # noqa: BLE001 - shutdown goes on: the WAL has every update
                log.error("stage=shutdown cache=%s checkpoint failed: %s", name, e)
            ctx.metrics.observe("ferry_node_checkpoint_seconds", time.monotonic() - t0)
            d.close()
        fileio.atomic_write(os.path.join(ctx.cfg.data, CLEAN), b"clean\n")
        ctx.pool.close()
        os.close(self._lock_fd)
        log.info("stage=shutdown node=%s stopped", ctx.id)

    def _member_at(self, address: str) -> str | None:
        """The node id a TLS peer at ``address`` must have (ClusterMap.member_at; None
        when the map lists no member there: any node of the CA)."""
        ctx = getattr(self, "ctx", None)
        if ctx is None:
            return None
        with ctx.map.lock:
            return ctx.map.map.member_at(address)

    # -- dispatch -----------------------------------------------------------------
    def dispatch(self, method: str, args: dict[str, object], role: str) -> object:
        """One request: its arguments decoded by the method's request class
        (node/rpcapi.py), the cache and partition it names checked against this
        node's, then its handler called with the decoded arguments."""
        fn = self.handlers.get(method)
        if fn is None:
            raise BadRequest(f"unknown method {method[:64]!r}")
        req = decode_request(method, args, role)
        self._check_target(req)
        return encode_reply(fn(**req.kwargs()))

    def _check_target(self, req: Req[object]) -> None:
        cache = getattr(req, "cache", None)
        if cache is None:
            return
        data = self.ctx.data.get(cache)
        if data is None:
            raise BadRequest(f"unknown cache {cache!r}; caches: {', '.join(self.ctx.data)}")
        p = getattr(req, "p", None)
        if p is not None and p >= data.cache.partitions:
            raise BadRequest(f"partition {p} is out of range for cache {cache!r} "
                             f"({data.cache.partitions} partitions)")

    # membership handlers
    def op_ping(self) -> PingReply:
        ctx = self.ctx
        return PingReply(id=ctx.id, boot=ctx.boot, epoch=ctx.map.map.epoch, page_size=ctx.cfg.page_size,
                         controller=ctx.map.map.controller, lease_valid=ctx.lease_valid(),
                         settings={name: getattr(ctx.cfg, fld) for name, fld in SETTINGS.items()})

    def op_get_map(self, start: int = 0, count: int | None = None) -> MapPage:
        """The map, or one page of its partitions (``ClusterMap.fetch`` reads them all);
        at most ClusterMap.PAGE partitions per reply, whatever is asked."""
        count = ClusterMap.PAGE if count is None else min(count, ClusterMap.PAGE)
        with self.ctx.map.lock:
            return MapPage(self.ctx.map.map.to_wire(start, count))

    def op_leave(self, node: str | None = None) -> bool:
        """Asked of any node: that node (default this one) leaves gracefully."""
        if node not in (None, self.ctx.id):
            addr = self.ctx.map.address(node)
            if addr is None:
                raise BadRequest(f"no member {node!r}")
            return self.ctx.pool.request(addr, Leave())
        self.control.start_leave()
        self.ctx.wake()
        return True

    def apply_live_config(self, old: NodeConfig, new: NodeConfig) -> None:
        """Settings that change without a restart (watch.py reloads the file, the
        control plane applies cluster settings); ``ctx.cfg`` is already ``new``."""
        self.rebalancer.apply_limits(new)
        if new.checkpoint_interval_s != old.checkpoint_interval_s:
            for d in self.ctx.data.values():
                d.store.set_checkpoint_interval(new.checkpoint_interval_s)
        logging.getLogger().setLevel(getattr(logging, new.log_level.upper(), logging.INFO))

    def op_moves_done(self, start: int = 0, count: int = MOVES_PAGE) -> list[dict[str, object]]:
        """Moves that ended OWNING on this node since it started (the last 4096), oldest
        first, ``count`` (at most MOVES_PAGE: a reply stays far below the frame) from
        ``start``; fewer than asked means the end."""
        done = list(self.ctx.moves.done)
        return done[start:start + min(count, MOVES_PAGE)]

    def op_moves(self) -> list[dict[str, object]]:
        return [mv.status(self.ctx.id) for mv in self.ctx.moves.moves()]

    def op_metrics(self) -> str:
        return self.ctx.metrics.render()

    def _collect(self, m: metrics_mod.Metrics) -> None:
        ctx = self.ctx
        counts: dict[tuple[str, str], int] = {}
        for (cache, _), s in ctx.states.items():
            counts[(cache, s.value)] = counts.get((cache, s.value), 0) + 1
        for cache in ctx.data:
            for s in State:
                m.set("ferry_node_partitions", counts.get((cache, s.value), 0), cache=cache, state=s.value)
        moves = [mv.progress() for mv in ctx.moves.moves()]
        m.set("ferry_node_moves_in_progress", len(moves))
        by_stage: dict[str, int] = {}
        for mv in moves:
            by_stage[mv.stage] = by_stage.get(mv.stage, 0) + 1
            m.set("ferry_node_move_bytes_in_progress", mv.fig.wire if mv.mode == "files" else mv.fig.bytes,
                  cache=mv.cache, partition=str(mv.p))
            if mv.buffering and mv.mode == "files":
                b = mv.backlog
                m.set("ferry_node_replay_backlog", b, cache=mv.cache, partition=str(mv.p))
                if mv.fig.replay_rate > 0:
                    m.set("ferry_node_replay_lag_seconds", b / mv.fig.replay_rate, cache=mv.cache,
                          partition=str(mv.p))
                m.set("ferry_node_tempwal_ingest", mv.ingest_now(), cache=mv.cache, partition=str(mv.p))
        for stage in STAGES:
            m.set("ferry_node_moves_by_stage", by_stage.get(stage, 0), stage=stage)
        m.set("ferry_node_topology_version", ctx.map.map.version)
        m.set("ferry_node_lease_valid", 1 if ctx.lease_valid() else 0)
        m.set("ferry_node_is_controller", 1 if self.control.controller is not None else 0)
        now = time.time()
        for (cache, p), t in ctx.repl.last_applied.items():
            m.set("ferry_node_replication_lag_seconds", now - t, cache=cache, partition=str(p))


# The methods a client certificate (role ``client``) may call, and the node-only
# methods whose argument names the calling node (over TLS the caller's certificate must
# name that node: node/rpc.py): both from the one table, node/rpcapi.py METHODS.
__all__ = ["Node", "CLIENT_METHODS", "NODE_CLAIMS", "MOVES_PAGE", "load_tls", "lock_data_dir",
           "claim_node_id"]
