"""The node's watchdog observers: its config file (settings that can change live) and
its ``DATA/plans/`` folder (manual reassignment of partitions).

Live settings (``node.membership.SETTINGS``): ``[transfer] rate_limit`` and
``concurrency``, ``[rebalance] replay_rate_limit``, ``protect``, ``latency_target_ms``,
``min_moves`` and ``max_moves``, ``[checkpoint] interval_s``, ``log_level``. Any other change is
logged as needing a restart and not applied. A config that does not load (bad TOML,
bad value) is logged and changes nothing.

A plan is a JSON file ``DATA/plans/<name>.json``::

    {"moves": [{"cache": "default", "partition": 3, "to": ["n1", "n3"]}]}

``to`` names the B+1 owners, primary first. The node writes ``<name>.status`` next to
it (JSON ``{"plan", "state", "reason", "updated"}``; state ``accepted``, ``running``,
``done`` or ``failed``). A malformed plan (not JSON, nested deeper than
``MAX_PLAN_DEPTH``, larger than ``MAX_PLAN_BYTES``), or one the controller refuses
(unknown cache/partition/node, wrong owner count) is ``failed`` and changes nothing;
its status is written, so it is not tried again at the next start. A plan is
``done`` when every named partition has exactly its named owners OWNING (nothing else
holding it) and the first one as primary.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from typing import Any, Callable

from faults import fileio

from .config import NodeConfig
from .context import NodeContext
from .errors import ConfigError, NodeError, PlanError
from .membership import SETTINGS

log = logging.getLogger("ferry.node.watch")
PLAN_TIMEOUT_S = 600.0
# the fields a running node changes without a restart: the live settings
LIVE = frozenset(SETTINGS.values())
# A plan names partitions and owners: a few KiB even for thousands of moves. Larger
# files are refused unread; a 47 MB plan once took 736 MB of memory to parse.
MAX_PLAN_BYTES = 1 << 20
# {"moves": [{"to": [...]}]} is 4 levels deep. json.loads recurses per level: 100,000
# nested arrays raised RecursionError, which escaped as an unexpected failure, wrote no
# .status and so failed again at every start.
MAX_PLAN_DEPTH = 8


def _depth(raw: bytes) -> int:
    """Deepest nesting of ``[``/``{`` outside strings (counted before parsing, so a
    hostile file never reaches the recursive parser)."""
    depth = deepest = 0
    in_str = escaped = False
    for b in raw:
        if in_str:
            if escaped:
                escaped = False
            elif b == 0x5C:            # backslash
                escaped = True
            elif b == 0x22:            # "
                in_str = False
        elif b == 0x22:
            in_str = True
        elif b in (0x5B, 0x7B):        # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif b in (0x5D, 0x7D):        # ] }
            depth -= 1
    return deepest


def parse_plan(raw: bytes) -> list[dict[str, Any]]:
    """The moves of a plan, shape-checked; :class:`PlanError` says what is wrong."""
    if len(raw) > MAX_PLAN_BYTES:
        raise PlanError(f"plan is {len(raw)} bytes, more than the limit of {MAX_PLAN_BYTES}; "
                        "split it into smaller plans")
    if _depth(raw) > MAX_PLAN_DEPTH:
        raise PlanError(f"nested more than {MAX_PLAN_DEPTH} levels deep; expected "
                        '{"moves": [{"cache", "partition", "to": [nodes]}, ...]}')
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
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

    def __init__(self, ctx: NodeContext, apply_live_config: Callable[[NodeConfig, NodeConfig], None],
                 call_controller: Callable[..., object]) -> None:
        self.ctx = ctx
        self.apply_live_config = apply_live_config
        self.call_controller = call_controller
        self.plans_dir = os.path.join(ctx.cfg.data, "plans")
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
        src = self.ctx.cfg.source
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
        src = self.ctx.cfg.source
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
            # what identifies this version of the plan: a digest, not the contents,
            # which would stay in memory for as long as the node runs
            seen: Any = None
            try:
                try:
                    seen = hashlib.blake2b(read_plan(path), digest_size=16).digest()
                except PlanError:       # too large, not a file: refused by run_plan
                    st = os.stat(path)
                    seen = (st.st_size, st.st_mtime_ns)
            except OSError:
                pass
            # the same content again (a second event of one write): nothing to do
            if seen is not None and self._seen.get(path) != seen:
                self._seen[path] = seen
                try:
                    self.run_plan(path)
                except Exception as e:
                    log.exception("stage=plan %s failed unexpectedly", path)
                    # a status, so that the plan is not run again at every start
                    write_status(path, os.path.basename(path)[:-5], "failed",
                                 f"internal error: {type(e).__name__}: {e}")
            with self._lock:
                if path not in self._again:
                    self._running.discard(path)
                    return
                self._again.discard(path)

    # -- config -----------------------------------------------------------------------
    def reload_config(self) -> None:
        from . import config as cfgmod
        old = self.ctx.cfg
        try:
            fresh = cfgmod._flatten(cfgmod.read_toml(old.source), old.source)
            new = cfgmod.with_overrides(old, **{k: v for k, v in fresh.items() if k in LIVE})
        except (ConfigError, TypeError) as e:
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
        self.ctx.cfg = new
        self.apply_live_config(old, new)
        log.info("stage=config applied live: %s", ", ".join(f"{k}={getattr(new, k)}" for k in changed))

    # -- plans ------------------------------------------------------------------------
    def run_plan(self, path: str) -> None:
        name = os.path.basename(path)[:-5]
        try:
            moves = parse_plan(read_plan(path))
        except OSError as e:
            return write_status(path, name, "failed", f"cannot read: {e.strerror}")
        except PlanError as e:
            log.error("stage=plan %s is malformed: %s", name, e)
            return write_status(path, name, "failed", str(e))
        try:
            self.call_controller("pin", plan=name, moves=moves)
        except NodeError as e:
            log.error("stage=plan %s refused: %s", name, e)
            return write_status(path, name, "failed", str(e))
        write_status(path, name, "accepted", None)
        log.info("stage=plan %s accepted: %d partition(s)", name, len(moves))
        write_status(path, name, "running", None)
        deadline = time.monotonic() + PLAN_TIMEOUT_S
        while time.monotonic() < deadline and not self.ctx.events.stopping.is_set():
            if self._plan_done(moves):
                log.info("stage=plan %s done", name)
                return write_status(path, name, "done", None)
            time.sleep(0.5)
        write_status(path, name, "failed", f"not done after {PLAN_TIMEOUT_S:.0f}s")

    def _plan_done(self, moves: list[dict[str, Any]]) -> bool:
        with self.ctx.map.lock:
            m = self.ctx.map.map
            live = set(m.alive())
            for mv in moves:
                cache, p, to = mv["cache"], mv["partition"], mv["to"]
                states = {n: s for n, s in m.states[cache][p].items() if n in live}
                if set(states) != set(to) or set(states.values()) != {"OWNING"}:
                    return False
                if m.primary(cache, p) != to[0]:
                    return False
        return True


def read_plan(path: str) -> bytes:
    """The bytes of a plan file: a regular file of at most MAX_PLAN_BYTES (larger ones
    are refused unread). Opened non-blocking, so a FIFO dropped in plans/ cannot hang
    the plan thread."""
    try:
        return fileio.read_regular(path, MAX_PLAN_BYTES)  # parse_plan refuses what grew meanwhile
    except fileio.NotRegularFile:
        raise PlanError("not a regular file") from None
    except fileio.FileTooLarge as e:
        raise PlanError(f"plan is {e.size} bytes, more than the limit of "
                        f"{MAX_PLAN_BYTES}; split it into smaller plans") from None


def status_path(plan_path: str) -> str:
    return plan_path[:-5] + ".status"


def write_status(plan_path: str, name: str, state: str, reason: str | None) -> None:
    doc = {"plan": name, "state": state, "reason": reason, "updated": time.time()}
    fileio.atomic_write(status_path(plan_path), (json.dumps(doc) + "\n").encode())
