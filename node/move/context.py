"""What the move engine is given by its host: the ports (:mod:`.ports`) and a few
settings, in one :class:`MoveContext`."""
from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable

from indexes import ScanPool
from transfer import Limits
from transfer.tls import TlsContexts

from .ports import (EntrySupply, IndexSupply, MoveMetrics, NoMetrics, PartitionData, PartitionLock, ReplicaFeed,
                    StateStore, SupplierLocator)


@dataclass
class MoveContext:
    """Everything the engine uses of its host: the ports and a few settings."""

    me: str                                  # this copy's name (logs, summaries)
    data_dir: str                            # temp WALs live in DATA/tmpwal/<cache>/part-<p>
    secret: bytes                            # the cluster secret (transfer handshake)
    data: Mapping[str, PartitionData]        # cache -> its partitions
    states: StateStore
    plock: PartitionLock
    feed: ReplicaFeed
    locator: SupplierLocator
    stopping: threading.Event
    metrics: MoveMetrics = field(default_factory=NoMetrics)
    entries: EntrySupply | None = None       # the messages mode (the node only)
    tmpwal_sync: str = "group"
    recv_limits: Limits | None = None        # shared with the host (changed live)
    transfer_timeout: float = 30.0
    chunk_size: int | None = None            # transfer.Demander's default unless set
    margin: int | None = None
    scan_pool: ScanPool | None = None
    replay_rate_limit: Callable[[], int] = lambda: 0   # records/s, 0 = unlimited (live)
    retry_s: float = 0.5                     # pause between two attempts of a move
    tls: TlsContexts | None = None           # mutual TLS instead of the secret (transfer.tls)
    # (p's lock held) an attempt begins to replace p's copy here: the host forgets what
    # it knew of the data the copy held until now (the node: its request ids, which an
    # earlier attempt may have recorded for updates the new source never had)
    replaced: Callable[[str, int], None] = lambda cache, p: None
    # the streaming install: p's index built while its file arrives (node/move/stream.py);
    # off: rebuilt from the installed file after the install (the fallback either way).
    # The node passes its ``[rebalance] stream_index`` (off by default: slower on 2
    # cores); the harness's join-stream-index scenario turns it on for the crash cell
    # demander.mid_stream_index.
    stream_index: bool = True
    # the shipped index: "rebuild" (never), "ship" (always), "auto" (when the supplier's
    # file holds fewer than index_ship_below bytes per live entry); read per move (live)
    index_transfer: Callable[[], str] = lambda: "rebuild"
    index_ship_below: Callable[[], int] = lambda: 1024
    index_supply: IndexSupply | None = None
    # delta catch-up (transfer.delta): a copy holding an older file of p offers it as the
    # base and receives only the pages that differ, unless more than delta_limit
    # (a fraction of the pages) do; off: every fetch copies the whole file
    delta: bool = True
    delta_limit: float = 0.5


__all__ = ["MoveContext"]
