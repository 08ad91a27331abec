"""LMDB secondary indexes: maintain on the write path, rebuild from a partition file,
verify against data; the OWNING gate's index step. See docs/indexes.md.

Public face:
- :class:`IndexStore` (``open``, ``apply``, ``lookup``, ``range``, ``rebuild``,
  ``drop``, ``ready``, ``verify``, ``close``) and :class:`IndexDefinition`
- :class:`StreamingIndex` / :class:`StreamedKeys`: a partition's entry keys built while
  its file arrives (the streaming install), loaded by ``IndexStore.load_streamed``
- :func:`export_shipped` / :func:`load_shipped`: a partition's entries shipped by a
  file supplier at the file's counter, checked and loaded instead of a rebuild
- :class:`ScanPool`: worker processes a rebuild hands a partition file's scan to
- sources: :class:`PartitionFileSource`, :class:`MemorySource`, :data:`EMPTY`
- results: :class:`RebuildResult`, :class:`Progress`, :class:`VerifyReport`
- errors: :class:`IndexStoreError` and its subclasses
"""
from __future__ import annotations

from .definitions import IndexDefinition
from .errors import (BadQueryError, BadValueError, IndexCorruptError, IndexDefinitionError,
                     IndexNotReadyError, IndexStoreError, OutOfDiskError, RebuildCancelled,
                     ShippedIndexRefused, StreamingUnavailable, UniqueViolationError)
from .results import Progress, RebuildResult
from .scanpool import ScanPool
from .shipped import IndexShot, ShipHeader, export as export_shipped, load_shipped
from .source import EMPTY, MemorySource, PartitionFileSource, Source
from .store import IndexStore
from .streaming import StreamedKeys, StreamingIndex
from .verify import EntryRef, VerifyReport, WrongEntry

__all__ = [
    "IndexStore", "IndexDefinition", "Source", "PartitionFileSource", "MemorySource", "EMPTY",
    "ScanPool", "RebuildResult", "Progress", "VerifyReport", "EntryRef", "WrongEntry",
    "IndexStoreError", "IndexCorruptError", "IndexDefinitionError", "IndexNotReadyError",
    "BadValueError", "BadQueryError", "UniqueViolationError", "RebuildCancelled",
    "OutOfDiskError", "StreamingIndex", "StreamedKeys", "StreamingUnavailable",
    "ShippedIndexRefused", "IndexShot", "ShipHeader", "export_shipped", "load_shipped",
]
