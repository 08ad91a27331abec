"""Partition page files opened on demand, within a budget of open descriptors.

A store holds one :class:`PageFile` per partition: its path and the identity of the
file it opened first, no descriptor of its own. Its :class:`FileCache` opens the
file when a page is read (``O_RDONLY``) or a checkpoint writes (``O_RDWR``, through
the file-I/O seam, so the crash harness sees the writes), and keeps at most
``budget`` descriptors open across all of them, closing the least recently used
first. So a node with 100,000 partitions needs a few hundred descriptors, not
100,000 or more.

What is never closed:

* a file in use: pinned (a page read, a scan batch, a transfer snapshot's file
  being sent with sendfile: :meth:`FileCache.pin` / :meth:`FileCache.unpin`);
* a file written since its last fsync (``unsynced``): a checkpoint's writes are
  followed by an fsync through the same descriptor. Linux would let an fsync on a
  reopened descriptor write back the earlier writes, but a write-back error that
  happened while no descriptor was open may be reported to none (or the inode,
  with its error, may leave the cache in between): the error must reach the
  fsync the checkpoint waits for, so the descriptor that wrote stays open until
  that fsync succeeded. Nothing else writes the files through the cache.

So durability is exactly what it was when every file stayed open: a closed file has
nothing unsynced, and its bytes are whatever the last fsync made durable.

When every open file is in use a new open goes past the budget rather than wait
(``peak`` in :meth:`FileCache.stats`); the budget is back as soon as they are
released. The checkpointer keeps at most half the budget of written-but-unsynced
files: past that it fsyncs them as a group (``checkpointer._Writer``). An open that
fails for want of descriptors (EMFILE/ENFILE) closes one unused file and tries
once more.

A reopened file must be the inode first opened (device and inode number) and a
regular file: a file replaced behind the store's back is refused
(:class:`~checkpoint.errors.CheckpointError`), never read or written in its place.
The store's own rename of a file (install) keeps the inode: :meth:`FileCache.rename`.

The cache has a lock of its own, a leaf: it is taken with or without the store lock,
and nothing is called under it but opening, fstat and closing files.
"""
from __future__ import annotations

import errno
import os
import resource
import stat
import threading
from collections import OrderedDict

from faults import fileio

from .errors import CheckpointError

DEFAULT_BUDGET = 1024      # descriptors of partition files per store, at most ...
RLIMIT_SHARE = 4           # ... and at most this fraction of the soft RLIMIT_NOFILE
MIN_BUDGET = 4             # a page read, a checkpoint's group of two, a snapshot


def default_budget() -> int:
    """min(DEFAULT_BUDGET, a quarter of the soft RLIMIT_NOFILE), at least MIN_BUDGET."""
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return DEFAULT_BUDGET
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_BUDGET
    return max(MIN_BUDGET, min(DEFAULT_BUDGET, soft // RLIMIT_SHARE))


def check_budget(budget: object) -> int:
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < MIN_BUDGET:
        raise CheckpointError(f"open files budget must be a whole number >= {MIN_BUDGET}, "
                              f"not {budget!r}")
    return budget


class PageFile:
    """One partition file as the cache knows it. Read its fields under the cache lock."""

    __slots__ = ("path", "rfd", "wfd", "pins", "unsynced", "ident", "dead")

    def __init__(self, path: str) -> None:
        self.path = path
        self.rfd = -1                 # O_RDONLY descriptor, -1 while closed
        self.wfd = -1                 # O_RDWR descriptor (the file-I/O seam's), -1 while closed
        self.pins = 0                 # users of rfd (never closed while > 0)
        self.unsynced = False         # written through wfd since its last fsync
        self.ident: tuple[int, int] | None = None   # (st_dev, st_ino) of the first open
        self.dead = False             # closed for good (partition dropped, replaced, store closed)

    @property
    def busy(self) -> bool:
        return self.pins > 0 or self.unsynced

    def __repr__(self) -> str:
        return (f"PageFile({self.path!r}, rfd={self.rfd}, wfd={self.wfd}, pins={self.pins}, "
                f"unsynced={self.unsynced})")


class FileCache:
    """The open descriptors of one store's partition files (see module doc)."""

    def __init__(self, budget: int | None = None) -> None:
        self.budget = default_budget() if budget is None else check_budget(budget)
        self._lock = threading.Lock()
        # files with a descriptor open, least recently used first
        self._lru: OrderedDict[PageFile, None] = OrderedDict()
        self.open_fds = 0
        self.peak = 0
        self.opens = 0
        self.closes = 0

    # -- reads -------------------------------------------------------------------
    def pin(self, f: PageFile) -> int:
        """The file's read descriptor, opened if need be and kept open until
        :meth:`unpin`. Pins nest."""
        with self._lock:
            fd = f.rfd
            if fd < 0:
                fd = self._open(f, write=False)
            else:
                self._lru.move_to_end(f)
            f.pins += 1
            return fd

    def unpin(self, f: PageFile) -> None:
        with self._lock:
            f.pins -= 1
            assert f.pins >= 0, f
            if f.pins == 0:
                if f.dead:
                    self._close_fds(f)
                elif self.open_fds > self.budget:
                    self._evict(0)

    def pread(self, f: PageFile, n: int, offset: int) -> bytes:
        fd = self.pin(f)
        try:
            return os.pread(fd, n, offset)
        finally:
            self.unpin(f)

    def preadv(self, f: PageFile, bufs: list[bytearray | memoryview], offset: int) -> int:
        fd = self.pin(f)
        try:
            return os.preadv(fd, bufs, offset)
        finally:
            self.unpin(f)

    # -- writes (the checkpointer) -------------------------------------------------
    def write_fd(self, f: PageFile) -> int:
        """The descriptor to write the file through. From this call the file counts as
        written: it stays open until :meth:`fsync` succeeds."""
        with self._lock:
            fd = f.wfd
            if fd < 0:
                fd = self._open(f, write=True)
            else:
                self._lru.move_to_end(f)
            f.unsynced = True
            return fd

    def fsync(self, f: PageFile) -> None:
        """fsync through the descriptor that wrote; the file may be closed after. A
        failed fsync leaves it written (open): the next checkpoint writes its pages
        again and fsyncs that same descriptor."""
        with self._lock:
            fd = f.wfd
            if not f.unsynced or fd < 0:
                return                # nothing written since the last fsync
        fileio.layer().fsync(fd)      # unsynced: nobody closes it meanwhile
        with self._lock:
            if f.wfd == fd:
                f.unsynced = False
                if f.dead and f.pins == 0:
                    self._close_fds(f)
                elif self.open_fds > self.budget:
                    self._evict(0)

    # -- the file itself -----------------------------------------------------------
    def file(self, path: str) -> PageFile:
        """A handle of ``path``; nothing is opened until it is used."""
        return PageFile(path)

    def rename(self, f: PageFile, path: str) -> None:
        """The store renamed the file (install): later opens use ``path``, and must
        still find the same inode."""
        with self._lock:
            f.path = path

    def close(self, f: PageFile) -> None:
        """Done with the file for good (its partition is dropped or replaced, the store
        closes): its descriptors are closed now, or by the last unpin. Unsynced writes
        are given up with it, as closing the file always did."""
        with self._lock:
            f.dead = True
            f.unsynced = False
            if f.pins == 0:
                self._close_fds(f)

    def trim(self, keep: int = 0) -> None:
        """Close unused files, least recently used first, until at most ``keep``
        descriptors are open (or only files in use are left)."""
        with self._lock:
            for f in [f for f in self._lru if not f.busy]:
                if self.open_fds <= keep:
                    break
                self._close_fds(f)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"open_files": self.open_fds, "open_files_budget": self.budget,
                    "open_files_peak": self.peak, "file_opens": self.opens,
                    "file_closes": self.closes}

    # -- under the lock ------------------------------------------------------------
    def _open(self, f: PageFile, write: bool) -> int:
        if f.dead:
            raise CheckpointError(f"{f.path}: the partition's file was closed (dropped, "
                                  "replaced, or the store closed)")
        self._evict(1)
        try:
            fd = self._os_open(f.path, write)
        except OSError as e:
            if e.errno not in (errno.EMFILE, errno.ENFILE) or not self._evict_one():
                raise
            fd = self._os_open(f.path, write)
        try:
            st = os.fstat(fd)
            ident = (st.st_dev, st.st_ino)
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointError(f"{f.path} is no longer a regular file; the store does "
                                      "not read or write it")
            if f.ident is None:
                f.ident = ident
            elif f.ident != ident:
                raise CheckpointError(f"{f.path} was replaced behind the store (inode "
                                      f"{f.ident[1]}, now {ident[1]}); the store does not read "
                                      "or write another file in its place: restore the file "
                                      "or restart the node")
        except BaseException:
            self._os_close(fd, write)
            raise
        if write:
            f.wfd = fd
        else:
            f.rfd = fd
        self.open_fds += 1
        self.opens += 1
        if self.open_fds > self.peak:
            self.peak = self.open_fds
        self._lru[f] = None
        self._lru.move_to_end(f)
        return fd

    @staticmethod
    def _os_open(path: str, write: bool) -> int:
        if write:
            return fileio.layer().open(path, os.O_RDWR | os.O_CLOEXEC)
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    @staticmethod
    def _os_close(fd: int, write: bool) -> None:
        if write:
            fileio.layer().close(fd)
        else:
            os.close(fd)

    def _evict(self, need: int) -> None:
        """Close unused files, least recently used first, until ``need`` more
        descriptors fit the budget (or nothing more can be closed). Files in use that
        are passed on the way move to the young end, so the next pass does not walk
        past them again."""
        over = self.open_fds + need - self.budget
        if over <= 0:
            return
        passed: list[PageFile] = []
        victims: list[PageFile] = []
        for f in self._lru:
            if f.busy:
                passed.append(f)
                continue
            victims.append(f)
            over -= (f.rfd >= 0) + (f.wfd >= 0)
            if over <= 0:
                break
        for f in passed:
            self._lru.move_to_end(f)
        for f in victims:
            self._close_fds(f)

    def _evict_one(self) -> bool:
        for f in self._lru:
            if not f.busy:
                self._close_fds(f)
                return True
        return False

    def _close_fds(self, f: PageFile) -> None:
        """Close the file's descriptors (unused, nothing unsynced: the callers check)."""
        self._lru.pop(f, None)
        for write in (False, True):
            fd = f.wfd if write else f.rfd
            if fd < 0:
                continue
            if write:
                f.wfd = -1
            else:
                f.rfd = -1
            self.open_fds -= 1
            self.closes += 1
            try:
                self._os_close(fd, write)
            except OSError:
                pass                  # closed all the same (EINTR, EIO of a write-back)
