"""Node-wide transfer limits, changeable while transfers run: a token bucket for
bytes/s and a priority queue of concurrent-transfer slots.

One :class:`Limits` is shared by every transfer of a node in one direction (the
supplier server has one for sending, a node's demanders share one for receiving).
"""
from __future__ import annotations

import contextlib
import heapq
import itertools
import re
import threading
import time
from typing import Callable, Iterator


class TokenBucket:
    """Bytes per second with a small burst. Takers may go into debt and then sleep it
    off, so a large take is exact on average without splitting; callers still slice
    sends so the rate is smooth and a rate change applies quickly."""

    def __init__(self, rate: float | None = None) -> None:
        self._lock = threading.Lock()
        self._rate: float | None = None
        self._tokens = 0.0
        self._stamp = time.monotonic()
        self.set_rate(rate)

    @property
    def rate(self) -> float | None:
        return self._rate

    def _burst(self) -> float:
        # 50 ms worth: enough to absorb scheduling jitter, small enough to keep a set
        # rate within a few percent over a second.
        return max(64 * 1024, (self._rate or 0) * 0.05)

    def set_rate(self, rate: float | None) -> None:
        with self._lock:
            self._refill()
            self._rate = float(rate) if rate else None
            self._tokens = min(self._tokens, self._burst())

    def _refill(self) -> None:
        now = time.monotonic()
        if self._rate:
            self._tokens = min(self._burst(), self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now

    def take(self, n: int) -> float:
        """Account ``n`` bytes; sleep as long as the rate demands. Returns seconds slept."""
        with self._lock:
            if not self._rate:
                return 0.0
            self._refill()
            self._tokens -= n
            wait = -self._tokens / self._rate if self._tokens < 0 else 0.0
        if wait > 0:
            time.sleep(wait)
        return wait

    def slice_size(self, default: int) -> int:
        """Send granularity: about 1/20 s of data at the current rate."""
        r = self._rate
        return default if not r else int(max(16 * 1024, min(default, r / 20)))


class Slots:
    """At most ``limit`` holders; waiters are served by (priority, arrival)."""

    def __init__(self, limit: int) -> None:
        self._cond = threading.Condition()
        self._limit = max(1, int(limit))
        self._held = 0
        self._waiting: list[tuple[int, int]] = []
        self._seq = itertools.count()

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def held(self) -> int:
        return self._held

    def set_limit(self, limit: int) -> None:
        with self._cond:
            self._limit = max(1, int(limit))
            self._cond.notify_all()

    def position(self, key: tuple[int, int]) -> int:
        return sorted(self._waiting).index(key) if key in self._waiting else 0

    @contextlib.contextmanager
    def acquire(self, priority: int, *, on_wait: Callable[[int], None] | None = None,
                poll: float = 2.0) -> Iterator[None]:
        """Hold a slot for the block. ``on_wait(position)`` is called every ``poll``
        seconds while queued (the supplier turns it into a QUEUED keep-alive frame)."""
        key = (int(priority), next(self._seq))
        with self._cond:
            heapq.heappush(self._waiting, key)
            try:
                while not (self._held < self._limit and self._waiting[0] == key):
                    if not self._cond.wait(poll) and on_wait is not None:
                        pos = self.position(key)
                        self._cond.release()
                        try:
                            on_wait(pos)
                        finally:
                            self._cond.acquire()
            except BaseException:
                self._waiting.remove(key)
                heapq.heapify(self._waiting)
                self._cond.notify_all()
                raise
            heapq.heappop(self._waiting)
            self._held += 1
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._held -= 1
                self._cond.notify_all()


class Limits:
    """A node's transfer limits in one direction; both values change at run time."""

    def __init__(self, max_transfers: int = 4, rate: float | None = None) -> None:
        self.slots = Slots(max_transfers)
        self.bucket = TokenBucket(rate)

    def set_rate(self, rate: float | None) -> None:
        self.bucket.set_rate(rate)

    def set_max_transfers(self, n: int) -> None:
        self.slots.set_limit(n)


_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "M": 10**6, "MB": 10**6, "G": 10**9, "GB": 10**9,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_rate(text: str) -> float:
    """'200MB' -> 200e6 bytes/s ('/s' optional; KiB/MiB/GiB are powers of two)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)(/s)?\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"rate {text!r}: use a number with an optional unit, e.g. 200MB or 50MiB")
    return float(m.group(1)) * _UNITS[m.group(2).upper()]


def read_limits_file(path: str) -> tuple[float | None, int]:
    """A limits file for a running ``ferry transfer serve`` (re-read on SIGHUP): a JSON
    object ``{"rate": "200MB" or null, "max_transfers": 4}``. Returns (rate, max);
    ValueError with the file and the reason when it is unreadable or malformed."""
    import json

    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"limits file {path}: cannot read it as JSON ({e})") from None
    if not isinstance(doc, dict) or set(doc) - {"rate", "max_transfers"}:
        raise ValueError(f"limits file {path}: expected an object with only \"rate\" and \"max_transfers\"")
    rate = doc.get("rate")
    if rate is not None and not isinstance(rate, (str, int, float)) or isinstance(rate, bool):
        raise ValueError(f"limits file {path}: \"rate\" must be like \"200MB\", a number of bytes/s, or null")
    n = doc.get("max_transfers", 4)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"limits file {path}: \"max_transfers\" must be an integer >= 1")
    try:
        value = None if rate in (None, 0) else (parse_rate(rate) if isinstance(rate, str) else float(rate))
    except ValueError as e:
        raise ValueError(f"limits file {path}: {e}") from None
    return value, n
