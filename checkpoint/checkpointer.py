"""The checkpoint procedure: a consistent cut of all dirty pages written to the
partition files, torn-page safe, with copy-on-write pre-images for open transfer
snapshots, then a marker in the node WAL.

Stages (one checkpoint at a time; install/drop/snapshot-open take the same lock):

1. cut      under the store lock: WAL mark = last appended lsn, dirty pages -> cut,
            meta pages of changed partitions encoded.  Writers copy a cut page before
            changing it (page memory), so the cut stays exactly "every update <= mark".
2. wal      the WAL is made durable up to the mark (WAL before data).
3. append   pages at or past a file's durable page count are written and fsynced:
            nothing durable refers to them yet, so a torn one harms nothing.
4. dwb      images of pages to overwrite in place go to the double-write file, fsync.
5. cow      each open transfer snapshot saves pre-images of pages it still needs.
6. write    overwrite in place (crash point ``checkpoint.mid_write`` halfway), fsync.
7. marker   MARKER(mark) appended to the WAL and made durable; double-write file
            cleared; WAL segments below the previous marker reclaimed.
8. publish  under the store lock: cut ends, partitions learn their checkpoint counter.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from faults import crashpoint, fileio, translate_os_error

from . import dwb
from .errors import OutOfDiskError
from .pagefile import encode_meta, seal
from .records import RecordType, encode_marker

if TYPE_CHECKING:
    from .partition import Partition
    from .store import PartitionStore

BATCH = 1 << 20          # bytes per pwrite: large writes are what makes Python fast here


@dataclass
class CheckpointStats:
    checkpoint_id: int
    mark_lsn: int
    pages: int = 0
    appended: int = 0
    overwritten: int = 0
    preimages: int = 0
    bytes_written: int = 0
    seconds: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)
    counters: dict[int, int] = field(default_factory=dict)


def run(store: PartitionStore, checkpoint_id: int) -> CheckpointStats | None:
    """One checkpoint; the caller holds the checkpoint lock.  None when nothing changed."""
    t0 = time.perf_counter()
    with store._cond:
        mark = store.wal.last_lsn if store._mark_override is None else store._mark_override
        cut = store.mem.begin_cut()
        changed = {k >> 32 for k in cut}
        changed.update(pid for pid, p in store.parts.items()
                       if p.counter != p.ckpt_counter or p.page_count != p.file_pages)
        metas = {pid: (store.parts[pid].page_count, store.parts[pid].counter) for pid in changed}
        if not changed:
            store.mem.end_cut()
            return None
        per_part: dict[int, list[tuple[int, bytearray]]] = {pid: [] for pid in changed}
        for k, buf in cut.items():
            per_part[k >> 32].append((k & 0xFFFFFFFF, buf))
        for pid, (count, counter) in metas.items():
            per_part[pid].append((0, encode_meta(pid, store.page_size, count, counter)))
    stats = CheckpointStats(checkpoint_id, mark, counters={p: c for p, (_n, c) in metas.items()})
    stage = _Stages(stats)
    try:
        if mark:
            store.wal.wait_durable(mark)
        stage("wal")
        appended: dict[int, list[tuple[int, bytearray]]] = {}
        overwrite: dict[int, list[tuple[int, bytearray]]] = {}
        for pid, pages in per_part.items():
            part = store.parts[pid]
            pages.sort(key=lambda t: t[0])
            for index, buf in pages:
                seal(buf)
                (appended if index >= part.file_pages else overwrite).setdefault(pid, []).append((index, buf))
        _write_all(store, appended, stats)
        stats.appended = sum(map(len, appended.values()))
        stage("append")
        if overwrite:
            dwb.write(store.dwb_path, store.page_size, checkpoint_id,
                      [(pid, i, buf) for pid, pages in overwrite.items() for i, buf in pages])
        stage("dwb")
        for pid, pages in overwrite.items():
            snap = store._snapshots.get(pid)
            if snap is not None:
                part = store.parts[pid]
                stats.preimages += snap.save_preimages(
                    [i for i, _ in pages], lambda i, part=part: _read_file_page(part, i))
        stage("cow")
        _write_all(store, overwrite, stats, crash_halfway=True)
        stats.overwritten = sum(map(len, overwrite.values()))
        stage("write")
        lsn = store.wal.append(encode_marker(mark, checkpoint_id), RecordType.MARKER, wait=False)
        store.wal.wait_durable(lsn)
        if overwrite:
            dwb.clear(store.dwb_path)
        if store._mark_override is None:      # not while recovery still reads the log
            if store._prev_marker_lsn:
                store.wal.truncate_before(store._prev_marker_lsn)
            store._prev_marker_lsn = lsn
        stage("marker")
    finally:
        with store._cond:
            store.mem.end_cut()
            store._cond.notify_all()
    with store._cond:
        for pid, (count, counter) in metas.items():
            part = store.parts.get(pid)
            if part is not None:
                part.ckpt_counter = max(part.ckpt_counter, counter)
                part.file_pages = max(part.file_pages, count)
        store._cond.notify_all()
    stats.pages = stats.appended + stats.overwritten
    stats.seconds = time.perf_counter() - t0
    return stats


class _Stages:
    def __init__(self, stats: CheckpointStats) -> None:
        self.stats, self.t = stats, time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.stats.stages[name] = now - self.t
        self.t = now


def _read_file_page(part: Partition, index: int) -> bytes:
    return os.pread(part.fd, part.page_size, index * part.page_size)


def _runs(pages: list[tuple[int, bytearray]], page_size: int):
    """Consecutive pages joined into writes of at most BATCH bytes."""
    per = max(1, BATCH // page_size)
    run: list[bytearray] = []
    start = prev = -2
    for index, buf in pages:
        if run and (index != prev + 1 or len(run) >= per):
            yield start, run
            run = []
        if not run:
            start = index
        run.append(buf)
        prev = index
    if run:
        yield start, run


def _write_all(store: PartitionStore, groups: dict[int, list[tuple[int, bytearray]]],
               stats: CheckpointStats, crash_halfway: bool = False) -> None:
    io = fileio.layer()
    total = sum(map(len, groups.values()))
    done, crashed = 0, not crash_halfway
    ps = store.page_size
    batch = store._batch_buffer()     # one reused buffer: no per-write allocation (RSS)
    for pid, pages in groups.items():
        part = store.parts[pid]
        fd = part.write_fd()
        for start, run in _runs(pages, ps):
            for j, buf in enumerate(run):
                batch[j * ps:(j + 1) * ps] = buf
            data = memoryview(batch)[:len(run) * ps]
            _pwrite_all(io, fd, data, start * ps, part.path)
            stats.bytes_written += len(data)
            done += len(run)
            if not crashed and done * 2 >= total:
                crashed = True
                crashpoint("checkpoint.mid_write")
    for pid in groups:
        io.fsync(store.parts[pid].write_fd())


def _pwrite_all(io: fileio.FileLayer, fd: int, data: bytes | memoryview, offset: int, path: str) -> None:
    view = memoryview(data)
    try:
        while view:
            n = io.pwrite(fd, view, offset)
            view, offset = view[n:], offset + n
    except OSError as e:
        raise translate_os_error(e, path, len(view), OutOfDiskError) from e

