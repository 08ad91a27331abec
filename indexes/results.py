"""What a rebuild reports: progress while it runs, a result when it is done.

Shared by the scan stage (:mod:`indexes.scan`), the rebuild and verify, which is why
it is its own module and not the rebuild's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

# Bad-value and unique-conflict samples a result keeps (the counts are exact).
MAX_SAMPLES = 20
# Progress callbacks at most this often (a forced report, e.g. a stage's end, always goes).
_REPORT_SECONDS = 0.2


@dataclass(frozen=True)
class Progress:
    """One progress report. ``stage``: scan (``done`` = values read) or load (``done``
    = index entries written). ``total``/``eta`` are None when the source cannot count."""

    partition: int
    stage: str
    done: int
    total: int | None
    rate: float                 # per second, this stage
    eta: float | None           # seconds left in this stage


@dataclass
class RebuildResult:
    partition: int
    scanned: int = 0             # values read from the source
    entries: int = 0             # index entries written
    bad: int = 0                 # (value, index) pairs not indexed by policy
    bad_samples: list[str] = field(default_factory=list)
    duplicates: int = 0          # entries the source gave twice (kept once)
    unique_conflicts: int = 0    # values of a unique index held by several keys
    unique_samples: list[str] = field(default_factory=list)
    runs: int = 0                # sorted runs spilled to scratch files
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def add_bad_samples(self, samples: list[str]) -> None:
        """Keep the first MAX_SAMPLES bad-value samples."""
        if len(self.bad_samples) < MAX_SAMPLES:
            self.bad_samples.extend(samples[:MAX_SAMPLES - len(self.bad_samples)])


class Reporter:
    """Turns a stage's running count into :class:`Progress` reports (rate, eta), at
    most every _REPORT_SECONDS; ``cb=None`` reports nothing."""

    def __init__(self, partition: int, cb: Callable[[Progress], None] | None) -> None:
        self.partition, self.cb = partition, cb
        self.stage, self.t0, self.last = "", 0.0, 0.0
        self.total: int | None = None

    def start(self, stage: str, total: int | None) -> None:
        self.stage, self.total = stage, total
        self.t0 = self.last = time.monotonic()
        self.report(0, force=True)

    def report(self, done: int, force: bool = False) -> None:
        if self.cb is None:
            return
        now = time.monotonic()
        if not force and now - self.last < _REPORT_SECONDS:
            return
        self.last = now
        el = now - self.t0
        rate = done / el if el > 0 else 0.0
        eta = ((self.total - done) / rate) if (self.total is not None and rate > 0) else None
        self.cb(Progress(self.partition, self.stage, done, self.total, rate, eta))
