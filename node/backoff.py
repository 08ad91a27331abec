"""Per-key retry back-off: when a failed action may be tried again.

The reconcile loop asks the primary to admit a copy to the in-sync set and asks the
controller for hand-offs. Each request costs etcd writes and a controller's work, and
when the controller is slow or overloaded, an action retried at every pass makes it
slower still (every request withdrawn at its deadline, then put again). So a key whose
action failed waits before the next try: ``base`` after the first failure, doubling up
to ``cap``, with "equal jitter" (half of the wait fixed, half random), so thousands of
partitions that failed together do not come back together. A success forgets the key.

A failure is remembered with the state it happened in (``token``: for a partition, its
record and this node's lease): once that state is different (a new primary or epoch,
a new lease after a cut healed), the key is ready at once and its count starts over,
so a node that comes back asks again without waiting out a wait grown while nothing
could succeed.
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
        # key -> (not before, failures, the token of the last failure)
        self._keys: dict[K, tuple[float, int, Hashable]] = {}

    def ready(self, key: K, token: Hashable = None) -> bool:
        """May the action of ``key`` run now? At once when ``token`` differs from the
        last failure's (the count starts over)."""
        with self._lock:
            at = self._keys.get(key)
            if at is not None and at[2] != token:
                del self._keys[key]
                return True
        return at is None or self._clock() >= at[0]

    def failed(self, key: K, token: Hashable = None) -> float:
        """The action of ``key`` failed in the state ``token``: returns how long it
        now waits."""
        with self._lock:
            last = self._keys.get(key)
            n = last[1] + 1 if last is not None and last[2] == token else 1
            full = min(self.cap, self.base * 2 ** min(n - 1, 30))
            wait = full / 2 + self._rand() * full / 2
            self._keys[key] = (self._clock() + wait, n, token)
        return wait

    def succeeded(self, key: K) -> None:
        with self._lock:
            self._keys.pop(key, None)

    def failures(self, key: K) -> int:
        with self._lock:
            at = self._keys.get(key)
        return at[1] if at is not None else 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._keys)


__all__ = ["Backoff"]
