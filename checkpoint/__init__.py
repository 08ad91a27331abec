"""Partition page files, page memory, the checkpointer and transfer snapshots.

Public face:

- :mod:`checkpoint.pagefile` - THE decoder of ``part-<p>.bin`` (stdlib, crc32c,
  faults.crc and faults.errors only; the code is in layout/check/chain/reader/decode/keyscan):
  ``Meta``, ``Entry``, ``PageProblem``, ``read_meta``, ``iter_entries``, ``verify``,
  ``check_page``, ``CorruptPageError``.
- :mod:`checkpoint.layout` - the page file's layout, and ``part_name`` /
  ``parse_part_name`` (``part-<p>.bin``), the one spelling of a partition's file name.
- :class:`PartitionStore` - a node's partitions with page memory, node WAL and
  checkpointer (``checkpoint.store``).
- :class:`TransferSnapshot`, :func:`overlay` - copy-on-write transfer snapshots.
- :func:`max_key` (the longest key a page size holds), ``MIN_PAGES`` (page memory's
  least size in pages).
- Errors: :class:`CheckpointError` and subclasses.

The store (which needs ``wal``) is imported lazily, so ``import checkpoint.pagefile``
stays light for Spark executors.
"""
from __future__ import annotations

from typing import Any

from .check import PageProblem, check_page
from .decode import Entry, iter_entries, verify
from .errors import (CheckpointError, CorruptPageError, OutOfDiskError, PartitionNotFoundError,
                     SnapshotBusyError, StoreClosedError)
from .layout import Meta, parse_part_name, part_name
from .reader import read_meta

_LAZY = {
    "PartitionStore": ("checkpoint.store", "PartitionStore"),
    "TransferSnapshot": ("checkpoint.snapshot", "TransferSnapshot"),
    "overlay": ("checkpoint.snapshot", "overlay"),
    "CheckpointStats": ("checkpoint.checkpointer", "CheckpointStats"),
    # sizing rules a node's config checks: the longest key a page holds, and the
    # fewest pages page memory works with
    "max_key": ("checkpoint.page", "max_key"),
    "MIN_PAGES": ("checkpoint.memory", "MIN_PAGES"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'checkpoint' has no attribute {name!r}")


__all__ = ["CheckpointError", "CorruptPageError", "Entry", "Meta", "OutOfDiskError", "PageProblem",
           "PartitionNotFoundError", "SnapshotBusyError", "StoreClosedError", "check_page",
           "iter_entries", "parse_part_name", "part_name", "read_meta", "verify", *_LAZY]
