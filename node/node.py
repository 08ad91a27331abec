"""The node process: storage recovery, the data-dir lock, the RPC server, and the
handlers every request is dispatched to.

Start-up order (nothing is served before recovery ends):
lock ``DATA/LOCK`` -> check/write ``DATA/node.id`` -> open every cache (checkpoint +
WAL recovery) -> load partition states -> listen -> register in the control plane
(etcd; the first node creates the cluster) -> watch the map, reconcile, metrics.
SIGTERM: stop serving, checkpoint every cache, close, exit 0.
"""
from __future__ import annotations

import collections
import fcntl
import logging
import os
import threading
import time
import uuid
from typing import Any, Callable

from faults import fileio

from . import metrics as metrics_mod
from .cluster_map import ClusterMap
from .config import NodeConfig
from .errors import BadRequest, DataDirLocked, NodeError
from .membership import SETTINGS, Membership, require_control_plane
from .move import STAGES
from .rebalance import Rebalancer
from .rpc import RpcServer
from .states import State, StateTable
from . import tempwal
from .filemove import start_supplier
from .storage import CacheData, check_data_dir, open_lock_file, read_node_id
from .updates import UpdatePath
from .wire import Pool, load_secret

log = logging.getLogger("ferry.node")
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


class Node(Membership, UpdatePath, Rebalancer):
    def __init__(self, cfg: NodeConfig) -> None:
        self.cfg = cfg
        self.id = cfg.id
        self.boot = uuid.uuid4().hex[:12]
        # the data dir first: a problem there is named before one with the secret
        self._lock_fd = lock_data_dir(cfg.data)
        try:
            claim_node_id(cfg.data, cfg.id)
            self.secret = load_secret(cfg.secret_file)
        except BaseException:
            os.close(self._lock_fd)
            raise
        self.metrics = metrics_mod.Metrics()
        self.stopping, self.joined, self.leaving, self.left = (threading.Event() for _ in range(4))
        self._reconcile_event, self._controller_wake, self._report_dirty = (threading.Event() for _ in range(3))
        self.map_lock = threading.RLock()
        self.map = ClusterMap({c.name: c for c in cfg.caches})
        self.controller = None                 # node.controller.Controller while elected
        self._isr_joins: set[tuple[str, int]] = set()
        self._map_changed = threading.Condition()
        self._pending_requests: set[str] = set()
        self._report_lock = threading.Lock()
        self._plocks: dict[tuple[str, int], threading.RLock] = {}
        self._plocks_lock = threading.Lock()
        self.fenced: dict[tuple[str, int], float] = {}
        self.copies: dict[tuple[str, int], dict[str, str]] = {}
        self.sessions: dict[str, Any] = {}
        self.moves: dict[tuple[str, int], Any] = {}
        self.moves_lock = threading.Lock()
        self.moves_done: collections.deque[dict[str, Any]] = collections.deque(maxlen=4096)
        self.handoffs: set[tuple[str, int]] = set()
        self.last_applied: dict[tuple[str, int], float] = {}
        self.supplier_load: dict[str, int] = {}           # fetches of this node per supplier
        self.page_sizes: dict[tuple, int] = {}            # supplier (node, boot, addr) -> page size
        self.in_use: dict[tuple[str, int], int] = {}      # open transfer snapshots per partition
        # index rebuilds of files moves scan in these processes (started on the first move)
        from indexes import ScanPool
        self.scan_pool = (ScanPool(cfg.index_workers, min_bytes=cfg.index_offload_min_bytes,
                                   when=cfg.index_offload) if cfg.index_workers > 0 else None)
        self.supplier = None
        self.transfer_address = ""
        from transfer import Limits
        self.recv_limits = Limits(cfg.transfer_concurrency, cfg.transfer_rate_limit or None)
        self.send_limits = None
        t0 = time.monotonic()
        clean_marker = os.path.join(cfg.data, CLEAN)
        clean = os.path.exists(clean_marker)
        if clean:
            fileio.layer().unlink(clean_marker)
            fileio.layer().fsync_dir(cfg.data)
        self.data = {c.name: CacheData(cfg, c, clean=clean) for c in cfg.caches}   # recovery here
        self.states = StateTable(cfg.data, on_change=self._state_changed)
        self._finish_interrupted()
        log.info("stage=recovery node=%s recovered %d cache(s) in %.2fs", self.id,
                 len(self.data), time.monotonic() - t0)
        self.pool = Pool(self.secret, role="node")
        self.server: RpcServer | None = None
        self.http = None
        self.metrics.collectors.append(self._collect)

    def plock(self, cache: str, p: int) -> threading.RLock:
        with self._plocks_lock:
            return self._plocks.setdefault((cache, p), threading.RLock())

    def _finish_interrupted(self) -> None:
        """A crash may leave RENTING partitions whose data is not yet deleted, and temp
        WALs: of an OWNING partition (crash after OWNING) or of a MOVING one, whose
        move starts over (updates missed while down make the old buffer useless)."""
        for cache, p in tempwal.leftovers(self.cfg.data):
            log.info("stage=recovery cache=%s partition=%d deleting the temp WAL left by a crash "
                     "(state %s)", cache, p, self.states.get(cache, p))
            tempwal.remove(self.cfg.data, cache, p)
        for (cache, p), s in self.states.items():
            if s == State.RENTING:
                self.data[cache].drop(p)
                self.states.set(cache, p, State.EVICTED, reason="eviction resumed at restart")
            elif s in (State.EVICTED, State.LOST) and p in self.data[cache].partitions():
                self.data[cache].drop(p)

    def _state_changed(self, cache: str, p: int, old: State | None, new: State) -> None:
        log.info("stage=state cache=%s partition=%d %s -> %s", cache, p, old.value if old else "absent", new.value)
        self._report_dirty.set()

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> None:
        require_control_plane(self.cfg)       # say so before binding anything
        self.server = RpcServer(self.cfg.listen, self.secret, self.dispatch)
        self.server.start()
        self.transfer_address = start_supplier(self)
        log.info("stage=serving node=%s file supplier on %s", self.id, self.transfer_address)
        self.connect_control_plane()
        self.joined.set()
        threading.Thread(target=self._reconcile_loop, name="reconcile", daemon=True).start()
        if self.cfg.metrics_listen:
            self.http = metrics_mod.serve(self.cfg.metrics_listen, self.metrics)
        from .watch import Watcher
        self.watcher = Watcher(self)
        self.watcher.start()
        self.wake()
        log.info("stage=serving node=%s listening on %s", self.id, self.cfg.listen)

    def stop(self) -> None:
        """Graceful: stop serving, checkpoint, close. The data dir lock goes last."""
        self.stopping.set()
        if getattr(self, "watcher", None) is not None:
            self.watcher.stop()
        self._reconcile_event.set()
        self._controller_wake.set()
        self.stop_control_plane(leave=self.left.is_set())
        if self.server:
            self.server.stop()
        if self.supplier:
            self.supplier.stop()
        if self.scan_pool is not None:
            self.scan_pool.close()
        if self.http:
            self.http.shutdown()
        for name, d in self.data.items():
            t0 = time.monotonic()
            try:
                d.checkpoint()
            except Exception as e:
                log.error("stage=shutdown cache=%s checkpoint failed: %s", name, e)
            self.metrics.observe("ferry_node_checkpoint_seconds", time.monotonic() - t0)
            d.close()
        fileio.atomic_write(os.path.join(self.cfg.data, CLEAN), b"clean\n")
        self.pool.close()
        os.close(self._lock_fd)
        log.info("stage=shutdown node=%s stopped", self.id)

    # -- dispatch -----------------------------------------------------------------
    def dispatch(self, method: str, args: dict[str, Any], role: str) -> Any:
        fn: Callable[..., Any] | None = getattr(self, "op_" + method, None) if method in METHODS else None
        if fn is None:
            raise BadRequest(f"unknown method {method!r}")
        if role != "node" and method not in CLIENT_METHODS:
            raise BadRequest(f"method {method!r} is for nodes only")
        return fn(**args)

    # membership handlers
    def op_ping(self) -> dict[str, Any]:
        return {"id": self.id, "boot": self.boot, "epoch": self.map.epoch,
                "page_size": self.cfg.page_size, "controller": self.map.controller,
                "lease_valid": self.session.valid() if hasattr(self, "session") else False,
                "settings": {name: getattr(self.cfg, fld) for name, fld in SETTINGS.items()}}

    def op_get_map(self) -> dict[str, Any]:
        with self.map_lock:
            return self.map.to_wire()

    def op_leave(self, node: str | None = None) -> bool:
        """Asked of any node: that node (default this one) leaves gracefully."""
        if node not in (None, self.id):
            with self.map_lock:
                addr = self.map.address(node)
            if addr is None:
                raise BadRequest(f"no member {node!r}")
            return self.pool.call(addr, "leave")
        self.start_leave()
        self.wake()
        return True

    def apply_live_config(self, old: NodeConfig, new: NodeConfig) -> None:
        """Settings that change without a restart (watch.py reloads the file)."""
        rate = new.transfer_rate_limit or None
        for lim in (self.recv_limits, self.send_limits):
            if lim is not None:
                lim.set_rate(rate)
                lim.set_max_transfers(new.transfer_concurrency)
        if new.checkpoint_interval_s != old.checkpoint_interval_s:
            for d in self.data.values():
                d.store.set_checkpoint_interval(new.checkpoint_interval_s)
        logging.getLogger().setLevel(getattr(logging, new.log_level.upper(), logging.INFO))

    def op_moves_done(self) -> list[dict[str, Any]]:
        """Moves that ended OWNING on this node since it started (the last 4096)."""
        return list(self.moves_done)

    def op_moves(self) -> list[dict[str, Any]]:
        return [mv.status(self.id) for mv in list(self.moves.values())]

    def op_metrics(self) -> str:
        return self.metrics.render()

    def _collect(self, m: metrics_mod.Metrics) -> None:
        counts: dict[tuple[str, str], int] = {}
        for (cache, _), s in self.states.items():
            counts[(cache, s.value)] = counts.get((cache, s.value), 0) + 1
        for cache in self.data:
            for s in State:
                m.set("ferry_node_partitions", counts.get((cache, s.value), 0), cache=cache, state=s.value)
        m.set("ferry_node_moves_in_progress", len(self.moves))
        by_stage: dict[str, int] = {}
        for mv in list(self.moves.values()):
            by_stage[mv.stage] = by_stage.get(mv.stage, 0) + 1
            m.set("ferry_node_move_bytes_in_progress", mv.wire if mv.mode == "files" else mv.bytes,
                  cache=mv.cache, partition=str(mv.p))
            sink = mv.sink
            if sink is not None and mv.mode == "files":
                b = sink.backlog()
                m.set("ferry_node_replay_backlog", b, cache=mv.cache, partition=str(mv.p))
                if mv.replay_rate > 0:
                    m.set("ferry_node_replay_lag_seconds", b / mv.replay_rate, cache=mv.cache,
                          partition=str(mv.p))
                m.set("ferry_node_tempwal_ingest", mv.ingest_now(), cache=mv.cache, partition=str(mv.p))
        for stage in STAGES:
            m.set("ferry_node_moves_by_stage", by_stage.get(stage, 0), stage=stage)
        m.set("ferry_node_topology_version", self.map.version)
        sess = getattr(self, "session", None)
        m.set("ferry_node_lease_valid", 1 if sess is not None and sess.valid() else 0)
        m.set("ferry_node_is_controller", 1 if self.controller is not None else 0)
        now = time.time()
        for (cache, p), t in list(self.last_applied.items()):
            m.set("ferry_node_replication_lag_seconds", now - t, cache=cache, partition=str(p))


CLIENT_METHODS = {"ping", "get_map", "put", "put_batch", "get", "remove", "lookup", "range", "moves",
                  "moves_done",
                  "metrics", "leave"}
METHODS = CLIENT_METHODS | {"join_isr", "replicate", "replicate_batch", "demand", "fetch", "demand_done", "register", "pin",
                            "handoff", "unfence"}
