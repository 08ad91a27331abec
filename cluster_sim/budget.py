"""A run's time budget and the step it is in, so that a run that overruns ends with a
failed verdict naming where it was stuck instead of hanging.

Steps: ``setup`` (etcd, proxies, mounts) -> ``start`` (processes) -> ``events`` (the
workload, topology events and faults) -> ``settle`` -> ``reads`` (the read check on the
running cluster) -> ``stop`` -> ``checks`` (recovery of unclean stops, invariants).
The runner works in a thread; when the budget is spent the main thread kills every
process (so blocked calls return), gives the worker a short grace, and reports
``time budget of N s exceeded in step S (detail)``.
"""
from __future__ import annotations

import threading
import time

GRACE_S = 15.0        # after the budget: how long the worker may take to notice the kill


class Budget:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self.step, self.detail = "setup", ""
        self.step_t0 = self.t0
        self.expired = False

    def enter(self, step: str, detail: str = "") -> None:
        with self._lock:
            self.step, self.detail, self.step_t0 = step, detail, time.monotonic()

    def note(self, detail: str) -> None:
        """What the current step is doing now (an event firing, ops issued ...)."""
        with self._lock:
            self.detail = detail

    def left(self) -> float:
        return max(0.0, self.t0 + self.seconds - time.monotonic())

    def describe(self) -> str:
        with self._lock:
            since = time.monotonic() - self.step_t0
            return f"{self.step!r} (for {since:.0f}s" + (f"; {self.detail})" if self.detail else ")")

    def verdict(self) -> str:
        return f"time budget of {self.seconds:.0f}s exceeded in step {self.describe()}"
