"""Undo images logged at a page's FIRST CHANGE after a checkpoint cut (format 2).

The checkpointer overwrites pages in place; a crash in the middle can tear them, so
before a checkpoint overwrites a page the node WAL must durably hold the page as the
previous checkpoint left it (its undo image).  Format 1 read those bytes back from the
file at checkpoint time (twice the bytes, a read, two fsyncs in series).  Here they are
taken from page memory when a writer first changes the page after a cut - the
PostgreSQL full-page-write idea applied to undo images:

* At that moment the page in memory is exactly its state at the last cut: a page
  changed since the cut is in ``mem.dirty`` (no second image), and a page of the
  running checkpoint's cut is copied before a writer changes it, so the resident
  buffer still holds the cut's bytes.  A clean page read back from the file holds what
  the last checkpoint wrote, which is the cut's state too (cut pages are never
  evicted before they are written).
* Pages at or past the partition's page count at the last cut (``cut_pages``) were not
  in that checkpoint's file: rolled back they are past the restored page count, so
  they need nothing.  A FREE page (reused by an insert) is only *listed*: rollback
  writes an empty FREE page, which is all a FREE page holds.
* The images are appended under the store lock, after the update's own record and
  before the lock is released, so they precede the next cut: every checkpoint that
  overwrites the page has ``images_from`` (the WAL's last lsn at its cut) >= their lsn,
  and makes the WAL durable up to that lsn before any in-place write.  Their order
  relative to the update record does not matter: an image only has to be durable
  before the overwrite, and the update's own acknowledgement waits only for itself
  (in practice both ride the same group commit).
* Recovery rolls back every IMAGES record with lsn greater than the last complete
  marker's ``images_from``, earliest image per page winning (recovery.py).

Open transfer snapshots get the same bytes (``save_preimages``) at the same moment: a
page not yet sent is saved before any checkpoint can overwrite it.

Memory: the images of one update are held until the update ends (an update touches
a few pages, plus the overflow chain of the value it replaces: proportional to the
values it carries); ``apply_many`` flushes between items once ``mem.io_bytes`` are
pending.
Every method runs under the store lock.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from . import page as pg
from .layout import OFF_TYPE, PageType, seal
from .memory import PageMemory
from .records import RecordType, encode_images

if TYPE_CHECKING:
    from wal import Wal

    from .snapshot import TransferSnapshot


class Pages(Protocol):
    """What the log needs of a partition (a :class:`~checkpoint.partition.Partition`)."""
    pid: int
    page_size: int

    def page(self, index: int) -> bytearray: ...


def free_page(index: int, page_size: int) -> bytearray:
    """The exact bytes of an empty FREE page (what rollback writes for a listed page)."""
    buf = pg.new_page(index, page_size, PageType.FREE)
    seal(buf)
    return buf


class ImageLog:
    """First-change undo images of one store, batched per update (see module doc)."""

    def __init__(self, mem: PageMemory, page_size: int,
                 snapshots: dict[int, TransferSnapshot]) -> None:
        self.mem, self.page_size = mem, page_size
        self.snapshots = snapshots             # the store's open transfer snapshots
        self.wal: Wal | None = None            # the node WAL, set once recovery opened it
        self.pending: dict[int, tuple[list[tuple[int, bytearray]], list[int]]] = {}
        self.pending_bytes = 0
        # since the last cut (moved into the checkpoint's stats by take_counts)
        self.images = self.free = self.image_bytes = self.preimages = 0

    def image(self, part: Pages, index: int, buf: bytearray) -> None:
        """Page ``index`` of ``part`` is about to change for the first time since the
        cut; ``buf`` holds its bytes at the cut (unsealed: CRCs are set when written)."""
        img = bytearray(buf)
        seal(img)
        snap = self.snapshots.get(part.pid)
        if snap is not None:
            self.preimages += snap.save_preimages([(index, img)])
        images, free = self.pending.setdefault(part.pid, ([], []))
        if img[OFF_TYPE] == PageType.FREE and img == free_page(index, part.page_size):
            free.append(index)
            self.pending_bytes += 4
        else:
            images.append((index, img))
            self.pending_bytes += len(img) + 4

    def free_page(self, part: Pages, index: int) -> None:
        """Page ``index`` (FREE in memory, untouched since the cut) is about to be reused."""
        if part.pid in self.snapshots:
            self.image(part, index, part.page(index))   # the snapshot wants its exact bytes
            return
        self.pending.setdefault(part.pid, ([], []))[1].append(index)
        self.pending_bytes += 4

    @property
    def full(self) -> bool:
        """Enough is pending to flush between two updates of a batch."""
        return self.pending_bytes >= self.mem.io_bytes

    def flush(self) -> int:
        """Append what is pending as IMAGES records (not waited for); the last lsn or 0.

        Called between updates, never inside one (a failure must not leave an update
        half applied).  When the append fails (disk full) the images stay pending and
        the error propagates: the next update retries, and the checkpointer flushes
        before its cut, so no page is ever overwritten without its image."""
        if not self.pending:
            return 0
        assert self.wal is not None, "undo images before recovery opened the WAL"
        ps = self.page_size
        payloads = [encode_images(pid, ps, images, free)
                    for pid, (images, free) in self.pending.items()]
        lsn = self.wal.append_many(payloads, RecordType.IMAGES, wait=False)
        for images, free in self.pending.values():
            self.images += len(images)
            self.free += len(free)
        self.image_bytes += sum(map(len, payloads))
        self.pending = {}
        self.pending_bytes = 0
        return lsn

    def discard(self, partition: int) -> None:
        """The partition's file is being replaced or deleted (INSTALL/DROP)."""
        self.pending.pop(partition, None)

    def take_counts(self) -> tuple[int, int, int, int]:
        """(images, free, image bytes, snapshot pre-images) since the last call."""
        out = (self.images, self.free, self.image_bytes, self.preimages)
        self.images = self.free = self.image_bytes = self.preimages = 0
        return out
