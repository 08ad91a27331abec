"""The node's acknowledgement latency: how long its writes took, over a short window,
and what that was while no rebalance touched the node (the idle baseline).

The update path adds one sample per acknowledged request (``put``, ``remove``,
``put_batch``: from receipt to the answer, the time a client waits on this node).
Foreground protection (:mod:`node.admission`) reads the windowed p99 of every node
a rebalance involves and compares it with a target derived from their baselines.
"""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Callable

WINDOW_S = 0.5          # short: a rebalance of a few seconds must be seen within it
MIN_SAMPLES = 8         # fewer writes than this in a window: too few for the baseline
BASELINE_ALPHA = 0.2    # EWMA weight of a new idle window: a few seconds of history


@dataclass(frozen=True)
class LatencyReport:
    """One node's figures at one moment (the ``ack_latency`` RPC's answer)."""
    p99_s: float | None        # None: no write in the window
    samples: int
    baseline_s: float | None   # None: never idle with writes since the start

    def to_wire(self) -> dict[str, float | int | None]:
        return {"p99_ms": None if self.p99_s is None else round(self.p99_s * 1e3, 3),
                "samples": self.samples,
                "baseline_ms": None if self.baseline_s is None else round(self.baseline_s * 1e3, 3)}

    @classmethod
    def from_wire(cls, doc: object) -> "LatencyReport":
        if not isinstance(doc, dict):
            raise ValueError(f"ack latency report must be an object, not {type(doc).__name__}")
        p99, n, base = doc.get("p99_ms"), doc.get("samples", 0), doc.get("baseline_ms")
        for name, v in (("p99_ms", p99), ("baseline_ms", base)):
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0):
                raise ValueError(f"ack latency report: {name} must be a number >= 0 or null, not {v!r}")
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"ack latency report: samples must be a whole number >= 0, not {n!r}")
        return cls(None if p99 is None else p99 / 1e3, n, None if base is None else base / 1e3)


class LatencyWindow:
    """Samples of the last ``window_s`` seconds (thread-safe; ``add`` is on every write,
    so it only appends: pruning and sorting happen when someone asks)."""

    def __init__(self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self._samples: collections.deque[tuple[float, float]] = collections.deque()
        self._lock = threading.Lock()
        self.baseline_s: float | None = None
        self._settled_at = float("-inf")

    def add(self, seconds: float) -> None:
        self._samples.append((self.clock(), seconds))   # deque.append is atomic

    def p99(self) -> tuple[float | None, int]:
        """The window's 99th percentile (nearest rank) and its sample count; None
        without samples."""
        now = self.clock()
        with self._lock:
            while self._samples and self._samples[0][0] < now - self.window_s:
                self._samples.popleft()
            vals = sorted(s for _, s in self._samples)
        if not vals:
            return None, 0
        # nearest rank; below 100 samples that is the slowest one: a few slow writes
        # are a signal too (a stalled write path produces few samples, not none)
        return vals[min(len(vals) - 1, int(0.99 * len(vals)))], len(vals)

    def report(self, busy: bool) -> LatencyReport:
        """The current figures; a window in which no rebalance touched the node
        (``busy`` False) also moves the baseline, at most once per window so that
        overlapping reads of one window count once."""
        p99, n = self.p99()
        now = self.clock()
        if not busy and n >= MIN_SAMPLES and p99 is not None and now - self._settled_at >= self.window_s:
            self._settled_at = now
            b = self.baseline_s
            self.baseline_s = p99 if b is None else b + BASELINE_ALPHA * (p99 - b)
        return LatencyReport(p99, n, self.baseline_s)


__all__ = ["LatencyWindow", "LatencyReport", "WINDOW_S", "MIN_SAMPLES"]
