"""The node's Prometheus metrics (``prometheus_client``), served on ``metrics_listen``.

:class:`Metrics` keeps one private registry per node. Every metric the node reports is
declared in :data:`METRICS` (type, help, label names); the update path calls
``inc``/``observe``/``set`` by the exposed name, as it did before the library. The
exposition is produced on each scrape, and gauges that are cheap to compute (partitions
by state, per-move backlog) are filled then by ``collectors`` (callbacks). :func:`serve`
runs the library's WSGI application on a bounded server thread (connections capped in
total and per peer host, each closed at a deadline); :meth:`Metrics.render` returns
the same text for the ``metrics`` RPC.
"""
from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from socketserver import ThreadingMixIn
from typing import Any, Callable, Iterable, Literal
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Summary, generate_latest, make_wsgi_app
from prometheus_client.registry import RestrictedRegistry

from faults import latch
from transfer.listener import ConnectionBudget, Every, process_budget

from .acklatency import LatencyWindow
from .config import parse_address

log = logging.getLogger("ferry.node.metrics")

# No ``<name>_created`` series: they would add a family per counter and summary to the
# exposition, which has the names and only the names listed below (docs/node.md). The
# switch is process-wide; in a node process this registry is the only user of the library.
prometheus_client.disable_created_metrics()

Kind = Literal["counter", "gauge", "summary"]

# exposed name -> (type, help, label names). Label names are in sorted order, which is
# the order the exposition has always printed them in.
METRICS: dict[str, tuple[Kind, str, tuple[str, ...]]] = {
    "ferry_node_updates_total": ("counter", "Acknowledged updates by cache and operation.", ("cache", "op")),
    "ferry_node_update_seconds": ("summary", "Time from receiving an update to its acknowledgement.", ()),
    "ferry_node_replication_failures_total": ("counter", "Updates not acknowledged because a backup failed.", ("cache",)),
    "ferry_node_replication_lag_seconds": ("gauge", "Seconds since a backup partition last applied an update.", ("cache", "partition")),
    "ferry_node_controller_requests_total": ("counter", "Requests this node put for the controller (in-sync changes, hand-offs).", ()),
    "ferry_node_controller_request_txns_total": ("counter", "etcd transactions that carried them (requests made together share one).", ()),
    "ferry_node_moves_done_total": ("counter", "Partitions that reached OWNING through a move.", ("cache",)),
    "ferry_node_move_bytes_total": ("counter", "Bytes received by moves (files: on the wire; messages: keys and values).", ("cache",)),
    "ferry_node_moves_by_copy_total": ("counter", "Files moves that reached OWNING by how the file came: full, resume (chunks held from an earlier attempt) or delta (only the pages that differ from the copy held here).", ("cache", "copy")),
    "ferry_node_delta_pages_total": ("counter", "Pages of delta moves that reached OWNING: sent (differed) or kept (the copy held here had them).", ("cache", "kind")),
    "ferry_node_moves_in_progress": ("gauge", "Moves running on this node.", ()),
    "ferry_node_moves_by_stage": ("gauge", "Moves running on this node by stage.", ("stage",)),
    "ferry_node_move_stage_seconds": ("summary", "Time moves spent in each stage.", ("stage",)),
    "ferry_node_replay_backlog": ("gauge", "Temp-WAL updates of a MOVING partition not yet replayed (replay lag).", ("cache", "partition")),
    "ferry_node_replay_lag_seconds": ("gauge", "Temp-WAL backlog divided by the replay rate.", ("cache", "partition")),
    "ferry_node_replayed_updates_total": ("counter", "Temp-WAL updates applied by replays of completed moves.", ("cache",)),
    "ferry_node_buffered_updates_total": ("counter", "Updates appended to temp WALs by completed moves.", ("cache",)),
    "ferry_node_replay_rate": ("summary", "Temp-WAL records/s applied by the replay of each completed move.", ()),
    "ferry_node_tempwal_ingest_rate": ("summary", "Records/s into a move's temp WAL before its replay (per completed move).", ()),
    "ferry_node_move_bytes_in_progress": ("gauge", "Bytes a running move has received so far (files: on the wire).", ("cache", "partition")),
    "ferry_node_lease_valid": ("gauge", "1 while this node's control-plane lease is valid (it may acknowledge writes as a primary).", ()),
    "ferry_node_is_controller": ("gauge", "1 on the node elected controller.", ()),
    "ferry_node_tempwal_ingest": ("gauge", "Records/s into the temp WAL of a running move (since it started buffering).", ("cache", "partition")),
    "ferry_node_backpressure_seconds_total": ("counter", "Delay added to acknowledgements so a replay catches up.", ("cache",)),
    "ferry_node_partitions": ("gauge", "Partitions on this node by cache and state.", ("cache", "state")),
    "ferry_node_checkpoint_seconds": ("summary", "Duration of checkpoints started by the node.", ()),
    "ferry_node_topology_version": ("gauge", "Topology version known to this node.", ()),
    # foreground protection (node/admission.py)
    "ferry_node_ack_latency_p99_seconds": ("gauge", "p99 of this node's write acknowledgement times over the last 0.5 s.", ()),
    "ferry_node_rebalance_latency_seconds": ("gauge", "The acknowledgement p99 foreground protection reacts to (the worst node its moves touch).", ()),
    "ferry_node_rebalance_latency_target_seconds": ("gauge", "The target that p99 is compared with.", ()),
    "ferry_node_rebalance_move_limit": ("gauge", "Moves this node may run at once now (foreground protection).", ()),
    "ferry_node_rebalance_transfer_rate_limit_bps": ("gauge", "Receive rate limit of this node's transfers now, bytes/s (0 = none).", ()),
    "ferry_node_rebalance_replay_rate_limit": ("gauge", "Temp-WAL replay limit per move now, records/s (0 = none).", ()),
    # failures the node outlives (faults/latch.py)
    "ferry_node_storage_failed": ("gauge", "1 while a storage component refuses writes: disk_full, read_only, out_of_fds (retried), other (needs a restart).", ("cause", "component", "path")),
    "ferry_node_storage_refusals_total": ("counter", "Requests refused for a full disk, a read-only file system or no file descriptors.", ("cause",)),
}

_CLASSES = {"counter": Counter, "gauge": Gauge, "summary": Summary}
_METHOD_KIND: dict[str, Kind] = {"inc": "counter", "set": "gauge", "observe": "summary"}


class _Registry(CollectorRegistry):
    """A registry that runs the node's collectors before each exposition, so the HTTP
    server (which only calls ``collect``) and ``render`` show the same fresh gauges."""

    def __init__(self, refresh: Callable[[], None]) -> None:
        super().__init__(auto_describe=True)
        self._refresh = refresh
        self._scrape = threading.Lock()   # one refresh + read at a time: clears race sets

    def collect(self) -> Iterable[prometheus_client.Metric]:
        with self._scrape:
            self._refresh()
            families = list(super().collect())
        return iter(families)

    def restricted_registry(self, names: Iterable[str]) -> RestrictedRegistry:
        with self._scrape:                # ?name[]=... scrapes bypass collect()
            self._refresh()
        return super().restricted_registry(names)


class Metrics:
    """The node's metrics. ``inc``, ``set`` and ``observe`` never raise: a metric
    must not fail the write it counts (a wrong name or label set is logged once)."""

    def __init__(self) -> None:
        self.registry = _Registry(self._run_collectors)
        self.collectors: list[Callable[["Metrics"], None]] = [Metrics._collect_storage]
        self._refusals_seen: dict[str, int] = {}
        self._lock = threading.Lock()
        self._metrics: dict[str, tuple[Kind, tuple[str, ...], prometheus_client.metrics.MetricWrapperBase]] = {}
        self._warned: set[tuple[str, str]] = set()
        # write acknowledgement times, windowed: what foreground protection reads
        # (node/admission.py); fed by the update path beside ferry_node_update_seconds
        self.acks = LatencyWindow()
        # gauges set by a collector: cleared before the next collection, so the series
        # of a move that ended disappears instead of keeping its last value
        self._collected: set[str] = set()
        self._collecting = False
        # the child of each (method, name, labels) seen, counters and summaries only:
        # inc/observe run on every write (node/updates.py), and the checks plus the
        # library's labels() cost several times the increment. Gauges are not kept: a
        # collector's are cleared before each scrape, which would orphan a kept child.
        self._children: dict[tuple, prometheus_client.metrics.MetricWrapperBase] = {}
        for name, (kind, text, labels) in METRICS.items():
            self._declare(name, kind, text, labels)

    def _declare(self, name: str, kind: Kind, text: str, labels: tuple[str, ...]):
        metric = _CLASSES[kind](name, text, labelnames=labels, registry=self.registry)
        self._metrics[name] = (kind, labels, metric)
        return self._metrics[name]

    def _child(self, method: str, name: str, labels: dict[str, str]):
        key = (method, name, tuple(labels.items()))
        child = self._children.get(key)
        if child is None:
            child = self._lookup(method, name, labels)
            if child is not None and method != "set":
                self._children[key] = child
        return child

    def _lookup(self, method: str, name: str, labels: dict[str, str]):
        kind = _METHOD_KIND[method]
        entry = self._metrics.get(name)
        if entry is None:                 # not in METRICS: declared on first use
            with self._lock:
                entry = self._metrics.get(name) or self._declare(
                    name, kind, f"{name} (not documented in node/metrics.py)", tuple(sorted(labels)))
        have_kind, names, metric = entry
        if have_kind != kind or set(names) != set(labels):
            self._warn(name, f"{method}({', '.join(sorted(labels))}) on a {have_kind} "
                             f"with labels ({', '.join(names)})")
            return None
        return metric.labels(**{k: str(v) for k, v in labels.items()}) if names else metric

    def _warn(self, name: str, what: str) -> None:
        if (name, what) not in self._warned:
            self._warned.add((name, what))
            log.warning("stage=metrics metric %s: %s; not recorded", name, what)

    def inc(self, name: str, amount: float = 1, **labels: str) -> None:
        if amount < 0:
            self._warn(name, f"a counter cannot go down (inc by {amount})")
            return
        m = self._child("inc", name, labels)
        if m is not None:
            m.inc(amount)

    def set(self, name: str, value: float, **labels: str) -> None:
        m = self._child("set", name, labels)
        if m is not None:
            m.set(value)
            if self._collecting:
                self._collected.add(name)

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        m = self._child("observe", name, labels)
        if m is not None:
            m.observe(seconds)

    def _run_collectors(self) -> None:
        """Called by the registry with its scrape lock held."""
        for name in self._collected:
            self._metrics[name][2].clear()        # a no-op on a gauge without labels
        self._collected = set()
        self._collecting = True
        try:
            for c in self.collectors:
                try:
                    c(self)
                except Exception:  # noqa: BLE001 - a scrape still shows everything else
                    log.exception("stage=metrics collector %r failed", c)
        finally:
            self._collecting = False

    def _collect_storage(self) -> None:
        """Latched storage failures of this process (one node per process) and the
        requests refused for them, from ``faults.latch``."""
        for component, path, cause in latch.latched():
            self.set("ferry_node_storage_failed", 1, cause=cause, component=component, path=path)
        for cause, n in latch.refusals().items():
            seen = self._refusals_seen.get(cause, 0)
            if n > seen:
                self.inc("ferry_node_storage_refusals_total", n - seen, cause=cause)
                self._refusals_seen[cause] = n

    def render(self) -> str:
        """The text exposition (Prometheus 0.0.4), as ``GET /metrics`` serves it."""
        return generate_latest(self.registry).decode()


# The metrics port has no authentication: anyone who reaches it is a stranger.
METRICS_MAX_CONNECTIONS = 32      # connections served at once (one thread each)
METRICS_MAX_PER_PEER = 8          # of them from one host
METRICS_DEADLINE = 10.0           # seconds for a whole connection: request and response


class _Handler(WSGIRequestHandler):
    """No log line per request; every read waits at most the deadline (the server's
    reaper cuts a connection that trickles bytes at the deadline too)."""

    timeout = METRICS_DEADLINE

    def log_message(self, format: str, *args: object) -> None:
        pass


class _BoundedServer(ThreadingMixIn, WSGIServer):
    """prometheus_client's thread-per-connection WSGI server, bounded: at most
    ``max_connections`` at once, ``per_peer`` from one host, each counted in the
    process's connection budget; over a limit a connection gets ``503`` and is closed
    at once, without a thread. A connection still open ``deadline`` seconds after it
    was accepted is shut down (checked every half second)."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 128              # the listen backlog (socketserver's default: 5)

    def __init__(self, address: tuple[str, int], *, family: int, max_connections: int,
                 per_peer: int, deadline: float, budget: ConnectionBudget) -> None:
        self.address_family = family
        self.max_connections, self.per_peer, self.deadline = max_connections, per_peer, deadline
        self.budget = budget
        self._open: dict[socket.socket, tuple[float, str]] = {}
        self._by_host: dict[str, int] = {}
        self._lock = threading.Lock()
        self.refused = 0
        self.report = Every()
        super().__init__(address, _Handler)

    def verify_request(self, request: socket.socket | tuple[bytes, socket.socket],
                       client_address: tuple[str, int]) -> bool:
        if not isinstance(request, socket.socket):     # (a TCP server: always one)
            return False
        host = str(client_address[0])
        with self._lock:
            n = self._by_host.get(host, 0)
            if len(self._open) >= self.max_connections:
                why: str | None = f"too many metrics connections ({self.max_connections})"
            elif n >= self.per_peer:
                why = f"too many metrics connections from {host} ({self.per_peer})"
            else:
                why = self.budget.take(host)
            if why is None:
                self._open[request] = (time.monotonic() + self.deadline, host)
                self._by_host[host] = n + 1
                return True
            self.refused += 1
        if self.report.due():
            log.warning("stage=metrics refused %s: %s; %d refused so far", host, why, self.refused)
        try:
            request.setblocking(False)
            request.send(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
                         b"Connection: close\r\n\r\n" + why.encode() + b"\n")
        except OSError:
            pass
        return False                          # socketserver closes it

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            entry = self._open.pop(request, None)
            if entry is not None:
                host = entry[1]
                n = self._by_host.get(host, 0) - 1
                if n > 0:
                    self._by_host[host] = n
                else:
                    self._by_host.pop(host, None)
        if entry is not None:
            self.budget.give(entry[1])
        super().shutdown_request(request)

    def service_actions(self) -> None:
        now = time.monotonic()
        with self._lock:
            late = [r for r, (deadline, _) in self._open.items() if deadline < now]
        for r in late:                        # its thread then ends and closes it
            try:
                r.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def get_request(self) -> Any:
        try:
            return super().get_request()
        except OSError as e:
            # out of descriptors or socket memory: the listening socket stays readable,
            # so without a pause the serve loop would spin on the failing accept()
            if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                if self.report.due():
                    log.error("stage=metrics accept() failed: %s; retrying", e.strerror or e)
                time.sleep(0.1)
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a peer that timed out, reset or was cut at the deadline: not worth a traceback
        log.debug("stage=metrics connection from %s ended", client_address, exc_info=True)


class MetricsServer:
    """The library's WSGI application on a bounded server thread (``_BoundedServer``);
    ``shutdown`` stops it, closes its socket (the port is free again) and joins the
    thread."""

    def __init__(self, listen: str, metrics: Metrics, *, max_connections: int = METRICS_MAX_CONNECTIONS,
                 per_peer: int = METRICS_MAX_PER_PEER, deadline: float = METRICS_DEADLINE,
                 budget: ConnectionBudget | None = None) -> None:
        host, port = parse_address(listen)
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, sockaddr = infos[0]
        self.httpd = _BoundedServer((str(sockaddr[0]), port), family=family, max_connections=max_connections,
                                    per_peer=per_peer, deadline=deadline,
                                    budget=budget if budget is not None else process_budget())
        self.httpd.set_app(make_wsgi_app(metrics.registry))
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="metrics", daemon=True)
        self._thread.start()
        self.address = listen

    def shutdown(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)


def serve(listen: str, metrics: Metrics) -> MetricsServer:
    """Serve ``metrics`` on ``listen`` (HOST:PORT) at ``/metrics``."""
    return MetricsServer(listen, metrics)
