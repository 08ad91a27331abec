"""Opening a store after a clean close or a crash.

1. ``*.delta`` files are removed: transfer snapshots do not survive a restart.
2. A complete double-write file is written over the partition files (healing pages
   a crash tore mid-checkpoint), fsynced, then cleared.
3. The node WAL is opened; a first pass finds the last checkpoint marker and, per
   partition, the last INSTALL/DROP record (records before it are not replayed);
   partitions whose last such record is a DROP lose their file.
4. Partition files are loaded (one sequential scan each, CRCs checked).
5. UPDATE records after the marker's mark are applied by counter: a record at or
   below the partition's counter (already in the file) is skipped, so replay is
   idempotent and restoring a newer cut from the double-write file is harmless.
6. When anything was replayed, a checkpoint is taken so the next start is short.
"""
from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from faults import fileio

from . import dwb
from .partition import Partition
from .records import RecordType, decode_marker, decode_update, record_partition

if TYPE_CHECKING:
    from wal import Wal

    from .store import PartitionStore

REPLAY_CHECKPOINT_FRACTION = 0.5
_PART = re.compile(r"^part-(\d+)\.bin$")


def recover(store: PartitionStore, wal_sync: str, segment_size: int) -> Wal:
    from wal import Wal

    _remove_deltas(store.dir)
    _restore_double_write(store)
    wal = Wal.open(os.path.join(store.dir, "wal"), segment_size=segment_size, sync=wal_sync)
    try:
        mark, marker_lsn, barrier, dropped = _first_pass(wal)
        for pid in dropped:
            delete_partition_file(store.partition_path(pid))
        for name in sorted(os.listdir(store.dir)):
            m = _PART.match(name)
            if m:
                pid = int(m.group(1))
                store.parts[pid] = Partition(pid, os.path.join(store.dir, name), store.mem)
        store.wal = wal
        store._prev_marker_lsn = marker_lsn
        replayed = _replay(store, wal, mark, barrier)
    except BaseException:
        for part in store.parts.values():
            part.close()
        wal.close()
        raise
    store.replayed = replayed
    if replayed:
        with store._ckpt_lock:
            store._checkpoint_locked()
    return wal


def _remove_deltas(directory: str) -> None:
    for name in os.listdir(directory):
        if name.endswith(".delta"):
            os.unlink(os.path.join(directory, name))


def _restore_double_write(store: PartitionStore) -> None:
    found = dwb.read(store.dwb_path)
    if found is None:
        return
    page_size, pages = found
    io = fileio.layer()
    for pid, images in dwb.by_partition(pages):
        path = store.partition_path(pid)
        if not os.path.exists(path):
            continue
        fd = io.open(path, os.O_RDWR)
        try:
            for index, buf in images:
                io.pwrite(fd, buf, index * page_size)
            io.fsync(fd)
        finally:
            io.close(fd)
    dwb.clear(store.dwb_path)


def _first_pass(wal: Wal) -> tuple[int, int, dict[int, int], set[int]]:
    mark = marker_lsn = 0
    barrier: dict[int, int] = {}
    last_kind: dict[int, int] = {}
    for rec in wal.read_from(wal.first_lsn):
        if rec.type == RecordType.MARKER:
            mark, marker_lsn = decode_marker(rec.payload)[0], rec.lsn
        elif rec.type in (RecordType.INSTALL, RecordType.DROP):
            pid = record_partition(rec.payload)
            barrier[pid] = rec.lsn
            last_kind[pid] = rec.type
        elif rec.type == RecordType.UPDATE and last_kind.get(record_partition(rec.payload)) == RecordType.DROP:
            last_kind[record_partition(rec.payload)] = RecordType.UPDATE   # re-created after the drop
    dropped = {pid for pid, kind in last_kind.items() if kind == RecordType.DROP}
    return mark, marker_lsn, barrier, dropped


def _replay(store: PartitionStore, wal: Wal, mark: int, barrier: dict[int, int]) -> int:
    replayed = 0
    start = max(wal.first_lsn, mark + 1)
    if start > wal.last_lsn:
        return 0
    for rec in wal.read_from(start):
        if rec.type != RecordType.UPDATE:
            continue
        u = decode_update(rec.payload)
        if rec.lsn <= barrier.get(u.partition, 0):
            continue
        part = store._part(u.partition, create=True)
        if u.counter > part.counter:
            part.write(u.key, u.value, u.counter)
            replayed += 1
            if store.mem.pressure >= store.mem.capacity * REPLAY_CHECKPOINT_FRACTION:
                # Bounded memory during a long replay: checkpoint what is applied so far.
                # The marker's mark is this record, not the WAL's end, and no segment
                # is reclaimed while we still read them.
                store._mark_override = rec.lsn
                with store._ckpt_lock:
                    store._checkpoint_locked()
                store._mark_override = None
    return replayed


def delete_partition_file(path: str) -> None:
    io = fileio.layer()
    try:
        io.unlink(path)
    except FileNotFoundError:
        return
    io.fsync_dir(os.path.dirname(path))
