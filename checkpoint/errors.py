"""Errors of the checkpoint package: every one a :class:`CheckpointError`.

Standard library and ``faults.errors`` only: the page decoder (shipped alone to Spark
executors, validation/ship.py) raises :class:`CorruptPageError` from here.
"""
from __future__ import annotations

from faults.errors import FerryError
from faults.errors import OutOfDiskError as _FerryOutOfDisk


class CheckpointError(FerryError):
    """Errors of partition files, page memory and the checkpointer."""


class CorruptPageError(CheckpointError):
    """A page of a partition file failed its CRC or structure check."""

    def __init__(self, path: str, page: int, offset: int, reason: str) -> None:
        self.path, self.page, self.offset, self.reason = str(path), page, offset, reason
        super().__init__(
            f"corrupt partition file {self.path}: page {page} (byte offset {offset}): {reason}; "
            "the file cannot be trusted - restore it from another owner or re-run the transfer")


class OutOfDiskError(CheckpointError, _FerryOutOfDisk):
    """A checkpoint, partition creation or snapshot found the file system full."""

    def __init__(self, path: str, needed: int | None = None, detail: str = "") -> None:
        _FerryOutOfDisk.__init__(self, path, needed, detail)


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
