"""Authenticated connections to suppliers, kept between a process's fetches.

A supplier serves DEMANDs one after another on one connection (docs/protocol.md §3),
so a demander that fetched a partition successfully may send its next DEMAND to the
same supplier over the same connection: no TCP set-up, no handshake, no new session
thread on the supplier. :class:`ConnPool` keeps such connections, per key (the
supplier's address and everything the connection was authenticated with), under these
rules:

- only a connection whose fetch ended well (APPLIED sent) is kept; any failure closes
  it, as before;
- a kept connection is used again only while the peer has sent nothing since (a
  readable idle connection was closed by the supplier, or holds bytes nobody asked
  for: it is closed instead);
- at most ``IDLE_S`` seconds idle: the keeper closes it after that, well before a
  supplier's read timeout would end the session with an error on its side (a close
  between DEMANDs is the clean end a supplier expects);
- a connection carries each (cache, partition) once: the data MAC keys of a sealed
  session are derived from (cache, partition, counter, offset), unique within the
  session only while no partition is fetched twice over it;
- at most ``MAX_IDLE`` connections per key.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Hashable

from .transport import Conn

IDLE_S = 5.0
MAX_IDLE = 8


@dataclass
class Kept:
    """A kept connection and what it has carried."""
    conn: Conn
    carried: set[tuple[str, int]] = field(default_factory=set)
    since: float = 0.0


class ConnPool:
    def __init__(self, idle_s: float = IDLE_S, max_idle: int = MAX_IDLE, enabled: bool = True) -> None:
        self.enabled = enabled   # what a Demander not told otherwise does
        self.idle_s = idle_s
        self.max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: dict[Hashable, list[Kept]] = {}
        self._keeper: threading.Thread | None = None
        self._wake = threading.Event()
        self.reused = 0          # connections handed out again (tests, diagnostics)

    def take(self, key: Hashable, item: tuple[str, int]) -> Kept | None:
        """A kept connection for ``key`` that has not carried ``item`` and that the
        peer has not written to since, or None."""
        now = time.monotonic()
        stale: list[Kept] = []
        got: Kept | None = None
        with self._lock:
            idle = self._idle.get(key, [])
            for k in reversed(idle):                # the most recently used first
                if item in k.carried:
                    continue
                idle.remove(k)
                if now - k.since > self.idle_s or _spoken(k.conn):
                    stale.append(k)
                    continue
                got = k
                break
            if not idle:
                self._idle.pop(key, None)
            if got is not None:
                self.reused += 1
        for k in stale:
            k.conn.close()
        return got

    def give(self, key: Hashable, kept: Kept) -> None:
        """Keep ``kept`` (its fetch ended well) for the next fetch of ``key``."""
        kept.since = time.monotonic()
        drop: Kept | None = None
        with self._lock:
            idle = self._idle.setdefault(key, [])
            idle.append(kept)
            if len(idle) > self.max_idle:
                drop = idle.pop(0)                  # the longest idle
            if self._keeper is None:
                self._keeper = threading.Thread(target=self._keep, name="ferry-conn-keeper",
                                                daemon=True)
                self._keeper.start()
        if drop is not None:
            drop.conn.close()

    def close_idle(self, older_than: float = 0.0) -> int:
        """Close every kept connection idle longer than ``older_than`` seconds."""
        now = time.monotonic()
        out: list[Kept] = []
        with self._lock:
            for key in list(self._idle):
                idle = self._idle[key]
                keep = [k for k in idle if now - k.since <= older_than]
                out += [k for k in idle if now - k.since > older_than]
                if keep:
                    self._idle[key] = keep
                else:
                    del self._idle[key]
        for k in out:
            k.conn.close()
        return len(out)

    def idle(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._idle.values())

    def _keep(self) -> None:
        while True:
            self._wake.wait(self.idle_s / 4)
            self.close_idle(self.idle_s)
            with self._lock:
                if not self._idle:
                    self._keeper = None
                    return


def _spoken(conn: Conn) -> bool:
    """The peer wrote to (or closed) an idle connection: not to be used again."""
    try:
        return conn.readable()
    except (OSError, ValueError, NotImplementedError):
        return True


POOL = ConnPool(enabled=False)
"""The process's pool, shared by every Demander that connects by TCP itself. Off
unless the process turns it on (``POOL.enabled = True``: a node does, at start) or a
Demander asks for it (``reuse=True``)."""

__all__ = ["ConnPool", "Kept", "POOL", "IDLE_S", "MAX_IDLE"]
