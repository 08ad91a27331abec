"""The checkpoint procedure: a consistent cut of all dirty pages written to the
partition files, torn-page safe, then a marker in the node WAL.

Stages (one checkpoint at a time; install/drop/snapshot-open take the same lock):

1. cut      under the store lock: the meta pages' undo images (page 0 as the last
            checkpoint wrote it, kept in memory: ``Partition.meta_bytes``) are
            appended to the WAL and handed to open transfer snapshots; THEN
            ``images_from`` = the WAL's last lsn, so these images are rolled back only
            if this checkpoint does not complete; WAL mark = the same lsn (recovery's
            checkpoints: the last replayed record), dirty pages -> cut, new meta pages
            encoded, every partition's ``cut_pages`` = its page count.  Writers copy a
            cut page before changing it (page memory), so the cut stays exactly
            "every update <= mark" without holding the lock while it is written.
2. sort     outside the lock: the WAL fsync up to images_from starts in a helper
            thread; the cut's page keys are sorted once (partition-major, index-
            minor), so each partition is one slice: in-place pages (below the
            file's durable page count), then appended pages.
3. undo     nothing to do: every other page to overwrite in place (below the file's
            durable page count) already has its undo image in the WAL at an lsn <=
            images_from, logged from page memory when a writer first changed the page
            after the previous cut (undo.py; format 2); open transfer snapshots saved
            it at the same moment.
4. append   pages past the durable page count are sealed and written while the
            helper thread makes the WAL durable up to images_from: ONE fsync
            covers the undo images and every update up to the mark (WAL before data).
            (Not when more partitions changed than half the store's open files
            budget: their appended pages then go with stage 5, file by file.)
5. write    the new meta page and the in-place pages, per file coalesced into
            pwritev runs of up to 1 MiB (crash point ``checkpoint.mid_write`` halfway
            through all pages), then one fsync per file.  Pages are sealed (CRC) as
            written.  A file is written and fsynced through one descriptor, kept
            open in between (files.py); once half the store's open files budget
            of files are written and not yet fsynced, they are fsynced then, as a
            group, and may be closed: what is durable before the marker is the
            same, only fsyncs come in groups rather than all at the end.  In
            stages 4 and 5 every 2 MiB written to a file is handed to the
            kernel's writeback at once (``sync_file_range``, writeback.py), so the
            device works while later pages are sealed and copied and the fsync waits
            only for the tail.  Only a hint: the kernel may write back any written
            page at any moment anyway, so what may be on disk at a crash is the
            same (every write is issued only once it is allowed to reach the disk).
6. marker   MARKER(mark, images_from) appended to the WAL, NOT waited for: the next
            WAL fsync (a writer's group commit or the next checkpoint's stage 4)
            makes it durable.  Until then a crash rolls the files back to the previous
            marker with the undo images and replays from there - the same data.  So
            WAL segments are reclaimed only below the PREVIOUS checkpoint's mark
            (whose marker stage 4 made durable); every undo image recovery may need
            has an lsn above that checkpoint's images_from >= its mark.  Likewise
            the WAL's end at the cut is written to ``wal.start`` (where recovery
            starts reading: walstart.py) by the first checkpoint run that finds
            this marker durable.
7. publish  under the store lock: cut ends, partitions learn their checkpoint counter,
            page count and meta bytes.

Stage timings (``CheckpointStats.stages``, seconds): cut, sort, seal (part of
append), walsync_thread (the helper's fsync, overlapped), append+walsync, write,
marker.

Why undo images rather than a double-write file of the new images: the new images
would have to be durable (fsync) before the first in-place write and the double-write
file cleared (fsync) after the marker; undo images ride in WAL fsyncs that happen
anyway, and are never cleared (recovery ignores those at or below the last complete
marker's images_from).  Why at the first change rather than at checkpoint time
(format 1 read every in-place page back from the file and logged it here): the
checkpoint then writes only the pages, the image costs no read (the page is in
memory, being changed), and it shares the updates' group commit.  Pages that were not
live at the previous checkpoint (appended, or FREE there) need no copy at all: rolled
back they are unreachable or FREE again, and their content is rebuilt by replaying
the WAL from the previous marker.
"""
from __future__ import annotations

import os
import threading
import time
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

from faults import FerryError, crashpoint, fileio, translate_os_error

from . import walstart
from .errors import OutOfDiskError
from .layout import encode_meta, seal_many
from .records import RecordType, encode_images, encode_marker
from .writeback import WriteBehind

if TYPE_CHECKING:
    from wal import Wal

    from .partition import Partition
    from .state import StoreState

BATCH = 1 << 20          # bytes per pwritev run (at most; a store with a budget under
                         # 32 MiB uses mem.io_bytes, 1/32 of it)


def note_wal_start(state: StoreState) -> None:
    """Write the last complete checkpoint's WAL position to ``wal.start`` once its
    marker is durable (walstart.py); the caller holds the checkpoint lock. Only a head
    start for the next recovery: a failure to write it is ignored."""
    pending = state.wal_start
    if pending is None or state.wal.durable_lsn < pending[1]:
        return
    state.wal_start = None
    try:
        walstart.write(state.dir, pending[0])
    except (OSError, FerryError):         # a full or read-only disk, no descriptor left
        pass


@dataclass
class CheckpointStats:
    checkpoint_id: int
    mark_lsn: int
    pages: int = 0
    appended: int = 0            # pages at or past the durable page count
    overwritten: int = 0         # pages below it (meta included)
    undo_images: int = 0         # first-change undo images logged since the previous cut
    undo_free: int = 0           # ... of pages FREE at that cut: only listed
    first_change_image_bytes: int = 0   # their IMAGES payload bytes (logged by writers)
    preimages: int = 0           # saved to transfer snapshot delta files (same interval)
    bytes_written: int = 0       # partition file bytes
    files: int = 0               # partition files written (one fsync each)
    early_fsyncs: int = 0        # ... fsynced in a group before the last write (fd budget)
    writeback_ranges: int = 0    # write-behind starts handed to the kernel (writeback.py)
    wal_image_bytes: int = 0     # IMAGES payload bytes logged by the checkpoint (meta pages)
    images_from: int = 0         # WAL lsn at the cut (MARKER field)
    seconds: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)
    counters: dict[int, int] = field(default_factory=dict)


def run(state: StoreState, checkpoint_id: int, only: int | None = None) -> CheckpointStats | None:
    """One checkpoint; the caller holds the checkpoint lock.  None when nothing changed.

    ``only``: a *flush* of that one partition instead (a transfer snapshot's: its file
    then holds it at its counter). Stages 1-5 for its pages alone - its meta page's
    undo image at the cut, the WAL durable up to there, then its pages and meta page
    written and fsynced - but no marker: for recovery nothing happened (it rolls the
    file back to the last complete checkpoint with the undo images, which the flush
    logged like any cut, earliest image winning, and replays the WAL), so
    ``ckpt_counter`` stays and the next checkpoint includes the partition (its meta
    page again). ``file_counter`` and ``file_pages`` say what the file holds now."""
    t0 = time.perf_counter()
    if only is None:
        note_wal_start(state)
    with state.cond:
        state.undo.flush()                    # defensive: updates flush before unlocking
        if only is None:
            changed = {k >> 32 for k in state.mem.dirty}
            changed.update(pid for pid, p in state.parts.items()
                           if p.counter != p.ckpt_counter or p.page_count != p.file_pages)
        else:
            # nothing to flush when the file holds the partition exactly: the counter
            # and page count the last checkpoint or flush published, and no dirty page
            # (none is cut either: the caller holds the checkpoint lock)
            lo, hi = only << 32, (only + 1) << 32
            one = state.parts.get(only)
            changed = {only} if one is not None and (
                one.counter != one.file_counter or one.page_count != one.file_pages
                or any(lo <= k < hi for k in state.mem.dirty)) else set()
        if not changed:
            return None
        old_metas = {pid: state.parts[pid].meta_bytes for pid in changed}
        _lsn, meta_bytes, meta_saved = _log_meta_images(state, old_metas)
        # after the meta images: they belong to THIS checkpoint (rolled back only if
        # it does not complete), so their lsn must be <= its images_from
        start = state.wal.position()          # at or before images_from + 1
        images_from = state.wal.last_lsn
        mark = images_from if state.mark_override is None else state.mark_override
        cut = state.mem.begin_cut(only)
        for part in state.parts.values() if only is None else [state.parts[only]]:
            part.cut_pages = part.page_count  # first changes from now log an undo image
        metas = {pid: (state.parts[pid].page_count, state.parts[pid].counter) for pid in changed}
        new_metas = {pid: encode_meta(pid, state.page_size, count, counter)
                     for pid, (count, counter) in metas.items()}
        images, free, image_bytes, preimages = state.undo.take_counts() if only is None \
            else (0, 0, 0, 0)
    # Outside the store lock from here: ``cut`` is this checkpoint's (writers only read
    # it, to copy a cut page before changing it; install/drop wait for the checkpoint
    # lock).  The WAL fsync starts first, so it has the longest head start.
    stats = CheckpointStats(checkpoint_id, mark, counters={p: c for p, (_n, c) in metas.items()},
                            undo_images=images, undo_free=free, first_change_image_bytes=image_bytes,
                            preimages=preimages + meta_saved, images_from=images_from,
                            wal_image_bytes=meta_bytes)
    stage = _Stages(stats)
    try:
        syncer = _Syncer(state.wal, images_from)   # >= mark and every image it needs
        stats.stages["cut"] = time.perf_counter() - t0
        try:
            # page keys sort partition-major, index-minor: each partition is one slice,
            # its in-place pages (below the durable page count) first, then the appended
            keys = sorted(cut)
            spans = {}
            for pid in changed:
                lo = bisect_left(keys, pid << 32)
                hi = bisect_left(keys, (pid + 1) << 32, lo)
                mid = bisect_left(keys, pid << 32 | state.parts[pid].file_pages, lo, hi)
                spans[pid] = (lo, mid, hi)
                stats.overwritten += mid - lo + 1      # + the meta page
                stats.appended += hi - mid
            writer = _Writer(state, stats, len(keys) + len(changed), cut, syncer.done,
                             syncer.join)
            stage("sort")
            # More files than fit one group of unsynced files (half the open files
            # budget): no appended pages ahead of the WAL fsync; each file is written
            # whole after it, so it is fsynced once (in its group), not twice.
            overlap = len(spans) < writer.group
            if overlap:
                for pid, (_lo, mid, hi) in spans.items():
                    writer.write(pid, keys[mid:hi])
        finally:
            syncer.join()                     # undo images + updates <= mark durable
        writer.release()                      # held write-behind of the appended pages
        stats.stages["seal"] = writer.seal_s
        stats.stages["walsync_thread"] = syncer.seconds
        stage("append+walsync")
        for pid, (lo, mid, hi) in spans.items():
            writer.write(pid, keys[lo:mid if overlap else hi], head=new_metas[pid])
        writer.finish()
        stage("write")
        if only is None:                      # a flush writes no marker
            marker = state.wal.append(encode_marker(mark, checkpoint_id, images_from),
                                      RecordType.MARKER, wait=False)
            if state.mark_override is None:  # not while recovery still reads the log
                if state.prev_mark:
                    state.wal.truncate_before(state.prev_mark + 1)
                if start.lsn <= min(mark, images_from) + 1:
                    state.wal_start = (start, marker)
            state.prev_mark = mark
            stage("marker")
    except BaseException:
        with state.cond:
            # Not in the files: the next checkpoint must write these pages again
            # (and they must not be evicted as clean meanwhile).  Their undo images
            # (logged after the previous cut) stay valid: rollback goes back to the
            # last COMPLETE checkpoint, earliest image per page.
            state.mem.dirty.update(k for k in cut if k in state.mem.pages)
        raise
    finally:
        with state.cond:
            state.mem.end_cut()
            state.cond.notify_all()
    with state.cond:
        for pid, (count, counter) in metas.items():
            live = state.parts.get(pid)
            if live is not None and live.meta_bytes is old_metas[pid]:   # not replaced meanwhile
                if only is None:              # what a crash keeps: only a checkpoint's
                    live.ckpt_counter = max(live.ckpt_counter, counter)
                live.file_counter = max(live.file_counter, counter)
                live.file_pages = max(live.file_pages, count)
                live.meta_bytes = bytes(new_metas[pid])
        state.cond.notify_all()
    stats.pages = stats.appended + stats.overwritten
    stats.seconds = time.perf_counter() - t0
    return stats


def _log_meta_images(state: StoreState, old_metas: dict[int, bytes]) -> tuple[int, int, int]:
    """Stage 3, at the cut (store lock held): the meta pages' undo images (page 0 as the
    last checkpoint wrote it, kept in memory), one IMAGES record per partition, not
    waited for; open transfer snapshots get the same bytes.
    Returns (last lsn, IMAGES bytes, snapshot pre-images saved)."""
    payloads = []
    saved = 0
    for pid, meta in old_metas.items():
        payloads.append(encode_images(pid, state.page_size, [(0, meta)], []))
        snap = state.snapshots.get(pid)
        if snap is not None:
            saved += snap.save_preimages([(0, meta)])
    lsn = state.wal.append_many(payloads, RecordType.IMAGES, wait=False)
    return lsn, sum(map(len, payloads)), saved


class _Stages:
    def __init__(self, stats: CheckpointStats) -> None:
        self.stats, self.t = stats, time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.stats.stages[name] = now - self.t
        self.t = now


def _runs(keys: list[int], cut: dict[int, bytearray], page_size: int, batch: int = BATCH,
          head: bytearray | None = None) -> Iterator[tuple[int, list[bytearray]]]:
    """The pages of ``keys`` (page keys of one partition, ascending; buffers in ``cut``),
    consecutive ones joined into writes of at most ``batch`` bytes (and IOV_MAX pages).
    ``head``: page 0 (the new meta page), written first."""
    per = max(1, min(batch // page_size, 512))
    run: list[bytearray] = []
    start = prev = -2
    if head is not None:
        run, start, prev = [head], 0, 0
    for k in keys:
        index = k & 0xFFFFFFFF
        if run and (index != prev + 1 or len(run) >= per):
            yield start, run
            run = []
        if not run:
            start = index
        run.append(cut[k])
        prev = index
    if run:
        yield start, run


class _Writer:
    """Writes sealed pages in coalesced runs and counts toward the crash point.

    With the real file layer a run goes out as one ``os.pwritev`` of the page buffers
    (no copy); a layer that overrides ``pwrite`` (the crash harness) gets one
    ``pwrite`` of the run copied into a reused buffer, so it still sees every byte.

    Every file written is fsynced through the descriptor that wrote it (it stays open
    until then: files.py). Once ``group`` files (half the open files budget) are
    written and not yet fsynced, they are fsynced at once, after the WAL fsync
    (``wait_wal``; appended pages need nothing durable first, but like their
    write-behind they wait for it: writeback.py), and may be closed."""

    def __init__(self, state: StoreState, stats: CheckpointStats, total: int,
                 cut: dict[int, bytearray], gate: Callable[[], bool],
                 wait_wal: Callable[[], None]) -> None:
        self.state, self.stats, self.total, self.cut = state, stats, total, cut
        self.gate = gate      # write-behind waits for the WAL fsync (writeback.py)
        self.wait_wal = wait_wal
        self.io = fileio.layer()
        self.vector = type(self.io).pwrite is fileio.FileLayer.pwrite and hasattr(os, "pwritev")
        self.done, self.crashed = 0, False
        self.seal_s = 0.0
        self.behind: dict[int, WriteBehind] = {}
        self.started = 0      # write-behind starts of files already fsynced
        self.group = max(1, state.files.budget // 2)
        self.unsynced: dict[int, Partition] = {}
        self.synced: set[int] = set()

    def write(self, pid: int, keys: list[int], head: bytearray | None = None) -> None:
        """Seal and write the cut pages ``keys`` of partition ``pid`` (and ``head``)."""
        part = self.state.parts[pid]
        fd = part.write_fd()                  # open until its fsync (_sync)
        self.unsynced[pid] = part
        ps = self.state.page_size
        behind = None
        if self.vector:       # real file layer: start writeback as we go (writeback.py)
            behind = self.behind.get(pid)
            if behind is None:
                behind = self.behind[pid] = WriteBehind(fd, gate=self.gate)
        for start, run in _runs(keys, self.cut, ps, self.state.mem.io_bytes, head):
            ts = time.perf_counter()
            seal_many(run)
            self.seal_s += time.perf_counter() - ts
            size = len(run) * ps
            if self.vector:
                try:
                    n = os.pwritev(fd, run, start * ps)
                except OSError as e:
                    raise translate_os_error(e, part.path, size, OutOfDiskError) from e
            else:
                n = 0
            if n < size:          # copy path, or the rest of a short pwritev
                batch = self.state.batch_buffer()
                for j, buf in enumerate(run):
                    batch[j * ps:(j + 1) * ps] = buf
                _pwrite_all(self.io, fd, memoryview(batch)[n:size], start * ps + n, part.path)
            self.stats.bytes_written += size
            if behind is not None:
                behind.wrote(start * ps, size)
            self.done += len(run)
            if not self.crashed and self.done * 2 >= self.total:
                self.crashed = True
                crashpoint("checkpoint.mid_write")
        if behind is not None:
            behind.flush()
        if len(self.unsynced) >= self.group:
            self.wait_wal()
            self.stats.early_fsyncs += len(self.unsynced)
            self._sync()

    def release(self) -> None:
        """The WAL fsync is done: start the write-behind it held back."""
        for behind in self.behind.values():
            behind.flush(force=True)

    def finish(self) -> None:
        """fsync every file written and not fsynced yet."""
        self._sync()
        self.stats.writeback_ranges = self.started
        self.stats.files = len(self.synced)

    def _sync(self) -> None:
        for pid, part in list(self.unsynced.items()):
            behind = self.behind.pop(pid, None)   # its descriptor may be closed after
            if behind is not None:
                self.started += behind.started
            part.fsync()
            del self.unsynced[pid]
            self.synced.add(pid)


class _Syncer:
    """``wal.wait_durable(lsn)`` in a thread, so the WAL fsync overlaps the writes of
    appended pages (which need nothing durable first: no durable page refers to them)."""

    def __init__(self, wal: Wal, lsn: int) -> None:
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.thread: threading.Thread | None = None
        if lsn > wal.durable_lsn:
            self.thread = threading.Thread(target=self._run, args=(wal, lsn),
                                           name="ferry-checkpoint-walsync", daemon=True)
            self.thread.start()

    def _run(self, wal: Wal, lsn: int) -> None:
        t0 = time.perf_counter()
        try:
            wal.wait_durable(lsn)
            self.seconds = time.perf_counter() - t0
        except BaseException as e:
            self.error = e

    def done(self) -> bool:
        return self.thread is None or not self.thread.is_alive()

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
