"""The state one store shares with its checkpointer, recovery and undo-image log.

The store creates one :class:`StoreState` and passes it explicitly to
``checkpointer.run`` and ``recovery.recover``; they read and change the store's
partitions, locks and checkpoint marks through it, never through the store's private
members, so none of them imports the store (the modules' imports form a DAG,
tests/checkpoint/test_layering.py).

Locks (why two): ``cond`` is the store lock - every change of ``parts``, page memory
and the undo log happens under it, and writers wait on it for room in page memory or
for a checkpoint. ``ckpt_lock`` serialises what must not overlap a checkpoint's writes
to the files: a checkpoint, an install, a drop and a snapshot's open; it is taken
before ``cond``, never after. ``files`` (the open partition files, ``files.py``) has a
lock of its own, taken last.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from faults import fileio

from .errors import OutOfDiskError, PartitionNotFoundError
from .files import FileCache
from .layout import encode_meta, part_name
from .memory import PageMemory
from .partition import Partition
from .undo import ImageLog

if TYPE_CHECKING:
    from wal import Position, Wal

    from .snapshot import TransferSnapshot


@dataclass(eq=False)
class StoreState:
    dir: str
    page_size: int
    mem: PageMemory
    undo: ImageLog
    files: FileCache = field(default_factory=FileCache)   # open partition files, by budget
    parts: dict[int, Partition] = field(default_factory=dict)
    cond: threading.Condition = field(
        default_factory=lambda: threading.Condition(threading.Lock()))   # the store lock
    ckpt_lock: threading.RLock = field(default_factory=threading.RLock)
    snapshots: dict[int, TransferSnapshot] = field(default_factory=dict)
    prev_mark: int = 0            # mark of the last marker (the WAL reclaim bound)
    # During recovery's replay: the marker's mark is the last replayed lsn (not the
    # WAL's end), and no segment is reclaimed while the replay still reads them.
    mark_override: int | None = None
    # the WAL's end at the last complete checkpoint's cut, and its marker's lsn: written
    # to wal.start once that marker is durable (checkpoint/walstart.py)
    wal_start: tuple[Position, int] | None = None
    batch: bytearray | None = None   # checkpoint write buffer (checkpoint lock held)

    @property
    def wal(self) -> Wal:
        """The node WAL, opened by recovery (the undo log appends to it too)."""
        wal = self.undo.wal
        if wal is None:
            raise RuntimeError("the store's WAL is not open yet (recovery opens it)")
        return wal

    @wal.setter
    def wal(self, wal: Wal) -> None:
        self.undo.wal = wal

    def partition_path(self, partition: int) -> str:
        return os.path.join(self.dir, part_name(partition))

    def part(self, pid: int, create: bool = False) -> Partition:
        """Partition ``pid``; with ``create``, made (an empty file, durably) when it does
        not exist. Store lock held."""
        part = self.parts.get(pid)
        if part is None:
            if not create:
                raise PartitionNotFoundError(self.dir, pid)
            path = self.partition_path(pid)
            fileio.atomic_write(path, bytes(encode_meta(pid, self.page_size, 1, 0)),
                                error=OutOfDiskError)
            part = self.parts[pid] = Partition(pid, path, self.mem, self.undo, self.files)
        return part

    def batch_buffer(self) -> bytearray:
        """The checkpoint's reused write buffer (checkpoint lock held)."""
        if self.batch is None:
            self.batch = bytearray(max(self.page_size, self.mem.io_bytes))
        return self.batch
