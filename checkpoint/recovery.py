"""Opening a store after a clean close or a crash.

1. ``*.delta`` files are removed: transfer snapshots do not survive a restart.
2. A complete legacy double-write file (format 1 stores) is written over the
   partition files, fsynced, then cleared.
3. The node WAL is opened; a first pass finds the last checkpoint marker (its mark
   and images_from) and, per partition, the last INSTALL/DROP record (records before
   it are not replayed).  Partitions whose last such record is a DROP lose their file.
   Every pass starts at the position in ``wal.start`` (the WAL's end at a complete
   checkpoint's cut, walstart.py) when there is a usable one, else at the start of
   the oldest segment kept.
4. Rollback: every IMAGES record with lsn > images_from (undo images of pages changed
   after the last complete checkpoint's cut - those logged while that checkpoint was
   still writing sit between its mark and its marker - and the meta images of a
   checkpoint that did not complete) is written back in WAL order, the EARLIEST image
   of a page winning; listed FREE pages are rewritten as empty FREE pages; each file is
   fsynced before it is closed (at most the store's open files budget are open at
   once).  Every file is now exactly as of the last marker - torn pages of an
   interrupted checkpoint included, whether they had an image (they are overwritten)
   or not (appended: past the restored page count).  Images of pages no checkpoint
   overwrote since write the bytes the file already holds.
5. Partition files are loaded (one sequential scan each, CRCs checked).
6. UPDATE records after the marker's mark are applied by counter: a record at or
   below the partition's counter (already in the file) is skipped, so replay is
   idempotent.
7. When anything was replayed or rolled back, a checkpoint is taken so the next start
   is short.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, NamedTuple

from faults import fileio

from . import dwb, walstart
from .layout import parse_part_name, part_name
from .partition import Partition
from .records import (RecordType, decode_images, decode_marker, decode_update,
                      record_partition)
from .undo import free_page

if TYPE_CHECKING:
    from wal import Position, Wal, WalReader

    from .state import StoreState

REPLAY_CHECKPOINT_FRACTION = 0.5


class Recovered(NamedTuple):
    wal: Wal                 # the node WAL, open
    replayed: int            # updates applied from the WAL
    rolled_back: int         # pages restored from undo images


def recover(state: StoreState, wal_sync: str, segment_size: int,
            checkpoint: Callable[[], object]) -> Recovered:
    """Steps 1-7 on the store's state: its partitions are loaded into ``state.parts``
    and ``state.wal`` is the opened WAL. ``checkpoint``: the store's checkpoint, run
    with the checkpoint lock held (step 7, and to bound memory during a long replay)."""
    from wal import Wal

    _remove_deltas(state.dir)
    _restore_double_write(state)
    at = walstart.read(state.dir)
    # the writer's own check of the last segment starts there too (wal/recovery.py)
    wal = Wal.open(os.path.join(state.dir, "wal"), segment_size=segment_size, sync=wal_sync,
                   start=at)
    try:
        found = _hinted_first_pass(wal, at) if at is not None else None
        if found is None:
            at = None
            found = _first_pass(wal)
        mark, images_from, barrier, dropped = found
        for gone in dropped:
            delete_partition_file(state.partition_path(gone))
        rolled_back = rollback(state.dir, _images_after(wal, images_from, at), barrier,
                               max_open=state.files.budget)
        for name in sorted(os.listdir(state.dir)):
            pid = parse_part_name(name)
            if pid is not None:
                state.parts[pid] = Partition(pid, os.path.join(state.dir, name), state.mem,
                                             state.undo, state.files)
        state.wal = wal
        state.prev_mark = mark
        replayed = _replay(state, wal, mark, barrier, checkpoint, at)
    except BaseException:
        for part in state.parts.values():
            part.close()
        wal.close()
        raise
    if replayed or rolled_back:
        with state.ckpt_lock:
            checkpoint()
    return Recovered(wal, replayed, rolled_back)


def _remove_deltas(directory: str) -> None:
    for name in os.listdir(directory):
        if name.endswith(".delta"):
            os.unlink(os.path.join(directory, name))


def _restore_double_write(state: StoreState) -> None:
    dwb_path = os.path.join(state.dir, dwb.NAME)
    found = dwb.read(dwb_path)
    if found is None:
        return
    page_size, pages = found
    io = fileio.layer()
    for pid, images in dwb.by_partition(pages):
        path = state.partition_path(pid)
        if not os.path.exists(path):
            continue
        fd = io.open(path, os.O_RDWR)
        try:
            for index, buf in images:
                io.pwrite(fd, buf, index * page_size)
            io.fsync(fd)
        finally:
            io.close(fd)
    dwb.clear(dwb_path)


def _hinted_first_pass(wal: Wal, at: Position) -> tuple[int, int, dict[int, int], set[int]] | None:
    """The first pass from ``at`` (``wal.start``); None when the hint does not describe
    this log or no marker of its checkpoint or a later one is found behind it: the
    caller then reads from the oldest segment kept."""
    from wal import CorruptRecordError, PositionMismatch
    try:
        found = _first_pass(wal, at)
    except (PositionMismatch, CorruptRecordError):
        return None         # damage after the hint: the full read meets it again, and says so
    mark = found[0]
    # the hinted checkpoint's marker has mark >= at.lsn - 1, and so has any later one
    return found if mark and mark >= at.lsn - 1 else None


def _read(wal: Wal | WalReader, start: int,
          at: Position | None) -> Iterator[list[tuple[int, int, bytes]]]:
    """The records from ``start`` on, entering the log at ``at`` (a :class:`Wal`'s
    ``wal.start``) when it is at or before ``start``."""
    if at is not None and at.lsn <= start:
        return wal.read_from(start, at=at).batches()   # type: ignore[call-arg]
    return wal.read_from(start).batches()


def _first_pass(wal: Wal, at: Position | None = None) -> tuple[int, int, dict[int, int], set[int]]:
    """(mark, images_from) of the last marker, INSTALL/DROP barriers, dropped partitions.

    Reads every record kept (up to a whole segment after a crash), so it goes by the
    reader's batches of plain tuples and decodes only what it needs: a marker, the
    partition of an INSTALL or DROP, and the partition of an UPDATE only while some
    partition's last INSTALL/DROP is a DROP (an update then re-creates it)."""
    mark = images_from = 0
    barrier: dict[int, int] = {}
    dropped: set[int] = set()        # partitions whose last INSTALL/DROP/UPDATE is a DROP
    marker, install, drop, update = (int(RecordType.MARKER), int(RecordType.INSTALL),
                                     int(RecordType.DROP), int(RecordType.UPDATE))
    for batch in _read(wal, wal.first_lsn if at is None else at.lsn, at):
        for lsn, kind, payload in batch:
            if kind == update:
                if dropped:
                    dropped.discard(record_partition(payload))   # re-created after the drop
            elif kind == marker:
                mark, _id, since = decode_marker(payload)
                images_from = lsn if since is None else since
            elif kind == install or kind == drop:
                pid = record_partition(payload)
                barrier[pid] = lsn
                if kind == drop:
                    dropped.add(pid)
                else:
                    dropped.discard(pid)
    return mark, images_from, barrier, dropped


def _images_after(wal: Wal | WalReader, images_from: int,
                  at: Position | None = None) -> Iterator[tuple[int, bytes]]:
    """(lsn, payload) of the IMAGES records with lsn > images_from, in WAL order.
    ``at``: where to enter the log (a :class:`Wal`'s ``wal.start``)."""
    start = max(wal.first_lsn or 0, images_from + 1)
    last = getattr(wal, "last_lsn", None)     # a WalReader does not know it: read to the end
    if last is not None and start > last:
        return
    images = int(RecordType.IMAGES)
    for batch in _read(wal, start, at):
        for lsn, kind, payload in batch:
            if kind == images:
                yield lsn, payload


def pending_undo(wal_dir: str) -> list[tuple[int, bytes]]:
    """(lsn, IMAGES payload) that the next open rolls back (tests, tools)."""
    from wal import Wal
    reader = Wal.reader(wal_dir)
    _mark, images_from, _b, _d = _first_pass(reader)  # type: ignore[arg-type]
    return list(_images_after(reader, images_from))


def rollback(directory: str, undo: Iterable[tuple[int, bytes]], barrier: dict[int, int], *,
             max_open: int = 64) -> int:
    """Write the undo images back in WAL order, only the earliest image of each page
    (step 4); returns the number of pages restored.  Images older than an INSTALL/DROP
    of their partition belong to a replaced file.  At most ``max_open`` files are open
    at once: past that the least recently written one is fsynced, then closed (so no
    write is left without its fsync), and opened again if a later image needs it."""
    io = fileio.layer()
    fds: OrderedDict[int, int] = OrderedDict()
    done: set[int] = set()
    try:
        for lsn, payload in undo:
            im = decode_images(payload)
            if lsn <= barrier.get(im.partition, 0):
                continue
            fd = fds.get(im.partition)
            if fd is None:
                path = os.path.join(directory, part_name(im.partition))
                if not os.path.exists(path):
                    continue
                if len(fds) >= max(1, max_open):
                    _old, old_fd = fds.popitem(last=False)
                    try:
                        io.fsync(old_fd)
                    finally:
                        io.close(old_fd)
                fd = fds[im.partition] = io.open(path, os.O_RDWR)
            else:
                fds.move_to_end(im.partition)
            base = im.partition << 32
            for index, buf in im.pages:
                if base | index not in done:
                    done.add(base | index)
                    _pwrite_all(io, fd, buf, index * im.page_size)
            for index in im.free:
                if base | index not in done:
                    done.add(base | index)
                    _pwrite_all(io, fd, free_page(index, im.page_size), index * im.page_size)
        for fd in fds.values():
            io.fsync(fd)
    finally:
        for fd in fds.values():
            io.close(fd)
    return len(done)


def _pwrite_all(io: fileio.FileLayer, fd: int, data: bytes | bytearray, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = io.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _replay(state: StoreState, wal: Wal, mark: int, barrier: dict[int, int],
            checkpoint: Callable[[], object], at: Position | None = None) -> int:
    replayed = 0
    start = max(wal.first_lsn, mark + 1)
    if start > wal.last_lsn:
        return 0
    update = int(RecordType.UPDATE)
    for batch in _read(wal, start, at):
        for lsn, kind, payload in batch:
            if kind != update:
                continue
            u = decode_update(payload)
            if lsn <= barrier.get(u.partition, 0):
                continue
            part = state.part(u.partition, create=True)
            if u.counter > part.counter:
                part.write(u.key, u.value, u.counter)
                if state.undo.full:               # first-change undo images, as a writer's
                    state.undo.flush()
                replayed += 1
                if state.mem.pressure >= state.mem.capacity * REPLAY_CHECKPOINT_FRACTION:
                    # Bounded memory during a long replay: checkpoint what is applied so
                    # far. The marker's mark is this record, not the WAL's end, and no
                    # segment is reclaimed while we still read them.
                    state.mark_override = lsn
                    with state.ckpt_lock:
                        checkpoint()
                    state.mark_override = None
    state.undo.flush()
    return replayed


def delete_partition_file(path: str) -> None:
    io = fileio.layer()
    try:
        io.unlink(path)
    except FileNotFoundError:
        return
    io.fsync_dir(os.path.dirname(path))
