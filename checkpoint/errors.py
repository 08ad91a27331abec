"""Errors of the checkpoint package (the base lives in pagefile so the decoder stands alone)."""
from __future__ import annotations

import faults

from .pagefile import CheckpointError, CorruptPageError


class OutOfDiskError(CheckpointError, faults.OutOfDiskError):
    """A checkpoint, partition creation or snapshot found the file system full."""

    def __init__(self, path: str, needed: int | None = None, detail: str = "") -> None:
        faults.OutOfDiskError.__init__(self, path, needed, detail)


class PartitionNotFoundError(CheckpointError):
    def __init__(self, store: str, partition: int) -> None:
        self.partition = partition
        super().__init__(f"partition {partition} does not exist in store {store}; "
                         "create it (create_partition) or install a received file first")


class StoreClosedError(CheckpointError):
    pass


class SnapshotBusyError(CheckpointError):
    """A transfer snapshot of the partition is already open (one per partition)."""


__all__ = ["CheckpointError", "CorruptPageError", "OutOfDiskError", "PartitionNotFoundError",
           "StoreClosedError", "SnapshotBusyError"]
