"""The storage seam: what the transfer layer needs from whatever holds partition files.

Four operations: open a snapshot (with its pre-images), say where a partition lives,
check a page, install a verified file. Two implementations:

- :class:`DirectoryStorage`: a plain directory of ``part-<p>.bin`` files of any
  content (cache ``default`` at the top, other caches in sub-directories). No page
  structure: files are checked by chunk checksums only, and a file must not change
  while it is sent (if its size/mtime/ctime change, the supplier refuses the send with
  SOURCE_CHANGED and the demander re-demands).
- :class:`PartitionStoreStorage`: checkpoint's PartitionStore, whose snapshots save
  the pre-image of every page overwritten after the snapshot's counter C at or beyond
  the sent offset, and whose pages carry their own CRCs.

The transfer layer knows nothing else of nodes or indexes.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Protocol

from faults import fileio

from . import safefs
from .errors import BadPage as BadPage, Busy, NotHeld, TransferError, UnsafePath  # BadPage: re-exported
from .messages import check_cache, check_partition

DEFAULT_CACHE = "default"
NOMINAL_PAGE = 4096      # DirectoryStorage files have no pages; this only sizes pre-image frames


@dataclass
class Snapshot:
    """One partition as of counter C, as the supplier sends it.

    ``size`` is what the demander ends with (page_count * page_size for page files, the
    file size for plain files); ``fd`` is open on the live file for sendfile."""
    partition: int
    path: str
    fd: int
    size: int
    page_size: int
    page_count: int
    counter: int
    mark_sent: Callable[[int], None] = lambda offset: None
    preimages: Callable[[], Iterator[tuple[int, bytes]]] = lambda: iter(())
    # How many pre-images are saved so far (cheap), so a sender can re-read them only
    # when there are new ones; None: ask preimages() every time.
    preimage_count: Callable[[], int] | None = None
    # Why the file no longer is what was opened, or None. For storages without
    # pre-images (plain files), where a write during the send would tear the copy.
    changed: Callable[[], str | None] = lambda: None
    _close: Callable[[], None] = field(default=lambda: None, repr=False)

    def close(self) -> None:
        try:
            self._close()
        finally:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1


class TransferStorage(Protocol):
    """What the supplier and the demander use. ``verifies_pages`` says whether
    :meth:`check_page` means anything (False: chunk checksums are all there is)."""

    verifies_pages: bool

    def open_snapshot(self, cache: str, partition: int) -> Snapshot: ...
    def target_path(self, cache: str, partition: int) -> str: ...
    def check_page(self, buf: bytes, page_index: int, page_size: int) -> str | None: ...
    def install(self, cache: str, partition: int, src_path: str) -> None: ...

    # Optional: ``prepare_install(cache, partition, src_path)`` checks every page of the
    # received file (raising BadPage) and returns what ``install(..., prepared)`` takes;
    # the demander then skips its own page-by-page check (see PartitionStoreStorage).


def part_name(partition: int) -> str:
    from checkpoint.layout import part_name as name   # the one spelling; transfer needs no more of checkpoint
    return name(check_partition(partition))


class DirectoryStorage:
    """Plain files ``<root>/part-<p>.bin`` (cache "default") or ``<root>/<cache>/part-<p>.bin``.

    Nothing below ``root`` is followed if it is a link (transfer.safefs): a symlinked
    cache directory or partition file, a FIFO, socket or directory in a file's place is
    refused (NotHeld when serving, UnsafePath when receiving), never read or written."""

    verifies_pages = False

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)

    def _subdirs(self, cache: str) -> tuple[str, ...]:
        check_cache(cache)
        return () if cache == DEFAULT_CACHE else (cache,)

    def _dir(self, cache: str) -> str:
        return os.path.join(self.root, *self._subdirs(cache))

    def target_path(self, cache: str, partition: int) -> str:
        """Where the demander receives and installs; a cache directory that is a link
        (or not a directory) is refused here, before anything is created in it."""
        safefs.check_dirs(self.root, self._subdirs(cache))
        return os.path.join(self._dir(cache), part_name(partition))

    def open_snapshot(self, cache: str, partition: int) -> Snapshot:
        path = os.path.join(self._dir(cache), part_name(partition))
        try:
            # Every component below the root is opened without following links, the file
            # non-blocking (a FIFO would wait for a writer with a transfer slot held) and
            # only if it is a regular file.
            fd = safefs.open_beneath(self.root, self._subdirs(cache), part_name(partition))
        except FileNotFoundError:
            raise NotHeld(f"partition {partition} of cache {cache!r} is not held here "
                          f"({path} does not exist)", partition=partition) from None
        except UnsafePath as e:
            raise NotHeld(f"partition {partition} of cache {cache!r} is not served: {e.reason}",
                          partition=partition) from None
        except OSError as e:
            raise NotHeld(f"cannot open {path}: {e.strerror}", partition=partition) from None
        st = os.fstat(fd)
        stamp = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)

        def changed() -> str | None:
            now = os.fstat(fd)
            if (now.st_size, now.st_mtime_ns, now.st_ctime_ns) != stamp:
                return f"{path} was written while being sent (size/mtime changed)"
            return None
        return Snapshot(partition, path, fd, st.st_size, NOMINAL_PAGE, -(-st.st_size // NOMINAL_PAGE), 0,
                        preimage_count=lambda: 0, changed=changed)   # plain files have no pre-images

    def check_page(self, buf: bytes, page_index: int, page_size: int) -> str | None:
        return None

    def install(self, cache: str, partition: int, src_path: str) -> None:
        io = fileio.layer()
        dst = self.target_path(cache, partition)        # the cache directory is still no link
        st = os.lstat(src_path)
        if not stat.S_ISREG(st.st_mode):               # only ever install a regular file
            raise UnsafePath(f"{src_path} is {safefs.kind(st.st_mode)}, not the received file; "
                             "nothing installed", partition=partition)
        io.replace(src_path, dst)
        io.fsync_dir(os.path.dirname(dst))

    def ensure_dir(self, cache: str) -> str:
        safefs.check_dirs(self.root, self._subdirs(cache))
        d = self._dir(cache)
        os.makedirs(d, exist_ok=True)
        safefs.check_dirs(self.root, self._subdirs(cache))
        return d


def _not_beneath(path: str, fd: int) -> str | None:
    """Why ``fd`` must not be sent as ``path`` (a link or no regular file at that name,
    or not the inode it names), or None."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return e.strerror or str(e)
    if not stat.S_ISREG(st.st_mode):
        return (f"{path} is {safefs.kind(st.st_mode)}, not a regular file (links are not "
                "followed out of the data directory)")
    held = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (held.st_dev, held.st_ino):
        return f"{path} is no longer the file the store holds"
    return None


class StoreSnapshot(Protocol):
    """A copy-on-write snapshot of one partition at its counter (checkpoint's
    TransferSnapshot)."""
    path: str
    page_size: int
    page_count: int
    counter: int

    def mark_sent(self, offset: int) -> None: ...

    def fileno(self) -> int:
        """The live file's descriptor, kept open by the store until :meth:`close`."""
        ...

    def preimages(self) -> Iterator[tuple[int, bytes]]: ...

    @property
    def preimage_count(self) -> int: ...

    def close(self) -> None: ...


class PreparedInstall(Protocol):
    """A received file checked for install (checkpoint's Partition); ``close()`` gives
    it up."""

    def close(self) -> None: ...


class PageStore(Protocol):
    """What the transfer layer uses of checkpoint's PartitionStore: the seam's other
    side, so a move's counter C is typed from the demander down to the store."""

    page_size: int

    def partition_path(self, partition: int) -> str: ...

    def open_transfer_snapshot(self, partition: int) -> StoreSnapshot: ...

    def prepare_install(self, partition: int, src_path: str) -> PreparedInstall: ...

    def install_partition(self, partition: int, src_path: str,
                          prepared: PreparedInstall | None = None) -> None: ...

    def give_up_file(self, partition: int, to_path: str) -> bool: ...


class PartitionStoreStorage:
    """checkpoint's PartitionStore (one per cache, a :class:`PageStore`) behind the
    transfer storage seam; pages are checked with ``checkpoint.check_page``."""

    verifies_pages = True

    def __init__(self, stores: Mapping[str, PageStore] | PageStore) -> None:
        self.stores: Mapping[str, PageStore] = (stores if isinstance(stores, Mapping)
                                                else {DEFAULT_CACHE: stores})
        # imported here: transfer works without checkpoint (DirectoryStorage needs none)
        from checkpoint import (CheckpointError, PartitionNotFoundError, SnapshotBusyError,
                                check_page)
        self._check_page = check_page
        self._store_error: type[BaseException] = CheckpointError
        self._not_found: type[BaseException] = PartitionNotFoundError
        self._busy: type[BaseException] = SnapshotBusyError

    def _store(self, cache: str) -> PageStore:
        check_cache(cache)
        try:
            return self.stores[cache]
        except KeyError:
            raise NotHeld(f"cache {cache!r} is not held here") from None

    def target_path(self, cache: str, partition: int) -> str:
        return str(self._store(cache).partition_path(check_partition(partition)))

    def open_snapshot(self, cache: str, partition: int) -> Snapshot:
        store = self._store(cache)
        try:
            snap = store.open_transfer_snapshot(check_partition(partition))
        except self._store_error as e:
            if isinstance(e, self._not_found):
                raise NotHeld(f"partition {partition} of cache {cache!r} is not held here ({e})",
                              partition=partition) from None
            if isinstance(e, self._busy):
                raise Busy(f"partition {partition} is being sent to another demander ({e}); retry later",
                           partition=partition) from None
            raise TransferError(f"cannot snapshot partition {partition}: {e}", partition=partition) from None
        # A duplicate of the store's own descriptor, which the snapshot pins open: the
        # very inode the store reads and checkpoints, no open by name. The send holds
        # its own reference, so nothing the store closes (its open files budget, a
        # store closed under a send) takes the file from under sendfile. Still never
        # sent through a link: the name in the store's directory must be that inode.
        fd = snap.fileno()
        why = "the store's snapshot holds no open file" if fd < 0 else _not_beneath(str(snap.path), fd)
        if why is None:
            try:
                fd = os.dup(fd)
            except OSError as e:
                why = e.strerror or str(e)
        if why is not None:
            snap.close()
            raise TransferError(f"cannot send {snap.path}: {why}", partition=partition)
        return Snapshot(partition, str(snap.path), fd, snap.page_count * snap.page_size,
                        snap.page_size, snap.page_count, snap.counter,
                        mark_sent=snap.mark_sent, preimages=snap.preimages,
                        preimage_count=lambda: snap.preimage_count, _close=snap.close)

    def check_page(self, buf: bytes, page_index: int, page_size: int) -> str | None:
        return self._check_page(buf, page_index, page_size)

    def base_page_size(self, cache: str) -> int:
        """The page size of this side's copies of ``cache`` (a delta fetch's base)."""
        return int(self._store(cache).page_size)

    def prepare_install(self, cache: str, partition: int, src_path: str) -> PreparedInstall:
        """The page check of the whole received file, done by the store's install scan
        (every page's CRC and structure, in the same pass that builds the installed
        partition's key index): one read of the file instead of two. Returns what
        :meth:`install` takes (``close()`` it to give up); a bad page raises
        :class:`BadPage` (page, reason), anything else TransferError."""
        from checkpoint import CorruptPageError
        try:
            return self._store(cache).prepare_install(check_partition(partition), src_path)
        except CorruptPageError as e:
            raise BadPage(e.page, e.reason) from None
        except self._store_error as e:
            raise TransferError(f"the store refused partition {partition}: {e}",
                                partition=partition) from None

    def adopt_base(self, cache: str, partition: int, tmp_path: str) -> bool:
        """A delta fetch's base without a copy: the store forgets ``partition`` and its
        file becomes the temp file at ``tmp_path`` (``PartitionStore.give_up_file``),
        which the fetch then writes in place. False when the store holds no file of it."""
        try:
            return bool(self._store(cache).give_up_file(check_partition(partition), tmp_path))
        except self._store_error as e:
            if isinstance(e, self._busy):
                raise Busy(f"partition {partition} is being sent to another demander ({e}); "
                           "retry later", partition=partition) from None
            raise TransferError(f"the store kept partition {partition} as it is: {e}",
                                partition=partition) from None

    def install(self, cache: str, partition: int, src_path: str,
                prepared: PreparedInstall | None = None) -> None:
        try:
            self._store(cache).install_partition(partition, src_path, prepared)
        except self._store_error as e:
            raise TransferError(f"the store refused to install partition {partition}: {e}",
                                partition=partition) from None
