"""PartitionStore: the partitions of one node, their page memory, the node WAL and the
checkpointer.

Directory layout: ``part-<p>.bin`` per partition, ``checkpoint.dwb`` (double-write
file), ``wal/`` (node WAL), and ``part-<p>.bin.delta`` while a transfer snapshot is open.

Update path: under the store lock an update gets the partition's next counter, is
appended to the WAL (written to the OS, in lsn order) and applied to page memory;
outside the lock the caller waits until the WAL is durable (group commit).  Writers
wait before changing anything while dirty + in-checkpoint pages exceed
``WAIT_FRACTION`` of the page-memory budget; a checkpoint starts at
``CHECKPOINT_FRACTION``.
"""
from __future__ import annotations

import os
import re
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from faults import fileio

from . import checkpointer, dwb, recovery
from .errors import (CheckpointError, OutOfDiskError, PartitionNotFoundError,
                     SnapshotBusyError, StoreClosedError)
from .memory import PageMemory
from .page import max_key
from .pagefile import MAX_VALUE, check_page, encode_meta, read_meta, valid_page_size
from .partition import Partition
from .records import RecordType, encode_drop, encode_install, encode_update
from .snapshot import TransferSnapshot

PART_FILE = re.compile(r"^part-(\d+)\.bin$")
CHECKPOINT_FRACTION = 0.25
WAIT_FRACTION = 0.75


class PartitionStore:
    def __init__(self) -> None:   # use PartitionStore.open
        raise TypeError("use PartitionStore.open(path, ...)")

    @classmethod
    def open(cls, path: str, *, page_size: int = 4096, memory_budget: int = 64 << 20,
             wal_sync: str = "group", checkpoint_interval: float | None = 60.0,
             wal_segment_size: int = 64 << 20) -> PartitionStore:
        if not valid_page_size(page_size):
            raise CheckpointError(f"page size {page_size} is not a power of two in 1 KiB..64 KiB")
        self = object.__new__(cls)
        self.dir = os.path.abspath(path)
        os.makedirs(self.dir, exist_ok=True)
        self.page_size = page_size
        self.dwb_path = os.path.join(self.dir, dwb.NAME)
        self.mem = PageMemory(page_size, memory_budget)
        self.parts: dict[int, Partition] = {}
        self._cond = threading.Condition(threading.Lock())   # the store lock
        self._ckpt_lock = threading.RLock()                   # one checkpoint / install / drop at a time
        self._snapshots: dict[int, TransferSnapshot] = {}
        self._callbacks: list[Callable[[dict[int, int]], None]] = []
        self._prev_marker_lsn = 0
        self._mark_override: int | None = None     # recovery: the marker's mark is the last replayed lsn
        self.replayed = 0
        self._batch: bytearray | None = None       # checkpoint write buffer (checkpoint lock)
        self._checkpoint_id = 0
        self._closed = False
        self._failure: BaseException | None = None
        self._wal_sync = wal_sync
        self.max_key = max_key(page_size)
        self.last_stats: checkpointer.CheckpointStats | None = None
        self.wal = recovery.recover(self, wal_sync, wal_segment_size)
        self._wake = threading.Event()
        self._interval = checkpoint_interval
        self._thread = threading.Thread(target=self._background, name="ferry-checkpointer",
                                        daemon=True)
        self._thread.start()
        return self

    # -- updates -----------------------------------------------------------------
    def put(self, partition: int, key: bytes, value: bytes) -> int:
        if not isinstance(value, (bytes, bytearray)):
            raise TypeError("value must be bytes")
        return self._update(partition, key, bytes(value), None)  # type: ignore[return-value]

    def remove(self, partition: int, key: bytes) -> int:
        return self._update(partition, key, None, None)  # type: ignore[return-value]

    def apply(self, partition: int, key: bytes, value: bytes | None, counter: int) -> bool:
        """Apply an update that carries its counter (replication, temp-WAL replay);
        ignored (False) when ``counter`` is at or below the partition's counter."""
        return self._update(partition, key, value, counter) is not None

    def _update(self, pid: int, key: bytes, value: bytes | None, counter: int | None) -> int | None:
        if len(key) > self.max_key:
            raise CheckpointError(f"key of {len(key)} bytes exceeds the limit of {self.max_key} "
                                  f"for {self.page_size}-byte pages")
        if value is not None and len(value) > MAX_VALUE:
            raise CheckpointError(f"value of {len(value)} bytes exceeds the limit of {MAX_VALUE}")
        with self._cond:
            self._admit()
            part = self._part(pid, create=True)
            if counter is None:
                counter = part.counter + 1
            elif counter <= part.counter:
                return None
            lsn = self.wal.append(encode_update(pid, counter, key, value), RecordType.UPDATE,
                                  wait=False)
            part.write(key, value, counter)
            if self.mem.pressure >= self.mem.capacity * CHECKPOINT_FRACTION:
                self._wake.set()
        if self._wal_sync != "none":
            self.wal.wait_durable(lsn)
        return counter

    def _admit(self) -> None:
        """Wait (store lock held, released while waiting) until page memory has room."""
        self._check_open()
        limit = self.mem.capacity * WAIT_FRACTION
        while self.mem.pressure >= limit:
            self._wake.set()
            self._cond.wait(0.5)
            self._check_open()

    # -- reads -------------------------------------------------------------------
    def get(self, partition: int, key: bytes) -> bytes | None:
        with self._cond:
            self._check_open()
            part = self.parts.get(partition)
            return None if part is None else part.get(key)

    def scan(self, partition: int) -> Iterator[tuple[bytes, bytes]]:
        """Live entries in page order.  Each batch of pages is read under the lock;
        updates made during a scan may or may not be seen."""
        index, batch = 1, max(1, (1 << 20) // self.page_size)
        while True:
            with self._cond:
                self._check_open()
                part = self.parts.get(partition)
                if part is None or index >= part.page_count:
                    return
                entries = part.scan_range(index, min(batch, part.page_count - index))
            index += batch
            yield from entries  # type: ignore[misc]

    def counter(self, partition: int) -> int:
        with self._cond:
            return self._part(partition).counter

    def last_checkpoint_counter(self, partition: int) -> int:
        with self._cond:
            return self._part(partition).ckpt_counter

    def partitions(self) -> list[int]:
        with self._cond:
            return sorted(self.parts)

    def partition_path(self, partition: int) -> str:
        return os.path.join(self.dir, f"part-{partition}.bin")

    def stats(self) -> dict[str, int]:
        with self._cond:
            out = self.mem.stats()
            out["index_entries"] = sum(len(p.index) for p in self.parts.values())
            return out

    # -- checkpoints -------------------------------------------------------------
    def checkpoint(self) -> checkpointer.CheckpointStats | None:
        """Write a checkpoint now (None when nothing changed since the last one)."""
        self._check_open()
        with self._ckpt_lock:
            return self._checkpoint_locked()

    def _checkpoint_locked(self) -> checkpointer.CheckpointStats | None:
        self._checkpoint_id += 1
        stats = checkpointer.run(self, self._checkpoint_id)
        if stats is not None:
            self.last_stats = stats
            for cb in list(self._callbacks):
                cb(dict(stats.counters))
        return stats

    def _batch_buffer(self) -> bytearray:
        if self._batch is None:
            self._batch = bytearray(max(self.page_size, checkpointer.BATCH))
        return self._batch

    def on_checkpoint(self, callback: Callable[[dict[int, int]], None]) -> None:
        """Call ``callback({partition: counter})`` after every completed checkpoint."""
        self._callbacks.append(callback)

    def wait_checkpoint_covering(self, partition: int, counter: int,
                                 timeout: float | None = None) -> bool:
        """Return once a completed checkpoint holds ``partition`` at >= ``counter``
        (checkpointing now when the update is already applied); False on timeout."""
        import time
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cond:
                part = self._part(partition)
                if part.ckpt_counter >= counter:
                    return True
                applied = part.counter >= counter
                if not applied:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._cond.wait(0.1 if left is None else min(left, 0.1))
                    continue
            self.checkpoint()

    @contextmanager
    def checkpoints_paused(self) -> Iterator[None]:
        """Hold off every checkpoint for the block (tests take reference images here)."""
        with self._ckpt_lock:
            yield

    def _background(self) -> None:
        while not self._closed:
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._closed:
                return
            try:
                self.checkpoint()
            except BaseException as e:  # latched, re-raised to the next caller
                with self._cond:
                    self._failure = e
                    self._cond.notify_all()
                return

    # -- partitions --------------------------------------------------------------
    def create_partition(self, partition: int) -> None:
        with self._cond:
            self._part(partition, create=True)

    def _part(self, pid: int, create: bool = False) -> Partition:
        part = self.parts.get(pid)
        if part is None:
            if not create:
                raise PartitionNotFoundError(self.dir, pid)
            path = self.partition_path(pid)
            fileio.atomic_write(path, bytes(encode_meta(pid, self.page_size, 1, 0)),
                                error=OutOfDiskError)
            part = self.parts[pid] = Partition(pid, path, self.mem)
        return part

    def install_partition(self, partition: int, src_path: str) -> None:
        """Atomically replace ``partition`` by a verified received file: fsync it,
        WAL INSTALL record (earlier records of the partition are never replayed),
        os.replace, fsync the directory, then forget the old page memory."""
        meta = read_meta(src_path)
        if meta.partition != partition or meta.page_size != self.page_size:
            raise CheckpointError(f"{src_path}: partition {meta.partition} / page size "
                                  f"{meta.page_size} cannot be installed as partition "
                                  f"{partition} of a store with {self.page_size}-byte pages")
        io = fileio.layer()
        fd = io.open(src_path, os.O_RDONLY)
        try:
            io.fsync(fd)
        finally:
            io.close(fd)
        with self._ckpt_lock, self._cond:
            self._check_open()
            if partition in self._snapshots:
                raise SnapshotBusyError(f"partition {partition} has an open transfer snapshot")
            lsn = self.wal.append(encode_install(partition, meta.counter), RecordType.INSTALL)
            self.wal.wait_durable(lsn)
            self._forget(partition)
            dst = self.partition_path(partition)
            io.replace(src_path, dst)
            io.fsync_dir(self.dir)
            self.parts[partition] = Partition(partition, dst, self.mem)
            self._cond.notify_all()

    def drop_partition(self, partition: int) -> None:
        """Delete the partition's file and memory, durably (WAL DROP record first)."""
        with self._ckpt_lock, self._cond:
            self._check_open()
            if partition in self._snapshots:
                raise SnapshotBusyError(f"partition {partition} has an open transfer snapshot")
            lsn = self.wal.append(encode_drop(partition), RecordType.DROP)
            self.wal.wait_durable(lsn)
            self._forget(partition)
            recovery.delete_partition_file(self.partition_path(partition))

    def _forget(self, partition: int) -> None:
        part = self.parts.pop(partition, None)
        if part is not None:
            part.close()
        self.mem.forget_partition(partition)

    # -- transfer snapshots ------------------------------------------------------
    def open_transfer_snapshot(self, partition: int) -> TransferSnapshot:
        """Force a checkpoint and fix a copy-on-write snapshot at its counter C."""
        with self._ckpt_lock:
            self._check_open()
            if partition in self._snapshots:
                raise SnapshotBusyError(f"partition {partition} already has an open transfer "
                                        "snapshot; close it first")
            self._checkpoint_locked()
            with self._cond:
                part = self._part(partition)
                snap = TransferSnapshot(partition, part.path, self.page_size, part.file_pages,
                                        part.ckpt_counter, self._snapshot_closed)
                self._snapshots[partition] = snap
            return snap

    def _snapshot_closed(self, snap: TransferSnapshot) -> None:
        with self._cond:
            if self._snapshots.get(snap.partition) is snap:
                del self._snapshots[snap.partition]

    def check_page(self, buf: bytes, index: int) -> str | None:
        return check_page(buf, index, self.page_size)

    # -- lifecycle ---------------------------------------------------------------
    def _check_open(self) -> None:
        if self._failure is not None:
            raise CheckpointError(f"store {self.dir}: the background checkpointer failed: "
                                  f"{self._failure}") from self._failure
        if self._closed:
            raise StoreClosedError(f"store {self.dir} is closed")

    def close(self, *, checkpoint: bool = True) -> None:
        if self._closed:
            return
        if checkpoint and self._failure is None:
            self.checkpoint()
        self._closed = True
        self._wake.set()
        self._thread.join()
        with self._ckpt_lock:
            for snap in list(self._snapshots.values()):
                snap.close()              # takes the store lock itself
        with self._ckpt_lock, self._cond:
            for pid in list(self.parts):
                self.parts.pop(pid).close()
            self.wal.close()
            self._cond.notify_all()

    def __enter__(self) -> PartitionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
