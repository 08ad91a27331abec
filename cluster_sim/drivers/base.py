"""What every driver shares: the run folder, the secret, the crash plan of one target
process, crash detection and restart of the killed process."""
from __future__ import annotations

import os
import secrets
import time
from typing import Any

from ..history import History
from ..invariants import Layout
from ..procs import Proc
from ..scenario import Event, Scenario
from ..timeline import Timeline
from ..workload import Model, Op, Receipt

RESTART_DELAY_S = 0.3     # a killed process comes back after this (the OS frees its ports)


class Driver:
    """Subclasses implement setup/start/client/apply/event/processes/settled/stop/layout."""

    def __init__(self, scenario: Scenario, seed: int, run_dir: str, timeline: Timeline,
                 model: Model, crash_spec: str | None,
                 net: Any = None, history: History | None = None) -> None:
        self.scenario, self.seed, self.dir = scenario, seed, run_dir
        self.timeline, self.model, self.crash_spec = timeline, model, crash_spec
        self.history = history if history is not None else History()   # every client operation
        self.net = net        # multi-host mode (cluster_sim.netns.Netns) or None: loopback
        self.trace = os.path.join(run_dir, "crash-trace.txt")
        self.secret_file = os.path.join(run_dir, "cluster.secret")
        fd = os.open(self.secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, secrets.token_hex(24).encode())
        os.close(fd)
        self.crashed: list[str] = []
        self._restart_at: dict[str, float] = {}
        self.last_status: Any = None
        self.setup()

    # -- helpers for subclasses ------------------------------------------------------------
    def data_dir(self, node: str) -> str:
        return os.path.join(self.dir, "data", node)

    def crash_for(self, node: str) -> str | None:
        return self.crash_spec if node == self.scenario.target() else None

    def prefix(self, node: str) -> list[str]:
        return self.net.prefix(node) if self.net else []

    def host(self, node: str) -> str:
        return self.net.host(node) if self.net else "127.0.0.1"

    def on_crash(self, node: str) -> None:
        self.crashed.append(node)
        self.timeline.mark(node, "crash", self.crash_spec or "")
        self._restart_at[node] = time.monotonic() + RESTART_DELAY_S

    def poll(self) -> None:
        """Notice crashes (a SIGKILL the harness did not send) and restart on time."""
        for name, p in self.processes().items():
            if p.self_killed():
                self.on_crash(name)
        now = time.monotonic()
        for name, at in list(self._restart_at.items()):
            if now >= at:
                del self._restart_at[name]
                self.restart_after_crash(name)

    def restarting(self) -> bool:
        return bool(self._restart_at)

    # -- the interface -----------------------------------------------------------------------
    def setup(self) -> None: ...
    def start(self) -> None: raise NotImplementedError
    def client(self, writer: int) -> Any: raise NotImplementedError
    def apply(self, client: Any, op: Op) -> Receipt | None:
        """Send ``op``; returns when acknowledged (with its counter and who routed and
        acknowledged it, when the driver knows); raises when not acknowledged."""
        raise NotImplementedError
    def read(self, client: Any, op: Op) -> bytes | None:
        """A read of ``op.key`` (None: absent); raises when it fails."""
        raise NotImplementedError(f"the {type(self).__name__} serves no reads")
    def via(self, client: Any) -> str:
        """Where the client's last operation went (for the history), "" unknown."""
        return ""
    def event(self, ev: Event) -> None: raise NotImplementedError
    def restart_after_crash(self, node: str) -> None: raise NotImplementedError
    def processes(self) -> dict[str, Proc]: raise NotImplementedError
    def sample(self) -> None: ...
    def settled(self) -> bool: raise NotImplementedError
    def stop(self) -> dict[str, int | None]: raise NotImplementedError
    def layout(self) -> Layout: raise NotImplementedError

    def busy(self) -> bool:
        """A fault that runs by itself is not over yet (the events phase waits)."""
        return False

    def unsettled(self) -> str:
        """Why the last ``settled()`` was False, for the failure message."""
        return str(self.last_status)[:1500]

    def after_settle(self) -> None:
        """Checks on the running, settled system (e.g. reads), before the stop."""

    def extra_checks(self) -> dict[str, list[str]]:
        """Checks the driver made during the run (fault events): name -> problems."""
        return {}

    def cleanup(self) -> None:
        """After the checks, processes gone: release what setup took (mounts, proxies)."""
        self.cleanup_faults()

    def cleanup_faults(self) -> None: ...

    def close_client(self, client: Any) -> None:
        close = getattr(client, "close", None)
        if close:
            close()

    def kill_all(self) -> None:
        for p in self.processes().values():
            p.kill()
