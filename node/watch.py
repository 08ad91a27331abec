"""The node's watchdog observers: its config file (settings that can change live) and
its ``DATA/plans/`` folder (manual reassignment of partitions).

Live settings: ``[transfer] rate_limit`` and ``concurrency``, ``[checkpoint]
interval_s``, ``log_level``, ``[rebalance] replay_rate_limit``. Any other change is
logged as needing a restart and not applied. A config that does not load (bad TOML,
bad value) is logged and changes nothing.

A plan is a JSON file ``DATA/plans/<name>.json``::

    {"moves": [{"cache": "default", "partition": 3, "to": ["n1", "n3"]}]}

``to`` names the B+1 owners, primary first. The node writes ``<name>.status`` next to
it (JSON ``{"plan", "state", "reason", "updated"}``; state ``accepted``, ``running``,
``done`` or ``failed``). A malformed plan, or one the coordinator refuses (unknown
cache/partition/node, wrong owner count) is ``failed`` and changes nothing; a plan is
``done`` when every named partition has exactly its named owners OWNING (nothing else
holding it) and the first one as primary.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
import tomllib
from typing import Any

from faults import fileio

from .errors import ConfigError, NodeError

log = logging.getLogger("ferry.node.watch")
PLAN_TIMEOUT_S = 600.0
LIVE = {"transfer_rate_limit", "transfer_concurrency", "checkpoint_interval_s", "log_level",
        "replay_rate_limit"}


class PlanError(ValueError):
    pass


def parse_plan(raw: bytes) -> list[dict[str, Any]]:
    """The moves of a plan, shape-checked; :class:`PlanError` says what is wrong."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise PlanError(f"not valid JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("moves"), list) or not doc["moves"]:
        raise PlanError('expected {"moves": [{"cache", "partition", "to": [nodes]}, ...]}')
    out = []
    for i, mv in enumerate(doc["moves"]):
        if not isinstance(mv, dict):
            raise PlanError(f"moves[{i}] must be an object")
        cache, p, to = mv.get("cache", "default"), mv.get("partition"), mv.get("to")
        if not isinstance(cache, str):
            raise PlanError(f"moves[{i}].cache must be a string")
        if not isinstance(p, int) or isinstance(p, bool):
            raise PlanError(f"moves[{i}].partition must be an integer")
        if not isinstance(to, list) or not to or not all(isinstance(n, str) for n in to):
            raise PlanError(f"moves[{i}].to must be a non-empty list of node ids")
        out.append({"cache": cache, "partition": p, "to": to})
    return out


class Watcher:
    """Starts the observers for one node; ``stop()`` ends them."""

    def __init__(self, node: Any) -> None:
        self.node = node
        self.plans_dir = os.path.join(node.cfg.data, "plans")
        os.makedirs(self.plans_dir, exist_ok=True)
        self._seen: dict[str, bytes] = {}
        self._running: set[str] = set()
        self._again: set[str] = set()
        self._lock = threading.Lock()
        self.observer: Any = None

    def start(self) -> None:
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer
        watcher = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: Any) -> None:
                # written, created or renamed into place; not opened/read
                if event.is_directory or event.event_type not in ("modified", "created", "moved",
                                                                  "closed"):
                    return
                path = getattr(event, "dest_path", "") or event.src_path
                watcher.changed(os.fsdecode(path))

        self.observer = Observer()
        self.observer.schedule(Handler(), self.plans_dir, recursive=False)
        src = self.node.cfg.source
        if src:
            self.observer.schedule(Handler(), os.path.dirname(os.path.abspath(src)), recursive=False)
        self.observer.daemon = True
        self.observer.start()
        for name in sorted(os.listdir(self.plans_dir)):   # plans dropped while the node was down
            path = os.path.join(self.plans_dir, name)
            if name.endswith(".json") and not os.path.exists(status_path(path)):
                self.changed(path)

    def stop(self) -> None:
        if self.observer is not None:
            self.observer.stop()

    def changed(self, path: str) -> None:
        src = self.node.cfg.source
        if src and os.path.abspath(path) == os.path.abspath(src):
            self.reload_config()
        elif os.path.dirname(os.path.abspath(path)) == os.path.abspath(self.plans_dir) \
                and path.endswith(".json"):
            with self._lock:       # one run at a time per plan; events come in bursts
                if path in self._running:
                    self._again.add(path)
                    return
                self._running.add(path)
            threading.Thread(target=self._plan_thread, args=(path,), name="plan", daemon=True).start()

    def _plan_thread(self, path: str) -> None:
        while True:
            try:
                with open(path, "rb") as f:
                    raw = f.read()
            except OSError:
                raw = None
            # the same content again (a second event of one write): nothing to do
            if raw is not None and self._seen.get(path) != raw:
                self._seen[path] = raw
                try:
                    self.run_plan(path)
                except Exception:
                    log.exception("stage=plan %s failed unexpectedly", path)
            with self._lock:
                if path not in self._again:
                    self._running.discard(path)
                    return
                self._again.discard(path)

    # -- config -----------------------------------------------------------------------
    def reload_config(self) -> None:
        from . import config as cfgmod
        node, old = self.node, self.node.cfg
        try:
            with open(old.source, "rb") as f:
                doc = tomllib.load(f)
            fresh = cfgmod._flatten(doc, old.source)
            new = cfgmod.with_overrides(old, **{k: v for k, v in fresh.items() if k in LIVE})
        except (OSError, tomllib.TOMLDecodeError, ConfigError, TypeError) as e:
            log.error("stage=config %s not applied: %s", old.source, e)
            return
        others = sorted(k for k, v in fresh.items() if k not in LIVE and k not in ("data", "secret_file")
                        and getattr(old, k, v) != v)
        if others:
            log.warning("stage=config %s changed %s: needs a restart, not applied",
                        old.source, ", ".join(others))
        changed = sorted(k for k in LIVE if getattr(new, k) != getattr(old, k))
        if not changed:
            return
        node.cfg = new
        node.apply_live_config(old, new)
        log.info("stage=config applied live: %s", ", ".join(f"{k}={getattr(new, k)}" for k in changed))

    # -- plans ------------------------------------------------------------------------
    def run_plan(self, path: str) -> None:
        name = os.path.basename(path)[:-5]
        try:
            with open(path, "rb") as f:
                moves = parse_plan(f.read())
        except OSError as e:
            return write_status(path, name, "failed", f"cannot read: {e.strerror}")
        except PlanError as e:
            log.error("stage=plan %s is malformed: %s", name, e)
            return write_status(path, name, "failed", str(e))
        try:
            self.node.call_controller("pin", plan=name, moves=moves)
        except NodeError as e:
            log.error("stage=plan %s refused: %s", name, e)
            return write_status(path, name, "failed", str(e))
        write_status(path, name, "accepted", None)
        log.info("stage=plan %s accepted: %d partition(s)", name, len(moves))
        write_status(path, name, "running", None)
        deadline = time.monotonic() + PLAN_TIMEOUT_S
        while time.monotonic() < deadline and not self.node.stopping.is_set():
            if self._plan_done(moves):
                log.info("stage=plan %s done", name)
                return write_status(path, name, "done", None)
            time.sleep(0.5)
        write_status(path, name, "failed", f"not done after {PLAN_TIMEOUT_S:.0f}s")

    def _plan_done(self, moves: list[dict[str, Any]]) -> bool:
        node = self.node
        node.refresh_map()
        with node.map_lock:
            m = node.map
            live = set(m.alive())
            for mv in moves:
                cache, p, to = mv["cache"], mv["partition"], mv["to"]
                states = {n: s for n, s in m.states[cache][p].items() if n in live}
                if set(states) != set(to) or set(states.values()) != {"OWNING"}:
                    return False
                if m.primary(cache, p) != to[0]:
                    return False
        return True


def status_path(plan_path: str) -> str:
    return plan_path[:-5] + ".status"


def write_status(plan_path: str, name: str, state: str, reason: str | None) -> None:
    doc = {"plan": name, "state": state, "reason": reason, "updated": time.time()}
    fileio.atomic_write(status_path(plan_path), (json.dumps(doc) + "\n").encode())
