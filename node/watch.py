"""The node's watchdog observer of its config file: settings that can change live.

The live settings are the keys declared live in :mod:`node.config` (marked "Live." in
docs/node.md's key table; ``node.membership.SETTINGS``). Every other change is logged
as needing a restart and not applied. A config that does not load (bad TOML, bad
value) is logged and changes nothing.

The observer watches the config file's folder for closes after a write, creations
and renames only, not for every write: a folder that also holds log files (a node's
own, or its neighbours') would otherwise wake it for each log line. A config file is
read once its writer closes it (or renames it into place).

(Reassignment plans live in etcd, not in a folder: node/reassign.py.)
"""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Callable

from .config import NodeConfig
from .context import NodeContext
from .errors import ConfigError
from .membership import SETTINGS

if TYPE_CHECKING:
    from watchdog.observers.api import BaseObserver

log = logging.getLogger("ferry.node.watch")
# the fields a running node changes without a restart: the live settings
LIVE = frozenset(SETTINGS.values())


class Watcher:
    """Watches the node's config file (when it has one); ``stop()`` ends it."""

    def __init__(self, ctx: NodeContext, apply_live_config: Callable[[NodeConfig, NodeConfig], None]) -> None:
        self.ctx = ctx
        self.apply_live_config = apply_live_config
        self.observer: BaseObserver | None = None

    def start(self) -> None:
        src = self.ctx.cfg.source
        if not src:
            return                     # no config file: nothing to watch
        from watchdog.events import (FileClosedEvent, FileCreatedEvent, FileMovedEvent, FileSystemEvent,
                                     FileSystemEventHandler)
        from watchdog.observers import Observer
        watcher = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                # closed after a write, created or renamed into place; not opened/read
                if event.is_directory or event.event_type not in ("modified", "created", "moved",
                                                                  "closed"):
                    return
                path = getattr(event, "dest_path", "") or event.src_path
                watcher.changed(os.fsdecode(path))

        observer = self.observer = Observer()
        # no FileModifiedEvent: inotify then delivers no IN_MODIFY (one per write(2) to
        # any file of the folder, a log line included); the close after the write
        # (IN_CLOSE_WRITE) tells the same change once
        observer.schedule(Handler(), os.path.dirname(os.path.abspath(src)), recursive=False,
                          event_filter=[FileClosedEvent, FileCreatedEvent, FileMovedEvent])
        observer.daemon = True
        observer.start()

    def stop(self) -> None:
        if self.observer is not None:
            self.observer.stop()

    def changed(self, path: str) -> None:
        src = self.ctx.cfg.source
        if src and os.path.abspath(path) == os.path.abspath(src):
            self.reload_config()

    # -- config -----------------------------------------------------------------------
    def reload_config(self) -> None:
        from . import config as cfgmod
        with self.ctx.cfg_lock:     # one change of ctx.cfg at a time (cluster settings too)
            old = self.ctx.cfg
            if not old.source:
                return                     # no config file: nothing to reload
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
