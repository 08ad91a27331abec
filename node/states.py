"""Partition states of one node and the ONE table of allowed transitions.

::

    (absent) --create-->  OWNING      a new cluster creates its partitions
    (absent) --assign-->  MOVING      this node is a new owner; it pulls the data
    MOVING   --gate---->  OWNING      data complete and durable (see docs/node.md)
    MOVING   --cancel-->  EVICTED     no longer assigned before the move finished
    MOVING   --lost---->  LOST        no owner left to pull from
    OWNING   --resync-->  MOVING      a copy that may be stale (restart, counter gap)
    OWNING   --rent---->  RENTING     no longer an owner; the new owners are OWNING
    RENTING  --evict--->  EVICTED     data deleted once no read uses it
    RENTING  --reclaim->  OWNING      assigned again before eviction
    EVICTED  --assign-->  MOVING      assigned again later
    LOST     --assign-->  MOVING      an owner came back
    LOST     --found--->  OWNING      this node's own copy is the best one left

Every change goes through :meth:`StateTable.set`, which checks the table and writes
``DATA/states.json`` atomically before it returns, so after a crash the node knows
what it held (a MOVING partition restarts its move; an OWNING one is re-synced).
"""
from __future__ import annotations

import enum
import json
import os
import threading
from typing import Callable, Iterator

from faults import fileio

from .errors import DataDirError, IllegalTransition


class State(str, enum.Enum):
    MOVING = "MOVING"
    OWNING = "OWNING"
    RENTING = "RENTING"
    EVICTED = "EVICTED"
    LOST = "LOST"


ABSENT = None
ALLOWED: dict[State | None, frozenset[State]] = {
    ABSENT: frozenset({State.OWNING, State.MOVING}),
    State.MOVING: frozenset({State.OWNING, State.EVICTED, State.LOST}),
    State.OWNING: frozenset({State.MOVING, State.RENTING}),
    State.RENTING: frozenset({State.EVICTED, State.OWNING}),
    State.EVICTED: frozenset({State.MOVING}),
    State.LOST: frozenset({State.MOVING, State.OWNING}),
}


def allowed(old: State | None, new: State) -> bool:
    return new in ALLOWED[old]


Key = tuple[str, int]


class StateTable:
    """Durable ``(cache, partition) -> State`` of this node."""

    FILE = "states.json"

    def __init__(self, data_dir: str,
                 on_change: Callable[[str, int, State | None, State], None] | None = None) -> None:
        self.path = os.path.join(data_dir, self.FILE)
        self._lock = threading.Lock()
        self._states: dict[Key, State] = {}
        self._on_change = on_change
        self._load()

    def _load(self) -> None:
        def damaged(why: str) -> DataDirError:
            return DataDirError(f"cannot read partition states {self.path}: {why}; the file is "
                                "written atomically, so this is damage: restore it or wipe the data dir")
        try:
            doc = json.loads(fileio.read_regular(self.path))   # a FIFO must not hang the start
        except FileNotFoundError:
            return
        except fileio.NotRegularFile:
            raise damaged("not a regular file") from None
        except OSError as e:
            raise damaged(e.strerror or str(e)) from None
        except (ValueError, RecursionError) as e:       # UnicodeDecodeError is a ValueError
            raise damaged(f"not JSON ({e})") from None
        caches = doc.get("caches", {}) if isinstance(doc, dict) else None
        if not isinstance(caches, dict) or not all(isinstance(v, dict) for v in caches.values()):
            raise damaged('expected {"caches": {CACHE: {PARTITION: STATE}}}')
        for cache, parts in caches.items():
            for p, s in parts.items():
                if not p.isdigit() or not isinstance(s, str) or s not in State.__members__:
                    raise damaged(f"cache {cache!r}: {p!r}: {s!r} is not PARTITION: STATE "
                                  f"(states: {', '.join(State.__members__)})")
                self._states[(cache, int(p))] = State(s)

    def get(self, cache: str, p: int) -> State | None:
        return self._states.get((cache, p))

    def items(self) -> Iterator[tuple[Key, State]]:
        with self._lock:
            return iter(list(self._states.items()))

    def of_cache(self, cache: str) -> dict[int, State]:
        with self._lock:
            return {p: s for (c, p), s in self._states.items() if c == cache}

    def set(self, cache: str, p: int, new: State, *, reason: str = "") -> State | None:
        """Move (cache, p) to ``new`` if the table allows it; durable on return.
        Setting the current state again is a no-op."""
        with self._lock:
            old = self._states.get((cache, p))
            if old == new:
                return old
            if not allowed(old, new):
                raise IllegalTransition(
                    f"partition {cache}/{p}: {old.value if old else 'absent'} -> {new.value} is "
                    f"not an allowed transition ({reason or 'no reason given'})")
            staged = dict(self._states)
            staged[(cache, p)] = new
            self._commit(staged)
        if self._on_change:
            self._on_change(cache, p, old, new)
        return old

    def set_many(self, changes: list[tuple[str, int, State]], *, reason: str = "") -> None:
        """Several transitions in one durable write (all checked first)."""
        with self._lock:
            olds = []
            for cache, p, new in changes:
                old = self._states.get((cache, p))
                if old != new and not allowed(old, new):
                    raise IllegalTransition(f"partition {cache}/{p}: {old} -> {new.value} not allowed ({reason})")
                olds.append(old)
            staged = dict(self._states)
            for cache, p, new in changes:
                staged[(cache, p)] = new
            self._commit(staged)
        if self._on_change:
            for (cache, p, new), old in zip(changes, olds):
                if old != new:
                    self._on_change(cache, p, old, new)

    def _commit(self, staged: dict[Key, State]) -> None:
        """(lock held) Write ``staged`` durably, then make it the table: a reader (``get``
        takes no lock) never sees a state that is not on disk yet, and a failed write
        (a full disk) leaves the table as it was."""
        self._save(staged)
        self._states = staged

    def _save(self, states: dict[Key, State]) -> None:
        doc: dict[str, dict[str, dict[str, str]]] = {"caches": {}}
        for (cache, p), s in sorted(states.items()):
            doc["caches"].setdefault(cache, {})[str(p)] = s.value
        fileio.atomic_write(self.path, json.dumps(doc, sort_keys=True).encode())
