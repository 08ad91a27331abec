"""What the node's parts share, passed to each of them explicitly.

The node is composed, not stacked: :class:`node.membership.ControlPlane`,
:class:`node.updates.UpdatePath`, :class:`node.reconcile.Reconciler` and the
rebalancer are separate objects built by :class:`node.node.Node`, each handed this one
:class:`NodeContext`. Shared state lives here and only here, so no part reads an
attribute another file set up on ``self``.

The seams between the parts are the small protocols in :mod:`node.ports`.

Who guards what, and the order locks are taken in (an earlier one before a later one,
never the reverse):

0. ``NodeContext.cfg_lock``: one replacement of ``cfg`` at a time (a cluster setting
   or the config file), taken with no other lock held;
1. ``Controller.lock`` (node/controller.py): one decision at a time;
2. the partition lock ``plock(cache, p)``: counters, replication order, state changes
   and moves of p;
3. ``MapHolder.lock``: the local map, changed in place by the watch thread
   (``MapHolder.changed`` is taken before it: ``wait_for``);
4. ``MoveTable.lock``: the moves in progress (then ``Admission._lock``, which
   ``MoveTable.start``'s admit takes inside it);
5. leaves, each the lock of one small table, never held while any other lock is taken
   or code outside the table runs: the :class:`Replication` tables (:class:`Copies`,
   :class:`Fences`, :class:`SnapshotUse`, :class:`LastApplied`, :class:`Handoffs`,
   :class:`Admissions`), :class:`DirtySet`, :class:`PartitionLocks`' guard and the
   :class:`~node.states.StateTable`'s lock.

A table's lock keeps each operation whole; where an operation must also agree with
p's data or state (a registration against p's replication, an admission against p's
writes) the caller holds p's lock as well, as the table's docstring says.
"""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, TypeVar

from .cluster_map import ClusterMap, PartRecord
from .config import NodeConfig
from .metrics import Metrics
from .states import StateTable
from .storage import CacheData
from .wire import Pool

if TYPE_CHECKING:
    from transfer.tls import TlsContexts

    from .control import Session
    from .move import Move

PartKey = tuple[str, int]          # (cache, partition)


class PartitionLocks:
    """One re-entrant lock per partition: counters, replication order, state changes
    and moves of p are serialized under it."""

    def __init__(self) -> None:
        self._locks: dict[PartKey, threading.RLock] = {}
        self._guard = threading.Lock()

    def __call__(self, cache: str, p: int) -> threading.RLock:
        with self._guard:
            return self._locks.setdefault((cache, p), threading.RLock())


_T = TypeVar("_T")


class DirtySet:
    """Partitions one consumer of the map (the reconcile loop, the controller) has yet
    to look at again: filled from each map delta, drained whole by the consumer.
    ``everything()`` asks for one pass over every partition (a start, an election)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: set[PartKey] = set()
        self._all = True

    def add(self, keys: "set[PartKey] | list[PartKey]") -> None:
        if keys:
            with self._lock:
                self._keys.update(keys)

    def everything(self) -> None:
        with self._lock:
            self._all = True

    def take(self) -> "set[PartKey] | None":
        """The partitions to look at (None: every partition); empties the set."""
        with self._lock:
            if self._all:
                self._all, self._keys = False, set()
                return None
            out, self._keys = self._keys, set()
            return out

    def __len__(self) -> int:
        return len(self._keys)


class MapHolder:
    """The node's local copy of the cluster map. ``lock`` guards ``map``, which the
    watch thread changes in place by each batch's events (node/mapview.py): read or
    iterate it under ``lock``. ``changed`` is notified after each batch, for waiters on
    a controller's answer. ``dirty`` and ``controller_dirty`` collect the partitions each
    batch touched, for the reconcile loop and the controller."""

    def __init__(self, m: ClusterMap) -> None:
        self.lock = threading.RLock()
        self.map = m
        self.changed = threading.Condition()
        self.pending_requests: set[str] = set()   # P/requests/... keys still in etcd
        self.dirty = DirtySet()                   # for the reconcile loop
        self.controller_dirty = DirtySet()        # for the controller, while elected

    def record(self, cache: str, p: int) -> PartRecord:
        with self.lock:
            return self.map.parts[cache][p]

    def address(self, node: str | None) -> str | None:
        with self.lock:
            return self.map.address(node)

    def answered(self, request: str, rev: int) -> bool:
        """Has the controller dealt with the request put at ``request`` (revision
        ``rev``), as far as this map shows? The map is at or past the put and the key
        is gone: applied (the record changes in the same revision), refused, withdrawn
        or dropped with its node's lease."""
        with self.lock:
            return self.map.epoch >= rev and request not in self.pending_requests

    def wait_for(self, look: Callable[[], _T | None], deadline: float, poll: float = 0.1) -> _T | None:
        """Call ``look`` (``lock`` held) now and after each change of the map until it
        returns something; None once ``deadline`` (time.monotonic) has passed."""
        with self.changed:
            while True:
                with self.lock:
                    out = look()
                if out is not None:
                    return out
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.changed.wait(min(left, poll))


@dataclass
class Events:
    stopping: threading.Event = field(default_factory=threading.Event)
    joined: threading.Event = field(default_factory=threading.Event)
    leaving: threading.Event = field(default_factory=threading.Event)
    left: threading.Event = field(default_factory=threading.Event)
    reconcile: threading.Event = field(default_factory=threading.Event)   # act on the map now
    report_dirty: threading.Event = field(default_factory=threading.Event)  # states changed
    controller_wake: threading.Event = field(default_factory=threading.Event)


class Copies:
    """Primary side: the MOVING copies registered with this node by a DEMAND, per
    partition (node -> its RPC address). ``register`` runs under p's lock (the
    registration orders against p's replication); the other operations may run under
    any lock or none."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by: dict[PartKey, dict[str, str]] = {}

    def add(self, key: PartKey, node: str, address: str) -> None:
        with self._lock:
            self._by.setdefault(key, {})[node] = address

    def of(self, key: PartKey) -> dict[str, str]:
        """A copy of p's registrations."""
        with self._lock:
            return dict(self._by.get(key, {}))

    def has(self, key: PartKey, node: str) -> bool:
        with self._lock:
            return node in self._by.get(key, {})

    def discard(self, key: PartKey, node: str) -> None:
        with self._lock:
            regs = self._by.get(key)
            if regs is not None:
                regs.pop(node, None)
                if not regs:        # no empty entry is kept: the table holds only
                    del self._by[key]   # partitions with a registration now

    def drop(self, key: PartKey) -> None:
        """Every registration of p (this node no longer leads it)."""
        with self._lock:
            self._by.pop(key, None)

    def keep_members(self, members: set[str]) -> None:
        """Forget registrations of nodes that are no longer members."""
        with self._lock:
            for key, regs in list(self._by.items()):
                for n in [n for n in regs if n not in members]:
                    del regs[n]
                if not regs:
                    del self._by[key]

    def __len__(self) -> int:
        """Partitions with a registration."""
        with self._lock:
            return len(self._by)

    def any(self) -> bool:
        with self._lock:
            return any(self._by.values())


class Fences:
    """Primary side: writes of p refused until this monotonic time (a hand-off of the
    primary role, or a live validation's fence)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[PartKey, float] = {}

    def set(self, key: PartKey, until: float) -> None:
        with self._lock:
            self._until[key] = until

    def until(self, key: PartKey) -> float | None:
        with self._lock:
            return self._until.get(key)

    def lift(self, key: PartKey, until: float | None = None) -> bool:
        """Remove p's fence (only the one ending at ``until``, when given); True when
        one was removed."""
        with self._lock:
            now = self._until.get(key)
            if now is None or (until is not None and now != until):
                return False
            del self._until[key]
            return True

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._until


class SnapshotUse:
    """Supplier side: transfer snapshots open per partition (an eviction waits for 0).
    Counted by the supplier's session threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[PartKey, int] = {}

    def opened(self, key: PartKey) -> None:
        with self._lock:
            self._open[key] = self._open.get(key, 0) + 1

    def closed(self, key: PartKey) -> None:
        with self._lock:
            n = self._open.get(key, 0) - 1
            if n > 0:
                self._open[key] = n
            else:
                self._open.pop(key, None)

    def count(self, key: PartKey) -> int:
        with self._lock:
            return self._open.get(key, 0)

    def any(self) -> bool:
        with self._lock:
            return bool(self._open)


class LastApplied:
    """Backup side: wall time of the last replicated update applied to p (lag metric)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at: dict[PartKey, float] = {}

    def touch(self, key: PartKey, when: float) -> None:
        with self._lock:
            self._at[key] = when

    def items(self) -> list[tuple[PartKey, float]]:
        with self._lock:
            return list(self._at.items())


class Handoffs:
    """Hand-offs of the primary role to this node in progress (the reconcile thread
    starts one, the hand-off worker ends it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: set[PartKey] = set()

    def begin(self, key: PartKey) -> bool:
        """Mark p's hand-off as started; False when one is in progress already."""
        with self._lock:
            if key in self._keys:
                return False
            self._keys.add(key)
            return True

    def end(self, key: PartKey) -> None:
        with self._lock:
            self._keys.discard(key)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._keys


class Admissions:
    """Primary side: the copy whose admission to p's in-sync set is in flight (at most
    one change of p's in-sync set at a time from this node; it counts as in sync for
    acknowledgements until the admission ends, node/updates.py ``op_join_isr``), and
    whether a write to it failed meanwhile ("spoiled"). Every caller also holds p's
    lock, which orders these changes against p's writes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._admitting: dict[PartKey, str] = {}
        self._spoiled: set[PartKey] = set()

    def begin(self, key: PartKey, node: str) -> str | None:
        """Start admitting ``node``; returns the copy being admitted already (and
        changes nothing), or None."""
        with self._lock:
            now = self._admitting.get(key)
            if now is not None:
                return now
            self._admitting[key] = node
            return None

    def admitting(self, key: PartKey) -> str | None:
        with self._lock:
            return self._admitting.get(key)

    def spoil(self, key: PartKey) -> None:
        """A write to the copy being admitted failed."""
        with self._lock:
            if key in self._admitting:
                self._spoiled.add(key)

    def take_spoiled(self, key: PartKey) -> bool:
        """Was p's admission spoiled? Clears the mark."""
        with self._lock:
            out = key in self._spoiled
            self._spoiled.discard(key)
            return out

    def end(self, key: PartKey) -> None:
        with self._lock:
            self._admitting.pop(key, None)
            self._spoiled.discard(key)

    def snapshot(self) -> tuple[dict[PartKey, str], set[PartKey]]:
        """(admitting, spoiled), copies."""
        with self._lock:
            return dict(self._admitting), set(self._spoiled)


@dataclass
class Replication:
    """Per-partition tables the update path, the control plane and the rebalancer
    all consult. Each table owns its lock, a leaf: taken after any other lock of the
    node and never held while another one is taken or the caller's code runs (see the
    module docstring)."""
    copies: Copies = field(default_factory=Copies)
    fenced: Fences = field(default_factory=Fences)
    last_applied: LastApplied = field(default_factory=LastApplied)
    in_use: SnapshotUse = field(default_factory=SnapshotUse)
    handoffs: Handoffs = field(default_factory=Handoffs)
    admissions: Admissions = field(default_factory=Admissions)


@dataclass
class MoveTable:
    """Moves of partitions to this node in progress (``running``, guarded by ``lock``:
    read and changed only through the methods below) and the last ones that ended
    OWNING (``done``, appended by the move threads, read as a copy).

    ``lock`` comes after a partition lock and ``MapHolder.lock`` in the node's order;
    ``start`` calls its ``admit`` (``Admission.admit``, which takes ``Admission._lock``)
    with it held, and nothing else runs under it."""
    running: dict[PartKey, "Move"] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: collections.deque[dict[str, object]] = field(
        default_factory=lambda: collections.deque(maxlen=4096))

    def start(self, key: PartKey, admit: Callable[[int], bool], make: Callable[[], "Move"]) -> "Move | None":
        """The move ``make()`` registered for ``key``, unless one runs for it already or
        ``admit(moves running)`` says no (None)."""
        with self.lock:
            if key in self.running or not admit(len(self.running)):
                return None
            mv = self.running[key] = make()
            return mv

    def end(self, key: PartKey) -> None:
        with self.lock:
            self.running.pop(key, None)

    def get(self, key: PartKey) -> "Move | None":
        with self.lock:
            return self.running.get(key)

    def __contains__(self, key: object) -> bool:
        with self.lock:
            return key in self.running

    def __len__(self) -> int:
        with self.lock:
            return len(self.running)

    def moves(self) -> list["Move"]:
        """The running moves, as a list taken under the lock."""
        with self.lock:
            return list(self.running.values())

    def items(self) -> list[tuple[PartKey, "Move"]]:
        with self.lock:
            return list(self.running.items())


@dataclass
class NodeContext:
    cfg: NodeConfig                  # replaced whole when a live setting changes
    id: str
    boot: str                        # changes at every process start
    secret: bytes
    metrics: Metrics
    data: dict[str, CacheData]       # cache name -> its storage
    states: StateTable
    pool: Pool                       # RPC connections to peers
    map: MapHolder
    plock: PartitionLocks
    events: Events
    repl: Replication
    moves: MoveTable
    session: "Session | None" = None   # the control-plane lease, once registered
    # copies this process found OWNING when it started and that are not yet confirmed
    # current (node/reconcile.py, "returning copies"): reported RETURNING, never lead
    # or supply until the controller takes them out of the in-sync set (then they join
    # again, the primary comparing counters) or elects them (every in-sync copy back)
    returning: set[PartKey] = field(default_factory=set)
    transfer_address: str = ""       # HOST:PORT of this node's file supplier
    # mutual TLS (transfer.tls) for RPC and transfers, from [tls]; None: the secret
    tls: "TlsContexts | None" = None
    # held by whoever replaces ``cfg`` (a cluster setting, the config file), across the
    # read of the old value, the replacement and its application: one change at a time,
    # none lost. Taken with no other lock held; the application takes its own inside.
    cfg_lock: threading.Lock = field(default_factory=threading.Lock)

    def lease_valid(self) -> bool:
        """A primary acknowledges writes only while its lease is surely alive."""
        s = self.session
        return s is not None and s.valid()

    def wake(self) -> None:
        """Have the reconcile loop act on the map now."""
        self.events.reconcile.set()

    def serving(self) -> bool:
        return self.events.joined.is_set() and not self.events.stopping.is_set()


__all__ = ["NodeContext", "PartitionLocks", "MapHolder", "DirtySet", "Events", "Replication", "MoveTable",
           "PartKey", "Copies", "Fences", "SnapshotUse", "LastApplied", "Handoffs", "Admissions"]
