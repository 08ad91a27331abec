"""The move of one partition, written once: a staged engine with
typed ports, hosted by the node (:mod:`node.filemove`); the crash harness runs real
node processes, so every crash cell runs this code.

- :class:`Stage`: the one vocabulary of stages (code, logs, metrics, status, docs);
- :class:`MoveEngine` over a :class:`MoveContext` (the ports of :mod:`.ports`);
- :class:`Move`: one move's progress; :class:`MemorySink`: the messages mode's buffer;
- :mod:`.tempwal`: the temp WAL (one record format, docs/formats.md);
- :func:`apply_chunked`: the apply path shared by the replay and the messages mode.
Documentation: docs/rebalancing.md.
"""
from __future__ import annotations

from .apply import APPLY_CHUNK, APPLY_CHUNK_BYTES, apply_chunked
from .context import MoveContext
from .engine import MoveEngine
from .errors import FilesImpossible, MoveRestart
from .messages import FETCH_BYTES, supply_batch
from .ports import (EntrySupply, MoveMetrics, NoMetrics, PartitionData, PartitionLock, ReplicaFeed,
                    StateStore, SupplierLocator)
from .progress import MemorySink, Move
from .stages import FILE_STAGES, STAGES, Stage
from .tempwal import TempWalSink

__all__ = ["Stage", "STAGES", "FILE_STAGES", "Move", "MemorySink", "MoveEngine", "MoveContext",
           "MoveRestart", "FilesImpossible", "apply_chunked", "APPLY_CHUNK", "APPLY_CHUNK_BYTES",
           "FETCH_BYTES", "supply_batch", "TempWalSink", "PartitionData", "StateStore",
           "ReplicaFeed", "SupplierLocator", "EntrySupply", "MoveMetrics", "NoMetrics",
           "PartitionLock"]
