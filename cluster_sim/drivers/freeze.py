"""``sigstop NODE``: the node's process frozen by SIGSTOP for ``duration_s``, then
SIGCONT (process mode; container mode freezes the whole container with ``pause``).

The classic GC or VM pause: the process keeps its sockets and its memory, the kernel
still accepts connections for it, but it answers nothing and renews no lease. Frozen
for 2 lease TTLs or more, its lease must end in etcd and another node take its
primaries (``freeze_lease_expired``: another node's map dropped it during the freeze).
Thawed, it wakes with a lease it still believes in until its first check: a primary
must not serve a read or acknowledge a write from that moment on (the linearizability
check of the run's history holds it to that), and the cluster must converge within 3
TTLs of the thaw (``converged_after_heal``, as after a heal).

A frozen process is thawed before any stop or kill of the run (a SIGTERM waits for the
SIGCONT, and a stopped process would hold the final stop up).
"""
from __future__ import annotations

import signal
import threading
import time
from typing import Any, Callable

from ..errors import SimError


class Freezer:
    """Needs from the driver: ``procs`` (node -> Proc), ``timeline``, ``lease_ttl``,
    ``checks``, ``dropped_by(node)`` and ``convergence``."""

    def __init__(self, driver: Any) -> None:
        self.d = driver
        self.frozen: dict[str, tuple[int, float]] = {}    # node -> (pid, since)
        self.gone: dict[str, float] = {}                  # node -> s into the freeze its lease ended
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def freeze(self, node: str, seconds: float) -> None:
        p = self.d.procs.get(node)
        if p is None or not p.alive() or p.popen is None:
            raise SimError(f"sigstop {node}: it is not running")
        with self._lock:
            if node in self.frozen:
                raise SimError(f"sigstop {node}: it is frozen already")
            self.frozen[node] = (p.popen.pid, time.monotonic())
        p.popen.send_signal(signal.SIGSTOP)
        self.d.timeline.mark(node, "sigstop", f"pid {p.popen.pid} for {seconds:.1f}s")
        self._later(f"gone-{node}", lambda: self._await_gone(node))
        self._later(f"thaw-{node}", lambda: self._thaw_after(node, seconds))

    def _later(self, name: str, fn: Callable[[], None]) -> None:
        threading.Thread(target=fn, name=name, daemon=True).start()

    def _thaw_after(self, node: str, seconds: float) -> None:
        if not self._stop.wait(seconds):
            self.thaw(node, check=True)

    def thaw(self, node: str, *, check: bool = False) -> None:
        with self._lock:
            got = self.frozen.pop(node, None)
        if got is None:
            return
        pid, since = got
        p = self.d.procs.get(node)
        if p is not None and p.popen is not None and p.popen.pid == pid and p.popen.poll() is None:
            p.popen.send_signal(signal.SIGCONT)
        lasted = time.monotonic() - since
        self.d.timeline.mark(node, "sigcont", f"after {lasted:.1f}s")
        if not check:
            return
        probs = self.d.checks.setdefault("freeze_lease_expired", [])
        if lasted >= 2 * self.d.lease_ttl and node not in self.gone:
            probs.append(f"{node} was frozen for {lasted:.1f}s (lease TTL {self.d.lease_ttl:.0f}s) "
                         "and no other node's map dropped it")
        self.d._heals += 1
        self.d.convergence.start("sigcont")

    def thaw_all(self) -> None:
        """Before a stop, a kill or the end of the run."""
        self._stop.set()
        for node in list(self.frozen):
            self.thaw(node)

    def busy(self) -> bool:
        return bool(self.frozen)

    def _await_gone(self, node: str) -> None:
        """While ``node`` is frozen: until another node's map drops it (timeline mark)."""
        since = self.frozen.get(node, (0, time.monotonic()))[1]
        while node in self.frozen and not self._stop.wait(0.2):
            if (peer := self.d.dropped_by(node)) is not None:
                self.gone[node] = round(time.monotonic() - since, 2)
                self.d.timeline.mark(node, "lease expired", f"{self.gone[node]:.1f}s into the freeze "
                                     f"(seen by {peer})")
                return


__all__ = ["Freezer"]
