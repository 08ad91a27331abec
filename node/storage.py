"""One cache's data and indexes on this node: ``checkpoint.PartitionStore`` at
``DATA/caches/<cache>/`` and ``indexes.IndexStore`` at ``DATA/indexes/<cache>/``.

This is the node's only seam to storage. Every data change also updates the indexes
(old value read first), so data and indexes agree.

Start-up errors enter here: what the data dir holds that the node cannot use (a
corrupt or missing partition file, a renamed WAL segment, a directory where a file
belongs, a garbage index, no permission, a pseudo file system) becomes a
:class:`~node.errors.DataDirError` with one line saying what, where and what to do, and
``ferry node start`` exits 2 with it instead of a traceback.
"""
from __future__ import annotations

import errno
import logging
import os
import stat
import time
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence

from checkpoint import PartitionStore
from faults import FerryError, fileio
from faults.latch import Latch, cause_of
from checkpoint.pagefile import iter_entries
from indexes import BadQueryError, IndexDefinition, IndexStore

from .config import CacheConfig, NodeConfig

if TYPE_CHECKING:
    from checkpoint.checkpointer import CheckpointStats
from .errors import BadRequest, DataDirError
from .states import State, StateTable

log = logging.getLogger("ferry.node.storage")

# what a node with unusable data can do; its copies are in the rest of the cluster
REFILL = ("restore it from a backup, or start this node on an empty data dir so that it "
          "pulls its partitions from the other owners")


def os_problem(e: OSError) -> str:
    """What an OS error means for a path in a data dir, and what to do about it."""
    where = e.filename if e.filename is not None else "?"
    why = {
        errno.EACCES: "permission denied: give the node's user read and write access, or use "
                      "another --data",
        errno.EPERM: "operation not permitted: give the node's user read and write access, or "
                     "use another --data",
        errno.EROFS: "the file system is read-only: use a --data on a writable file system",
        errno.ENOSPC: "no space left on the file system: free some and start again",
        errno.EDQUOT: "disk quota exceeded: free some space and start again",
        errno.ELOOP: "a loop of symbolic links: point --data at a real directory",
        errno.ENOTDIR: "a part of this path is not a directory: move that file aside",
        errno.EISDIR: "a directory where a file belongs: move it out of the data dir",
        errno.EEXIST: "exists but is not a directory: move it aside",
        errno.ENOENT: "no such file or directory",
    }.get(e.errno or 0, e.strerror or str(e))
    return f"{where}: {why}"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def check_data_dir(data: str) -> None:
    """``data`` is (or is made) a directory. Raises DataDirError. The node's first
    files in it are checked where they are opened: :func:`open_lock_file`,
    :func:`read_node_id`."""
    try:
        try:
            os.makedirs(data, exist_ok=True)
        except FileExistsError:     # there, but not a directory: said below
            pass
        st = os.stat(data)
    except OSError as e:
        raise DataDirError(f"cannot use --data {os_problem(e)}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise DataDirError(f"--data {data} is {_kind(st.st_mode)}, not a directory: point --data "
                           "at a directory (it is created if missing)")


def open_lock_file(data: str) -> int:
    """Open (create) ``data/LOCK``, the first file a node creates. /proc and /sys refuse
    it with ENOENT, a read-only mount with EROFS, a directory without write access
    with EACCES; each is one DataDirError that says what to do."""
    lock = os.path.join(data, "LOCK")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise DataDirError(f"cannot create files in --data {data} (is it on a pseudo file "
                               "system such as /proc or /sys?): use a directory on a disk") from None
        raise DataDirError(f"cannot create files in --data {os_problem(e)}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise DataDirError(f"{lock} is {_kind(mode)}, not the node's lock file: remove it and "
                           "start again")
    return fd


def read_node_id(data: str) -> str | None:
    """The id in ``data/node.id`` (None for a new data dir): UTF-8 text in a regular file."""
    node_id = os.path.join(data, "node.id")
    try:
        st = os.stat(node_id)
        if not stat.S_ISREG(st.st_mode):
            raise DataDirError(f"{node_id} is {_kind(st.st_mode)}, not the file of this data "
                               "dir's node id: move it aside")
        with open(node_id, "rb") as f:
            return f.read(4096).decode("utf-8").strip()
    except FileNotFoundError:
        return None                 # a new data dir: the node writes it
    except OSError as e:
        raise DataDirError(f"cannot read the node id: {os_problem(e)}") from None
    except UnicodeDecodeError:
        raise DataDirError(f"{node_id} is not UTF-8 text; it holds the id of the node this data "
                           "dir belongs to, written at its first start: write that id back into "
                           "it, or use another data dir") from None


def _start_error(e: BaseException, cache: str, what: str) -> DataDirError:
    """A storage error at start-up of ``cache`` as one line with what to do."""
    if isinstance(e, OSError):
        return DataDirError(f"cache {cache}: cannot open {what}: {os_problem(e)}")
    from indexes import IndexCorruptError, IndexStoreError
    if isinstance(e, IndexCorruptError):
        return DataDirError(f"cache {cache}: index file {e.path} is corrupt; the indexes hold no "
                            f"data of their own: delete {os.path.dirname(e.path)} and start "
                            "again, the node rebuilds them from the partition files")
    if isinstance(e, IndexStoreError):
        return DataDirError(f"cache {cache}: cannot open its indexes: {e}")
    from checkpoint import CheckpointError, CorruptPageError
    if isinstance(e, CorruptPageError):
        return DataDirError(f"cache {cache}: partition file {e.path} is corrupt at page {e.page} "
                            f"(byte offset {e.offset}): {e.reason}; {REFILL}")
    if isinstance(e, CheckpointError):
        return DataDirError(f"cache {cache}: {e}; {REFILL}")
    return DataDirError(f"cache {cache}: cannot open {what}: {e}")    # the WAL's own advice


def check_held(data: dict[str, "CacheData"], states: StateTable) -> None:
    """Every partition the state table says this node OWNS has its file. A partition
    is created before it is marked OWNING and deleted only after it left OWNING, so one
    without its file is damage; left alone, it failed the node's first report to the
    control plane with a traceback."""
    # one set per cache: a lookup per OWNING partition in the sorted list
    # partitions() copies would be quadratic in the partitions a node holds
    held = {cache: set(d.partitions()) for cache, d in data.items()}
    for (cache, p), s in states.items():
        if s is State.OWNING and cache in held and p not in held[cache]:
            path = data[cache].store.partition_path(p)
            raise DataDirError(f"cache {cache} partition {p} is OWNING in states.json but its "
                               f"file {path} is missing: {REFILL}")


Entry = tuple[bytes, "bytes | None", int]


class CacheData:
    """Data + indexes of one cache. Writers of one partition are serialised by the
    caller (the update path holds the partition lock)."""

    def __init__(self, cfg: NodeConfig, cache: CacheConfig, *, clean: bool = False) -> None:
        self.cache = cache
        self.root = os.path.join(cfg.data, "caches", cache.name)
        self.index_root = os.path.join(cfg.data, "indexes", cache.name)
        try:
            os.makedirs(self.root, exist_ok=True)
            self.store = PartitionStore.open(self.root, page_size=cfg.page_size,
                                             memory_budget=cfg.memory_budget, wal_sync=cfg.wal_sync,
                                             checkpoint_interval=cfg.checkpoint_interval_s)
        except (FerryError, OSError) as e:
            raise _start_error(e, cache.name, f"its partitions in {self.root}") from None
        # Partitions whose index missed a change its data took (the index commit hit a
        # full disk, a read-only file system, no descriptors after the data was
        # logged): rebuilt from the data before the partition's next change.
        self._behind: set[int] = set()
        # Partitions whose index is not known to match the data since this start (an
        # unclean stop, or no ready marker): rebuilt before the partition's next change
        # or index read, by a move that replaces the partition, or by the node's
        # background pass (:meth:`stale_indexes`). Not at start-up: a node that crashed
        # serves (and resyncs the copies it will lose anyway) without first rebuilding
        # every index it holds.
        self._stale: set[int] = set()
        self._index_latch = Latch("index", self.index_root)
        try:
            os.makedirs(self.index_root, exist_ok=True)
            defs = [IndexDefinition(i.name, i.field, unique=i.unique) for i in cache.indexes]
            self.indexes = IndexStore.open(self.index_root, defs)
            # An index update follows its data update; a crash between the two leaves the
            # index behind. Without a clean-shutdown marker, rebuild it from the data.
            for p in self.store.partitions():
                if not cache.indexes:
                    if not self.indexes.ready(p):    # no definitions: nothing to rebuild
                        self.indexes.ready_empty(p)
                elif not clean or not self.indexes.ready(p):
                    self._stale.add(p)
        except (FerryError, OSError) as e:
            err = _start_error(e, cache.name, f"its indexes in {self.index_root}")
            if getattr(self, "indexes", None) is not None:
                self.indexes.close()
            self.store.close(checkpoint=False)
            raise err from None

    # -- partitions ---------------------------------------------------------------
    def partitions(self) -> list[int]:
        return list(self.store.partitions())

    def create(self, p: int) -> None:
        if p not in self.store.partitions():
            self.store.create_partition(p)
        self.indexes.rebuild(p, self.store)   # empty: makes the partition's index ready
        self._stale.discard(p)

    def drop(self, p: int) -> None:
        self.indexes.drop(p)
        self._behind.discard(p)
        self._stale.discard(p)
        if p in self.store.partitions():
            self.store.drop_partition(p)
        self.discard_partial(p)

    def discard_partial(self, p: int) -> None:
        """Delete what an unfinished file transfer of p left (temp file, resume journal)."""
        from transfer import partial_paths
        io = fileio.layer()
        gone = False
        for path in partial_paths(self.store.partition_path(p)):
            if os.path.exists(path):
                io.unlink(path)
                gone = True
        if gone:
            io.fsync_dir(self.root)

    def counter(self, p: int) -> int:
        return int(self.store.counter(p))

    # -- data ---------------------------------------------------------------------
    def get(self, p: int, key: bytes) -> bytes | None:
        return self.store.get(p, key)

    def put(self, p: int, key: bytes, value: bytes | None) -> int:
        """Primary side: next counter, logged, applied to data and indexes."""
        self._catch_up(p)
        old = self.store.get(p, key) if self.cache.indexes else None
        counter = self.store.put(p, key, value) if value is not None else self.store.remove(p, key)
        if self.cache.indexes:
            self._index(p, self.indexes.apply, p, key, old, value)
        return int(counter)

    def apply(self, p: int, key: bytes, value: bytes | None, counter: int) -> bool:
        """Backup side: idempotent by counter."""
        self._catch_up(p)
        old = self.store.get(p, key) if self.cache.indexes else None
        done = bool(self.store.apply(p, key, value, counter))
        if done and self.cache.indexes:
            self._index(p, self.indexes.apply, p, key, old, value)
        return done

    def _index(self, p: int, fn: Callable[..., object], *args: object) -> None:
        """An index change that follows a data change of p. One the system refused (a
        full disk ...) leaves p's index behind its data: noted, so p's next change
        rebuilds it first (:meth:`_catch_up`), and raised."""
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - re-raised: any failure is noted first
            if cause_of(e) is not None:
                self._behind.add(p)
                self._index_latch.fail(e)
            raise

    def index_current(self, p: int) -> bool:
        """Does p's index match p's data (not stale since the start, not behind)?"""
        return p not in self._stale and p not in self._behind

    def stale_indexes(self) -> list[int]:
        """The partitions whose index start-up did not trust and nothing rebuilt yet."""
        return sorted(self._stale)

    def index_rebuilt(self, p: int) -> None:
        """p's index was just made from p's data by someone else (a move's index stage,
        after it installed p's file): neither stale nor behind any more."""
        self._stale.discard(p)
        if p in self._behind:
            self._behind.discard(p)
            if not self._behind:
                self._index_latch.clear()

    def catch_up_index(self, p: int, cancel: Callable[[], bool] | None = None) -> bool:
        """The caller holds p's lock: rebuild p's index from its data when start-up left
        it stale. True when it rebuilt. ``cancel``: ends a rebuild early (p stays
        stale, its index not ready)."""
        if p not in self._stale:
            return False
        t0 = time.monotonic()
        try:
            r = self.indexes.rebuild(p, self.store, cancel=cancel)
        except Exception as e:  # noqa: BLE001 - re-raised: a refused one is noted first
            if cause_of(e) is not None:
                self._index_latch.fail(e)
            raise
        self._stale.discard(p)
        log.info("stage=storage cache=%s partition=%d index rebuilt from the data (not "
                 "trusted after an unclean stop): %d entries in %.2fs", self.cache.name, p,
                 r.entries, time.monotonic() - t0)
        return True

    def _catch_up(self, p: int) -> None:
        """Before a change of p (the caller holds p's lock, so nothing else changes p
        meanwhile): rebuild p's index from its data if start-up did not trust it, or if
        a refused index change left it behind. Raises (the change is refused too) while
        the cause lasts."""
        if p in self._stale:
            self.catch_up_index(p)
        if p not in self._behind:
            return
        try:
            self.indexes.rebuild(p, self.store)
        except Exception as e:  # noqa: BLE001 - re-raised: any failure is noted first
            self._index_latch.fail(e)
            raise
        self._behind.discard(p)
        log.info("stage=storage cache=%s partition=%d index rebuilt after a refused index "
                 "change", self.cache.name, p)
        if not self._behind:
            self._index_latch.clear()

    def put_many(self, p: int, items: list[tuple[bytes, bytes]]) -> list[int]:
        """Primary side, bulk (partition lock held): the next counters, the data in ONE
        node-WAL batch with ONE durability wait and the index changes in ONE commit
        (:meth:`apply_many`). Before, each item waited for its own WAL fsync: a bulk
        load ran at one group commit per entry. Acknowledged as a whole; a crash
        mid-batch leaves a prefix applied (the client puts the batch again)."""
        base = self.counter(p)
        ups = [(k, v, base + 1 + i) for i, (k, v) in enumerate(items)]
        done = self.apply_many(p, ups)
        if done != len(ups):       # the lock is held: nothing else moved the counter
            raise RuntimeError(f"cache {self.cache.name} partition {p}: {done} of {len(ups)} "
                               "batched puts applied (counter moved under the partition lock)")
        return [c for _, _, c in ups]

    def apply_many(self, p: int, updates: Sequence[tuple[bytes, bytes | None, int]], *,
                   logged: bool = True) -> int:
        """Backup side / temp-WAL replay, bulk: idempotent by counter like :meth:`apply`;
        the data in one WAL batch with ONE durability wait (``PartitionStore.apply_many``),
        the index changes in one commit. The caller holds the partition lock, so nothing
        else changes p meanwhile. Returns how many were applied. (A crash between the
        data and the index commit leaves the index behind; the unclean start-up rebuilds
        it, a move starts over.) ``logged=False``: the data is not written to the node
        WAL (``PartitionStore.apply_many``); only for the temp-WAL replay of a move."""
        self._catch_up(p)
        held = self.counter(p)
        todo = []
        for u in updates:                       # only what apply() would apply, in order
            if u[2] > held:
                todo.append(u)
                held = u[2]
        if not todo:
            return 0
        olds: list[bytes | None] = []
        if self.cache.indexes:
            pending: dict[bytes, bytes | None] = {}   # a key updated twice in one batch
            for key, value, _ in todo:
                olds.append(pending[key] if key in pending else self.store.get(p, key))
                pending[key] = value
        done = self.store.apply_many(p, todo, logged=logged)
        if self.cache.indexes:
            if all(done):
                self._index(p, self.indexes.apply_many,
                            p, [(k, o, v) for (k, v, _), o in zip(todo, olds)])
            else:   # not expected under the partition lock; the index must follow the data
                log.warning("cache=%s partition=%d: %d of %d batched updates were not applied; "
                            "rebuilding the partition's index", self.cache.name, p,
                            done.count(False), len(done))
                self.indexes.rebuild(p, self.store)
        return sum(done)

    def entries(self, p: int) -> list[Entry]:
        """Every entry of p with its update counter (tombstones included when the store
        keeps them), for the message-based rebalance."""
        # The caller holds the partition lock, so p gets no update meanwhile: once a
        # checkpoint covers p's counter, part-<p>.bin holds exactly p's entries (with
        # their counters and tombstones) and no checkpoint rewrites its pages.
        self.store.wait_checkpoint_covering(p, self.store.counter(p), timeout=120.0)
        return [(e.key, e.value, e.counter) for e in
                iter_entries(self.store.partition_path(p), include_tombstones=True)]

    def scan(self, p: int) -> Iterator[tuple[bytes, bytes]]:
        return iter(self.store.scan(p))

    # -- indexes ------------------------------------------------------------------
    def lookup(self, index: str, value: object, partitions: Iterable[int] | None = None) -> list[bytes]:
        """Keys whose document has ``value`` at ``index`` (``partitions``: only theirs).
        A value no index holds (a list, a map, NaN) is the client's error:
        :class:`BadRequest`, not an internal one with a traceback. A partition whose
        index start-up did not trust is left out until it is rebuilt (the node
        rebuilds the ones it leads before it reads: ``catch_up_index``)."""
        try:
            keys = self.indexes.lookup(index, value, self._trusted(partitions))
        except BadQueryError as e:
            raise BadRequest(f"lookup on {self.cache.name}.{index}: {e}") from None
        return [k if isinstance(k, bytes) else k[-1] for k in keys]

    def range(self, index: str, lo: object, hi: object, limit: int | None,
              partitions: Iterable[int] | None = None) -> list[tuple[object, bytes]]:
        """``[value, key]`` pairs with ``lo <= value < hi``; the scan ends after
        ``limit`` of them and reads only ``partitions`` when given. Bounds no index
        holds are :class:`BadRequest`, and so is a limit that is not a count."""
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                                  or limit < 0):
            raise BadRequest(f"range limit must be a whole number >= 0, not {limit!r}")
        try:
            return list(self.indexes.range(index, lo, hi, limit, self._trusted(partitions)))
        except BadQueryError as e:
            raise BadRequest(f"range on {self.cache.name}.{index}: {e}") from None

    def _trusted(self, partitions: Iterable[int] | None) -> Iterable[int] | None:
        if not self._stale:
            return partitions
        pick = self.indexes.ready_partitions() if partitions is None else partitions
        return [p for p in pick if p not in self._stale]

    # -- lifecycle ----------------------------------------------------------------
    def checkpoint(self) -> "CheckpointStats | None":
        return self.store.checkpoint()

    def close(self) -> None:
        if self._stale:
            # not known to match their data: not ready, so the next start rebuilds them
            try:
                self.indexes.unmark(self._stale)
            except Exception as e:  # noqa: BLE001 - still refused: say what to do
                log.error("stage=storage cache=%s: %d indexes not rebuilt since an unclean "
                          "stop could not be marked for a rebuild (%s); delete %s before the "
                          "next start (the node rebuilds the indexes from the data)",
                          self.cache.name, len(self._stale), e, self.index_root)
        for p in sorted(self._behind):
            # its index is behind its data: not ready, so the next start rebuilds it
            try:
                self.indexes.clear(p)
            except Exception as e:  # noqa: BLE001 - still refused: say what to do
                log.error("stage=storage cache=%s partition=%d: its index misses changes and "
                          "could not be marked for a rebuild (%s); delete %s before the next "
                          "start (the node rebuilds the indexes from the data)",
                          self.cache.name, p, e, self.index_root)
        self._index_latch.close()
        for part in (self.indexes, self.store):
            try:
                part.close()
            except Exception as e:  # noqa: BLE001 - closing must go on for the other one
                log.warning("closing %s of cache %s: %s", type(part).__name__, self.cache.name, e)
