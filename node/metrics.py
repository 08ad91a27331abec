"""Prometheus text-format metrics on a small HTTP server (``metrics_listen``).

Counters and gauges keyed by name and labels; a summary-like pair ``_sum``/``_count``
for durations. The exposition is generated on each scrape, so gauges that are cheap to
compute (partitions by state, replication lag) are filled by a callback then.
"""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from .config import parse_address

HELP = {
    "ferry_node_updates_total": ("counter", "Acknowledged updates by cache and operation."),
    "ferry_node_update_seconds": ("summary", "Time from receiving an update to its acknowledgement."),
    "ferry_node_replication_failures_total": ("counter", "Updates not acknowledged because a backup failed."),
    "ferry_node_replication_lag_seconds": ("gauge", "Seconds since a backup partition last applied an update."),
    "ferry_node_moves_done_total": ("counter", "Partitions that reached OWNING through a move."),
    "ferry_node_move_bytes_total": ("counter", "Bytes received by moves (files: on the wire; messages: keys and values)."),
    "ferry_node_moves_in_progress": ("gauge", "Moves running on this node."),
    "ferry_node_moves_by_stage": ("gauge", "Moves running on this node by stage."),
    "ferry_node_move_stage_seconds": ("summary", "Time moves spent in each stage."),
    "ferry_node_replay_backlog": ("gauge", "Temp-WAL updates of a MOVING partition not yet replayed (replay lag)."),
    "ferry_node_replay_lag_seconds": ("gauge", "Temp-WAL backlog divided by the replay rate."),
    "ferry_node_replayed_updates_total": ("counter", "Temp-WAL updates applied by replays of completed moves."),
    "ferry_node_buffered_updates_total": ("counter", "Updates appended to temp WALs by completed moves."),
    "ferry_node_replay_rate": ("summary", "Temp-WAL records/s applied by the replay of each completed move."),
    "ferry_node_tempwal_ingest_rate": ("summary", "Records/s into a move's temp WAL before its replay (per completed move)."),
    "ferry_node_tempwal_ingest": ("gauge", "Records/s into the temp WAL of a running move (since it started buffering)."),
    "ferry_node_backpressure_seconds_total": ("counter", "Delay added to acknowledgements so a replay catches up."),
    "ferry_node_partitions": ("gauge", "Partitions on this node by cache and state."),
    "ferry_node_checkpoint_seconds": ("summary", "Duration of checkpoints started by the node."),
    "ferry_node_topology_version": ("gauge", "Topology version known to this node."),
}


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
                     for k, v in sorted(labels.items()))
    return "{" + inner + "}"


class Metrics:
    def __init__(self) -> None:
        self._values: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self.collectors: list[Callable[["Metrics"], None]] = []

    def inc(self, name: str, amount: float = 1, **labels: str) -> None:
        k = (name, _labels(labels))
        with self._lock:
            self._values[k] = self._values.get(k, 0) + amount

    def set(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            self._values[(name, _labels(labels))] = value

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        self.inc(name + "_sum", seconds, **labels)
        self.inc(name + "_count", 1, **labels)

    def render(self) -> str:
        for c in self.collectors:
            c(self)
        with self._lock:
            items = sorted(self._values.items())
        out, done = [], set()
        for (name, labels), v in items:
            base = name.removesuffix("_sum").removesuffix("_count")
            if base not in done and base in HELP:
                kind, text = HELP[base]
                out += [f"# HELP {base} {text}", f"# TYPE {base} {kind}"]
                done.add(base)
            out.append(f"{name}{labels} {v:g}")
        return "\n".join(out) + "\n"


def serve(listen: str, metrics: Metrics) -> ThreadingHTTPServer:
    host, port = parse_address(listen)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path not in ("/metrics", "/"):
                self.send_error(404, "metrics are at /metrics")
                return
            body = metrics.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer((host, port), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, name="metrics", daemon=True).start()
    return srv
