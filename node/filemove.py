"""The node as a host of the move engine (:mod:`node.move`): the engine's ports over
the node's map, RPC pool, states and data, and the supplier side of a move.

- :class:`NodeFeed` (the replica feed): ``register`` RPC to p's primary, which under
  its partition lock adds this node to the copies it replicates to;
- :class:`NodeLocator` (the supplier locator): p's primary from the map (LOST when no
  in-sync copy is left), the OWNING confirmed copies with a file supplier, least used
  by this node first, and the page-size check (a file moves only between stores of one
  page size; else the move falls back to the messages mode);
- :class:`NodeEntrySupply`: the messages mode's ``demand`` / ``fetch`` / ``demand_done``;
- the state store is the node's :class:`~node.states.StateTable`, the storage its
  :class:`~node.storage.CacheData`.

Supplier side: :func:`start_supplier` serves this node's partition files with
``transfer.SupplierServer`` over :func:`make_supplier_storage`, which refuses anything
but an OWNING, confirmed copy (``can_supply``).
"""
from __future__ import annotations

import logging
import random
import threading
from contextlib import AbstractContextManager
from typing import Protocol

from indexes import ScanPool
from transfer import Limits, NotHeld, PartitionStoreStorage, Snapshot, SupplierServer

from .cluster_map import ClusterMap
from .config import NodeConfig
from .errors import Unavailable
from .metrics import Metrics
from .move import (FilesImpossible, MoveContext, MoveEngine, MoveRestart, PartitionData,
                   StateStore)
from .states import State
from .wire import Pool

log = logging.getLogger("ferry.node.filemove")

class NodeView(Protocol):
    """What the node's move host reads of the node."""

    @property
    def cfg(self) -> NodeConfig: ...
    @property
    def id(self) -> str: ...
    @property
    def secret(self) -> bytes: ...
    @property
    def pool(self) -> Pool: ...
    @property
    def map(self) -> ClusterMap: ...
    @property
    def map_lock(self) -> AbstractContextManager[object]: ...
    @property
    def states(self) -> StateStore: ...
    @property
    def data(self) -> dict[str, PartitionData]: ...
    @property
    def stopping(self) -> threading.Event: ...
    @property
    def metrics(self) -> Metrics: ...
    scan_pool: ScanPool | None
    recv_limits: Limits
    page_sizes: dict[tuple[str, str, str], int]

    def plock(self, cache: str, p: int) -> AbstractContextManager[object]: ...


class NodeFeed:
    def __init__(self, node: NodeView) -> None:
        self.node = node

    def register(self, primary: str, cache: str, p: int) -> int:
        n = self.node
        with n.map_lock:
            epoch = n.map.parts[cache][p].term   # the primary epoch this node knows for p
        return int(n.pool.call(primary, "register", cache=cache, p=p, node=n.id,
                               address=n.cfg.address, epoch=epoch)["counter"])


class NodeLocator:
    def __init__(self, node: NodeView, load: dict[str, int]) -> None:
        self.node = node
        self.load = load                          # the engine's fetches per supplier

    def primary(self, cache: str, p: int) -> tuple[str, str] | None:
        n = self.node
        with n.map_lock:
            rec = n.map.parts[cache][p]
            prim = rec.primary
            addr = n.map.address(prim)
        if prim is None or prim == n.id or addr is None:
            if rec.lost:
                n.states.set(cache, p, State.LOST, reason="no in-sync copy left to pull from")
                log.error("stage=demand cache=%s partition=%d LOST: no in-sync copy left", cache, p)
                return None
            raise Unavailable(f"no primary for {cache}/{p} yet")
        return prim, addr

    def suppliers(self, cache: str, p: int) -> list[tuple[str, str]]:
        """OWNING, confirmed copies with a file supplier, least used by this node first,
        random among equals (spreads the load)."""
        n = self.node
        with n.map_lock:
            m = n.map
            isr = m.parts[cache][p].isr
            out = [(x, a) for x in m.holders(cache, p, State.OWNING)
                   if x != n.id and x in isr and (a := m.transfer_address(x))]
        random.shuffle(out)
        out.sort(key=lambda x: self.load.get(x[0], 0))
        return out

    def check_files(self, cache: str, p: int) -> None:
        n = self.node
        for node, _ in self.suppliers(cache, p)[:1]:
            with n.map_lock:
                addr = n.map.address(node)
                mem = n.map.members.get(node)
            if addr is None:
                return
            # a process keeps its page size: ask each boot of a node once, not per move
            key = (node, mem.boot if mem else "", addr)
            theirs = n.page_sizes.get(key)
            if theirs is None:
                theirs = n.page_sizes[key] = int(n.pool.call(addr, "ping", timeout=5.0).get(
                    "page_size", n.cfg.page_size))
            if theirs != n.cfg.page_size:
                raise FilesImpossible(f"{node} stores {theirs}-byte pages, this node "
                                      f"{n.cfg.page_size}-byte pages: files cannot move")


class NodeEntrySupply:
    def __init__(self, node: NodeView) -> None:
        self.node = node

    def demand(self, primary: str, cache: str, p: int) -> tuple[str, int, int]:
        n = self.node
        with n.map_lock:
            epoch = n.map.parts[cache][p].term
        r = n.pool.call(primary, "demand", cache=cache, p=p, node=n.id, address=n.cfg.address,
                        epoch=epoch)
        return str(r["session"]), int(r["counter"]), int(r["bytes"])

    def fetch(self, primary: str, session: str, offset: int, max_bytes: int) -> tuple[list[object], int, bool]:
        b = self.node.pool.call(primary, "fetch", session=session, offset=offset, max_bytes=max_bytes,
                                timeout=30.0)
        return list(b["entries"]), int(b["next"]), bool(b["done"])

    def done(self, primary: str, session: str) -> None:
        self.node.pool.call(primary, "demand_done", session=session)


def node_move_engine(node: NodeView) -> MoveEngine:
    """The node's move engine: the ports above over ``node``."""
    load: dict[str, int] = {}
    ctx = MoveContext(
        me=node.id, data_dir=node.cfg.data, secret=node.secret, data=node.data,
        states=node.states, plock=node.plock, feed=NodeFeed(node), locator=NodeLocator(node, load),
        stopping=node.stopping, metrics=node.metrics, entries=NodeEntrySupply(node),
        tmpwal_sync="none" if node.cfg.wal_sync == "none" else "group",
        recv_limits=node.recv_limits, transfer_timeout=30.0, scan_pool=node.scan_pool,
        replay_rate_limit=lambda: node.cfg.replay_rate_limit)   # cfg is replaced on a live change
    engine = MoveEngine(ctx)
    engine.supplier_load = load
    return engine


# -- supplier side --------------------------------------------------------------------
class SupplierView(Protocol):
    @property
    def data(self) -> dict[str, PartitionData]: ...
    @property
    def in_use(self) -> dict[tuple[str, int], int]: ...

    def can_supply(self, cache: str, p: int) -> str | None: ...


def make_supplier_storage(node: SupplierView) -> PartitionStoreStorage:
    """transfer's PartitionStoreStorage limited to partitions this node OWNS (confirmed),
    counting open snapshots so an eviction waits until no transfer reads the file."""

    class NodeSupplierStorage(PartitionStoreStorage):
        def open_snapshot(self, cache: str, partition: int) -> Snapshot:
            why = node.can_supply(cache, partition) if cache in node.data else f"no cache {cache!r}"
            if why:
                raise NotHeld(why, partition=partition)
            key = (cache, partition)
            snap = super().open_snapshot(cache, partition)
            node.in_use[key] = node.in_use.get(key, 0) + 1
            inner = snap._close

            def close() -> None:
                try:
                    inner()
                finally:
                    node.in_use[key] -= 1
            snap._close = close
            return snap

    return NodeSupplierStorage({name: d.store for name, d in node.data.items()})


class SupplierHost(SupplierView, Protocol):
    @property
    def cfg(self) -> NodeConfig: ...
    @property
    def secret(self) -> bytes: ...
    send_limits: Limits | None
    supplier: SupplierServer | None


def start_supplier(node: SupplierHost) -> str:
    """Start the node's file supplier; returns the address to advertise."""
    rate = node.cfg.transfer_rate_limit or None
    node.send_limits = Limits(node.cfg.transfer_concurrency, rate)
    host, port = node.cfg.supplier_listen
    node.supplier = SupplierServer(make_supplier_storage(node), node.secret, host, port,
                                   limits=node.send_limits, timeout=30.0).start()
    adv_host = node.cfg.address.rpartition(":")[0]
    return f"{adv_host}:{node.supplier.address[1]}"


__all__ = ["NodeFeed", "NodeLocator", "NodeEntrySupply", "node_move_engine", "MoveRestart",
           "FilesImpossible", "start_supplier", "make_supplier_storage"]
