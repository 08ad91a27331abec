"""The node as a host of the move engine (:mod:`node.move`): the engine's ports over
the node's map, RPC pool, states and data, and the supplier side of a move.

- :class:`NodeFeed` (the replica feed): ``register`` RPC to p's primary, which under
  its partition lock adds this node to the copies it replicates to;
- :class:`NodeLocator` (the supplier locator): p's primary from the map (LOST when no
  in-sync copy is left), the OWNING confirmed copies with a file supplier, least used
  by this node first, and the page-size check (a file moves only between stores of one
  page size; else the move falls back to the messages mode);
- :class:`NodeEntrySupply`: the messages mode's ``demand`` / ``fetch`` / ``demand_done``;
- :class:`NodeIndexSupply`: a shipped index's ``index_want`` / ``index_page``;
- the state store is the node's :class:`~node.states.StateTable`, the storage its
  :class:`~node.storage.CacheData`.

Supplier side: :func:`start_supplier` serves this node's partition files with
``transfer.SupplierServer`` over :func:`make_supplier_storage`, which refuses anything
but an OWNING, confirmed copy (``can_supply``).
"""
from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Callable

from indexes import ScanPool
from transfer import Limits, NotHeld, PartitionStoreStorage, Snapshot, SupplierServer
from transfer.tls import TlsContexts

from .config import NodeConfig
from .context import NodeContext, SnapshotUse
from .errors import Unavailable
from .indexship import IndexShipper, live_docs
from .rpcapi import Demand, DemandDone, Fetch, IndexPageQuery, IndexWant, Ping, Register
from .move import FilesImpossible, MoveContext, MoveEngine, MoveRestart
from .states import State
from .storage import CacheData

log = logging.getLogger("ferry.node.filemove")

class NodeFeed:
    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

    def register(self, primary: str, cache: str, p: int) -> int:
        n = self.ctx
        epoch = n.map.record(cache, p).term   # the primary epoch this node knows for p
        return n.pool.request(primary, Register(cache, p, n.id, n.cfg.address, epoch)).counter


class NodeLocator:
    def __init__(self, ctx: NodeContext, load: dict[str, int]) -> None:
        self.ctx = ctx
        self.load = load                          # the engine's fetches per supplier
        # supplier (node, boot, address) -> its page size: a process keeps its page
        # size, so each boot of a node is asked once, not per move
        self.page_sizes: dict[tuple[str, str, str], int] = {}

    def primary(self, cache: str, p: int) -> tuple[str, str] | None:
        n = self.ctx
        with n.map.lock:
            rec = n.map.map.parts[cache][p]
            prim = rec.primary
            addr = n.map.map.address(prim)
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
        n = self.ctx
        with n.map.lock:
            m = n.map.map
            isr = m.parts[cache][p].isr
            out = [(x, a) for x in m.holders(cache, p, State.OWNING)
                   if x != n.id and x in isr and (a := m.transfer_address(x))]
        random.shuffle(out)
        out.sort(key=lambda x: self.load.get(x[0], 0))
        return out

    def check_files(self, cache: str, p: int) -> None:
        n = self.ctx
        for node, _ in self.suppliers(cache, p)[:1]:
            with n.map.lock:
                addr = n.map.map.address(node)
                mem = n.map.map.members.get(node)
            if addr is None:
                return
            key = (node, mem.boot if mem else "", addr)
            theirs = self.page_sizes.get(key)
            if theirs is None:
                got = n.pool.request(addr, Ping(), timeout=5.0).page_size
                theirs = self.page_sizes[key] = n.cfg.page_size if got is None else got
            if theirs != n.cfg.page_size:
                raise FilesImpossible(f"{node} stores {theirs}-byte pages, this node "
                                      f"{n.cfg.page_size}-byte pages: files cannot move")


class NodeEntrySupply:
    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

    def demand(self, primary: str, cache: str, p: int) -> tuple[str, int, int]:
        n = self.ctx
        epoch = n.map.record(cache, p).term
        r = n.pool.request(primary, Demand(cache, p, n.id, n.cfg.address, epoch))
        return r.session, r.counter, r.bytes

    def fetch(self, primary: str, session: str, offset: int, max_bytes: int) -> tuple[list[object], int, bool]:
        b = self.ctx.pool.request(primary, Fetch(session, offset, max_bytes), timeout=30.0)
        return [list(e) for e in b.entries], b.next, b.done

    def done(self, primary: str, session: str) -> None:
        self.ctx.pool.request(primary, DemandDone(session))


class NodeIndexSupply:
    """The shipped index over node RPC (``index_want`` / ``index_page`` to the
    supplier's node address; the frames are authenticated like every node RPC)."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

    def _addr(self, supplier: str) -> str:
        addr = self.ctx.map.address(supplier)
        if addr is None:
            raise Unavailable(f"{supplier} is not a live member")
        return addr

    def want(self, supplier: str, cache: str, p: int, below: int = 0) -> bool:
        return bool(self.ctx.pool.request(self._addr(supplier), IndexWant(cache, p, self.ctx.id, below),
                                          timeout=5.0))

    def page(self, supplier: str, cache: str, p: int, counter: int, page: int
             ) -> tuple[dict[str, object], bytes]:
        r = self.ctx.pool.request(self._addr(supplier), IndexPageQuery(cache, p, counter, page),
                                  timeout=30.0)
        return dict(r.header), r.data


def node_move_engine(ctx: NodeContext, recv_limits: Limits, scan_pool: ScanPool | None,
                     replay_rate_limit: Callable[[], int] | None = None,
                     replaced: Callable[[str, int], None] | None = None) -> MoveEngine:
    """The node's move engine: the ports above over the node's context.
    ``replay_rate_limit``: the replay's records/s now (default: the configured
    ``[rebalance] replay_rate_limit``); ``replaced``: a move attempt begins to replace
    p's copy (the update path forgets its request ids)."""
    load: dict[str, int] = {}
    mctx = MoveContext(
        me=ctx.id, data_dir=ctx.cfg.data, secret=ctx.secret, data=ctx.data,
        states=ctx.states, plock=ctx.plock, feed=NodeFeed(ctx), locator=NodeLocator(ctx, load),
        stopping=ctx.events.stopping, metrics=ctx.metrics, entries=NodeEntrySupply(ctx),
        tmpwal_sync="none" if ctx.cfg.wal_sync == "none" else "group",
        recv_limits=recv_limits, transfer_timeout=30.0, scan_pool=scan_pool,
        replay_rate_limit=replay_rate_limit or (lambda: ctx.cfg.replay_rate_limit),
        replaced=replaced or (lambda cache, p: None), stream_index=ctx.cfg.stream_index,
        delta=ctx.cfg.delta, delta_limit=ctx.cfg.delta_limit,   # cfg is replaced on a live change
        tls=ctx.tls, index_transfer=lambda: ctx.cfg.index_transfer,
        index_ship_below=lambda: ctx.cfg.index_ship_below, index_supply=NodeIndexSupply(ctx))
    return MoveEngine(mctx, supplier_load=load)


# -- supplier side --------------------------------------------------------------------
def make_supplier_storage(data: Mapping[str, CacheData], in_use: SnapshotUse,
                          can_supply: Callable[[str, int], str | None],
                          plock: Callable[[str, int], AbstractContextManager[object]] | None = None,
                          shipper: IndexShipper | None = None) -> PartitionStoreStorage:
    """transfer's PartitionStoreStorage limited to partitions this node OWNS (confirmed:
    ``can_supply`` says why not), counting open snapshots in ``in_use`` so an eviction
    waits until no transfer reads the file. With ``shipper`` and ``plock``: when a
    demander asked for p's index (``index_want``), the snapshot is opened under p's
    lock and p's index entries are exported under the same lock, so both are at the
    snapshot's counter (:mod:`node.indexship`)."""

    class NodeSupplierStorage(PartitionStoreStorage):
        def open_snapshot(self, cache: str, partition: int) -> Snapshot:
            why = can_supply(cache, partition) if cache in data else f"no cache {cache!r}"
            if why:
                raise NotHeld(why, partition=partition)
            key = (cache, partition)
            d = data.get(cache)
            # (an index that may not match its data - left behind by a refused change,
            # or not trusted since an unclean stop - is not exported: the demander
            # finds no export and rebuilds)
            if (shipper is not None and plock is not None and d is not None
                    and shipper.wanted(cache, partition) and d.index_current(partition)):
                with plock(cache, partition):
                    snap = super().open_snapshot(cache, partition)
                    try:
                        got = shipper.capture(cache, partition, d.indexes, snap.counter,
                                              live_docs(d.store, partition))
                    except BaseException:
                        snap.close()
                        raise
                shipper.publish(cache, partition, got)      # paged outside p's lock
            else:
                snap = super().open_snapshot(cache, partition)
            in_use.opened(key)
            inner = snap._close

            def close() -> None:
                try:
                    inner()
                finally:
                    in_use.closed(key)
            snap._close = close
            return snap

    return NodeSupplierStorage({name: d.store for name, d in data.items()})


def start_supplier(cfg: NodeConfig, secret: bytes, storage: PartitionStoreStorage,
                   tls: TlsContexts | None = None) -> tuple[SupplierServer, Limits, str]:
    """Start the node's file supplier: the server, its send limits (changed live) and
    the address to advertise. With ``tls`` only node and live validator certificates
    may fetch (never a client's)."""
    limits = Limits(cfg.transfer_concurrency, cfg.transfer_rate_limit or None)
    host, port = cfg.supplier_listen
    server = SupplierServer(storage, secret, host, port, limits=limits, timeout=30.0, tls=tls).start()
    adv_host = cfg.address.rpartition(":")[0]
    return server, limits, f"{adv_host}:{server.address[1]}"


__all__ = ["NodeFeed", "NodeLocator", "NodeEntrySupply", "NodeIndexSupply", "node_move_engine", "MoveRestart",
           "FilesImpossible", "start_supplier", "make_supplier_storage"]
