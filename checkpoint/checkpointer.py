"""The checkpoint procedure: a consistent cut of all dirty pages written to the
partition files, torn-page safe, with copy-on-write pre-images for open transfer
snapshots, then a marker in the node WAL.

Stages (one checkpoint at a time; install/drop/snapshot-open take the same lock):

1. cut      under the store lock: WAL mark = last appended lsn, dirty pages -> cut,
            meta pages of changed partitions encoded.  Writers copy a cut page before
            changing it (page memory), so the cut stays exactly "every update <= mark".
2. sort     each partition's pages by index (they are sealed as they are written).
3. undo     pages to overwrite in place (index below the file's durable page count,
            meta included) are read from the file in runs and logged to the node WAL as
            IMAGES records (undo images; a page that is FREE in the file is only
            listed: it holds nothing the previous checkpoint needs).  Pages appended
            past the durable page count need nothing.  Each open transfer snapshot
            saves, from the same bytes, the pre-images it still needs (one write per
            run, no fsync: see snapshot.py).
4. append   pages past the durable page count are written while a helper thread
            makes the WAL durable up to max(mark, last IMAGES): ONE fsync covers the
            undo images and every update up to the mark (WAL before data).
5. write    the in-place pages, per file sorted and coalesced into pwritev runs of
            up to 1 MiB (crash point ``checkpoint.mid_write`` halfway through all
            pages), then one fsync per file.  Pages are sealed (CRC) as written.
6. marker   MARKER(mark) appended to the WAL, NOT waited for: the next WAL fsync (a
            writer's group commit or the next checkpoint's stage 3) makes it durable.
            Until then a crash rolls the files back to the previous marker with the
            undo images and replays from there - the same data.  So WAL segments are
            reclaimed only below the PREVIOUS checkpoint's mark (whose marker stage 3
            made durable).
7. publish  under the store lock: cut ends, partitions learn their checkpoint counter.

Why undo images rather than a double-write file of the new images: the new images
would have to be durable (fsync) before the first in-place write and the double-write
file cleared (fsync) after the marker; undo images ride in the WAL fsync that stage 3
needs anyway, and are never cleared (records before the last marker are ignored).
Pages that were not live in the previous checkpoint (appended, or FREE there) need no
copy at all: rolled back they are unreachable or FREE again, and their content is
rebuilt by replaying the WAL from the previous marker.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from faults import crashpoint, fileio, translate_os_error

from . import page as pg
from .errors import CheckpointError, OutOfDiskError
from .pagefile import PageType, encode_meta, seal
from .records import RecordType, encode_images, encode_marker

if TYPE_CHECKING:
    from .store import PartitionStore

BATCH = 1 << 20          # bytes per pwrite/pread and per IMAGES record (at most; a store
                         # with a budget under 32 MiB uses mem.io_bytes, 1/32 of it)


@dataclass
class CheckpointStats:
    checkpoint_id: int
    mark_lsn: int
    pages: int = 0
    appended: int = 0            # pages at or past the durable page count
    overwritten: int = 0         # pages below it (meta included)
    undo_images: int = 0         # of those, logged with their bytes
    undo_free: int = 0           # of those, FREE in the file: only listed
    preimages: int = 0           # saved to transfer snapshot delta files
    bytes_written: int = 0       # partition file bytes
    wal_image_bytes: int = 0     # IMAGES payload bytes
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
        for pages in per_part.values():
            pages.sort(key=lambda t: t[0])
        last = _log_undo_images(store, per_part, stats)
        stage("undo")
        writer = _Writer(store, stats, sum(map(len, per_part.values())))
        syncer = _Syncer(store.wal, max(mark, last))
        try:
            for pid, pages in per_part.items():
                fp = store.parts[pid].file_pages
                writer.write(pid, [t for t in pages if t[0] >= fp])
        finally:
            syncer.join()                     # undo images + updates <= mark durable
        stage("append+walsync")
        for pid, pages in per_part.items():
            fp = store.parts[pid].file_pages
            writer.write(pid, [t for t in pages if t[0] < fp])
        writer.fsync(per_part)
        stage("write")
        store.wal.append(encode_marker(mark, checkpoint_id), RecordType.MARKER, wait=False)
        if store._mark_override is None:      # not while recovery still reads the log
            if store._prev_mark:
                store.wal.truncate_before(store._prev_mark + 1)
        store._prev_mark = mark
        stage("marker")
    except BaseException:
        with store._cond:
            # Not in the files: the next checkpoint must write these pages again
            # (and they must not be evicted as clean meanwhile).
            store.mem.dirty.update(k for k in cut if k in store.mem.pages)
        raise
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


def _log_undo_images(store: PartitionStore, per_part: dict[int, list[tuple[int, bytearray]]],
                     stats: CheckpointStats) -> int:
    """Stages 3 and 4: read the file's current bytes of every page to be overwritten in
    place, in runs of up to mem.io_bytes bytes; log them (IMAGES, not waited for) and hand
    them to an open transfer snapshot.  Returns the last IMAGES lsn (0: none)."""
    ps = store.page_size
    batch = store.mem.io_bytes
    last = 0
    for pid, pages in per_part.items():
        part = store.parts[pid]
        inplace = [i for i, _ in pages if i < part.file_pages]
        stats.overwritten += len(inplace)
        stats.appended += len(pages) - len(inplace)
        snap = store._snapshots.get(pid)
        olds: list[tuple[int, memoryview]] = []
        runs = list(_index_runs(inplace, batch // ps))
        for r, (start, n) in enumerate(runs):
            raw = os.pread(part.fd, n * ps, start * ps)
            if len(raw) != n * ps:
                raise CheckpointError(f"{part.path}: short read of {n} pages at page {start} "
                                      f"(file shorter than its durable page count "
                                      f"{part.file_pages}); run `ferry partition verify`")
            view = memoryview(raw)
            olds.extend((start + j, view[j * ps:(j + 1) * ps]) for j in range(n))
            if len(olds) * ps < batch and r + 1 < len(runs):
                continue                      # one IMAGES record per ~batch bytes
            images, free = [], []
            for index, old in olds:
                if old[8] == PageType.FREE and old == _free_page(index, ps):
                    free.append(index)
                else:
                    images.append((index, old))
            payload = encode_images(pid, ps, images, free)
            last = store.wal.append(payload, RecordType.IMAGES, wait=False)
            stats.undo_images += len(images)
            stats.undo_free += len(free)
            stats.wal_image_bytes += len(payload)
            if snap is not None:
                stats.preimages += snap.save_preimages(olds)
            olds = []
    return last


def _free_page(index: int, page_size: int) -> bytearray:
    """The exact bytes of an empty FREE page (what rollback writes for a listed page)."""
    buf = pg.new_page(index, page_size, PageType.FREE)
    seal(buf)
    return buf


def _index_runs(indexes: list[int], per: int):
    """(start, count) runs of consecutive sorted page indexes, at most ``per`` long."""
    start = prev = -2
    n = 0
    for i in indexes:
        if n and (i != prev + 1 or n >= per):
            yield start, n
            n = 0
        if not n:
            start = i
        n += 1
        prev = i
    if n:
        yield start, n


class _Stages:
    def __init__(self, stats: CheckpointStats) -> None:
        self.stats, self.t = stats, time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.stats.stages[name] = now - self.t
        self.t = now


def _runs(pages: list[tuple[int, bytearray]], page_size: int, batch: int = BATCH):
    """Consecutive pages joined into writes of at most ``batch`` bytes (and IOV_MAX pages)."""
    per = max(1, min(batch // page_size, 512))
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


class _Writer:
    """Writes sealed pages in coalesced runs and counts toward the crash point.

    With the real file layer a run goes out as one ``os.pwritev`` of the page buffers
    (no copy); a layer that overrides ``pwrite`` (the crash harness) gets one
    ``pwrite`` of the run copied into a reused buffer, so it still sees every byte."""

    def __init__(self, store: PartitionStore, stats: CheckpointStats, total: int) -> None:
        self.store, self.stats, self.total = store, stats, total
        self.io = fileio.layer()
        self.vector = type(self.io).pwrite is fileio.FileLayer.pwrite and hasattr(os, "pwritev")
        self.done, self.crashed = 0, False

    def write(self, pid: int, pages: list[tuple[int, bytearray]]) -> None:
        part = self.store.parts[pid]
        fd = part.write_fd()
        ps = self.store.page_size
        for start, run in _runs(pages, ps, self.store.mem.io_bytes):
            for buf in run:
                seal(buf)
            size = len(run) * ps
            if self.vector:
                try:
                    n = os.pwritev(fd, run, start * ps)
                except OSError as e:
                    raise translate_os_error(e, part.path, size, OutOfDiskError) from e
            else:
                n = 0
            if n < size:          # copy path, or the rest of a short pwritev
                batch = self.store._batch_buffer()
                for j, buf in enumerate(run):
                    batch[j * ps:(j + 1) * ps] = buf
                _pwrite_all(self.io, fd, memoryview(batch)[n:size], start * ps + n, part.path)
            self.stats.bytes_written += size
            self.done += len(run)
            if not self.crashed and self.done * 2 >= self.total:
                self.crashed = True
                crashpoint("checkpoint.mid_write")

    def fsync(self, pids) -> None:
        for pid in pids:
            self.io.fsync(self.store.parts[pid].write_fd())


class _Syncer:
    """``wal.wait_durable(lsn)`` in a thread, so the WAL fsync overlaps the writes of
    appended pages (which need nothing durable first: no durable page refers to them)."""

    def __init__(self, wal, lsn: int) -> None:
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        if lsn > wal.durable_lsn:
            self.thread = threading.Thread(target=self._run, args=(wal, lsn),
                                           name="ferry-checkpoint-walsync", daemon=True)
            self.thread.start()

    def _run(self, wal, lsn: int) -> None:
        try:
            wal.wait_durable(lsn)
        except BaseException as e:
            self.error = e

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()
        if self.error is not None:
            raise self.error


def _pwrite_all(io: fileio.FileLayer, fd: int, data: bytes | memoryview, offset: int, path: str) -> None:
    view = memoryview(data)
    try:
        while view:
            n = io.pwrite(fd, view, offset)
            view, offset = view[n:], offset + n
    except OSError as e:
        raise translate_os_error(e, path, len(view), OutOfDiskError) from e
