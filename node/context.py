"""What the node's parts share, passed to each of them explicitly.

The node is composed, not stacked: :class:`node.membership.ControlPlane`,
:class:`node.updates.UpdatePath`, :class:`node.reconcile.Reconciler` and the
rebalancer are separate objects built by :class:`node.node.Node`, each handed this one
:class:`NodeContext`. Shared state lives here and only here, so no part reads an
attribute another file set up on ``self``.

The seams between the parts are the small protocols in :mod:`node.ports`.
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


@dataclass
class Replication:
    """Per-partition tables the update path, the control plane and the rebalancer
    all consult (each under the partition lock of its key, unless noted)."""
    # primary side: MOVING copies registered by a DEMAND (node -> address)
    copies: dict[PartKey, dict[str, str]] = field(default_factory=dict)
    # primary side: writes refused until this monotonic time (a hand-off in progress)
    fenced: dict[PartKey, float] = field(default_factory=dict)
    # backup side: wall time of the last applied replicated update (lag metric)
    last_applied: dict[PartKey, float] = field(default_factory=dict)
    # supplier side: open transfer snapshots per partition (eviction waits for 0)
    in_use: dict[PartKey, int] = field(default_factory=dict)
    # hand-offs of the primary role to this node in progress
    handoffs: set[PartKey] = field(default_factory=set)
    # primary side: the copy whose admission to the in-sync set is in flight (at most
    # one change of p's in-sync set at a time from this node); it counts as in sync
    # for acknowledgements until the admission ends (node/updates.py, op_join_isr)
    admitting: dict[PartKey, str] = field(default_factory=dict)
    # primary side: admissions during which a write to the admitted copy failed
    spoiled: set[PartKey] = field(default_factory=set)


@dataclass
class MoveTable:
    """Moves of partitions to this node in progress (guarded by ``lock``) and the
    last ones that ended OWNING."""
    running: dict[PartKey, "Move"] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: collections.deque[dict[str, object]] = field(
        default_factory=lambda: collections.deque(maxlen=4096))


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
           "PartKey"]
