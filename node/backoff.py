"""Per-key retry back-off: when a failed action may be tried again.

The reconcile loop asks the primary to admit a copy to the in-sync set and asks the
controller for hand-offs. Each request costs etcd writes and a controller's work, and
when the controller is slow or overloaded, an action retried at every pass makes it
slower still (every request withdrawn at its deadline, then put again). So a key whose
action failed waits before the next try: ``base`` after the first failure, doubling up
to ``cap``, with "equal jitter" (half of the wait fixed, half random), so thousands of
partitions that failed together do not come back together. A success forgets the key.
"""
from __future__ import annotations

import random
import threading
import time
from typing import Callable, Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)


class Backoff(Generic[K]):
    def __init__(self, base: float, cap: float, *, rand: Callable[[], float] = random.random,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < base <= cap:
            raise ValueError(f"back-off needs 0 < base <= cap, not base {base}, cap {cap}")
        self.base, self.cap = base, cap
        self._rand, self._clock = rand, clock
        self._lock = threading.Lock()
        self._keys: dict[K, tuple[float, int]] = {}      # key -> (not before, failures)

    def ready(self, key: K) -> bool:
        """May the action of ``key`` run now?"""
        with self._lock:
            at = self._keys.get(key)
        return at is None or self._clock() >= at[0]

    def failed(self, key: K) -> float:
        """The action of ``key`` failed: returns how long it now waits."""
        with self._lock:
            n = self._keys.get(key, (0.0, 0))[1] + 1
            full = min(self.cap, self.base * 2 ** min(n - 1, 30))
            wait = full / 2 + self._rand() * full / 2
            self._keys[key] = (self._clock() + wait, n)
        return wait

    def succeeded(self, key: K) -> None:
        with self._lock:
            self._keys.pop(key, None)

    def failures(self, key: K) -> int:
        with self._lock:
            return self._keys.get(key, (0.0, 0))[1]

    def __len__(self) -> int:
        with self._lock:
            return len(self._keys)


__all__ = ["Backoff"]
