"""The one LMDB environment of an :class:`IndexStore`: opening with corruption and
layout-format checks, the map that grows on demand, and its databases.

Layout (docs/indexes.md says why): ``meta`` holds the store's layout format, settings,
index ids and per-partition ready markers (indexes/meta.py); ``entries`` and ``long``
hold every index entry of every partition, keyed by partition (indexes/entrydb.py).
The number of partitions is not bounded by LMDB's named-database limit.

An environment written in an older layout (format 1: one named database
``p/<partition>`` per partition, which LMDB's ``max_dbs`` limited to 4,095
partitions) is derived data in a shape this code does not read: it is deleted at
open, its index definitions are kept, and every partition starts not ready, so the
node rebuilds each from its data. A newer format is refused.

LMDB does its own I/O through its memory map and write(2), so it is outside the
``faults.fileio`` seam. Its commit protocol is the durability boundary: the
environment is opened with sync on, so a commit that returned is on disk.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, TypeVar

import lmdb

import faults

from . import meta
from .entrydb import EntryDbs, max_entry_key
from .errors import IndexCorruptError, IndexStoreError, OutOfDiskError

T = TypeVar("T")
log = logging.getLogger("ferry.indexes")

DATA_FILE = "data.mdb"
LOCK_FILE = "lock.mdb"
# Small start (sparse file; costs nothing) and doubling growth: a full map is a resize.
INITIAL_MAP = 64 << 20
MAX_MAP = 1 << 40
# Named databases: meta, entries and long (LMDB allocates arrays of this size per
# transaction, so it stays small: partitions are keys, not databases).
MAX_DBS = 4

# Below this much free space, an EIO from a commit is taken for a full disk.
_LOW_SPACE = 16 << 20
_CORRUPT = (lmdb.CorruptedError, lmdb.InvalidError, lmdb.PageNotFoundError,
            lmdb.VersionMismatchError, lmdb.PanicError, lmdb.BadValsizeError)


class LmdbEnv:
    """Thread-safe wrapper: every transaction runs under one lock, so a resize (which
    LMDB allows only with no transaction open in the process) never races a reader."""

    def __init__(self, path: str, *, map_size: int = INITIAL_MAP, max_dbs: int = MAX_DBS,
                 reset_corrupt: bool = False) -> None:
        self.path = os.path.abspath(path)
        self.lock = threading.RLock()
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as e:
            raise faults.translate_os_error(e, self.path, None, OutOfDiskError) from e
        try:
            self.env = self._open(map_size, max_dbs)
        except IndexCorruptError:
            if not reset_corrupt:
                raise
            self._move_aside()
            self.env = self._open(map_size, max_dbs)
        self.meta = self.env.open_db(b"meta")
        kept = self._older_layout()
        if kept is not None:
            self.env = self._open(map_size, max_dbs)        # empty, this layout
            self.meta = self.env.open_db(b"meta")
            self.write(lambda txn: meta.put_settings(txn, self.meta, kept))
        self.entries = EntryDbs(self.env)
        # the longest entry key the indexer may make
        self.max_key = max_entry_key(self.env.max_key_size())

    # -- opening ------------------------------------------------------------------
    def _open(self, map_size: int, max_dbs: int) -> lmdb.Environment:
        data = os.path.join(self.path, DATA_FILE)
        size = os.path.getsize(data) if os.path.exists(data) else 0
        if 0 < size < 2 * 4096:
            raise IndexCorruptError(data, f"file is {size} bytes, shorter than LMDB's two "
                                          "meta pages (truncated)")
        try:
            env = lmdb.open(self.path, map_size=max(map_size, size), max_dbs=max_dbs,
                            subdir=True, sync=True, metasync=True, readahead=False)
        except _CORRUPT as e:
            raise IndexCorruptError(data, f"{type(e).__name__}: {e}") from None
        except lmdb.Error as e:
            raise IndexStoreError(f"cannot open index environment {self.path}: {e}") from None
        # A file cut short past its meta pages opens fine and then faults (SIGBUS) on
        # the first access to a missing page: refuse it while it is still harmless.
        need = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        if size and size < need:
            env.close()
            raise IndexCorruptError(data, f"file is {size} bytes but its last page ends at "
                                          f"{need} (truncated)")
        try:
            with env.begin(write=True) as txn:  # opens (or creates) the databases
                db = env.open_db(b"meta", txn=txn)
                if meta.is_empty(txn, db):
                    meta.put_format(txn, db)
                if meta.layout_format(txn, db) == meta.FORMAT:
                    EntryDbs(env, txn)
        except _CORRUPT as e:
            env.close()
            raise IndexCorruptError(data, f"{type(e).__name__}: {e}") from None
        return env

    def _older_layout(self) -> dict[bytes, bytes] | None:
        """None when the environment has this version's layout. When it has an older
        one: its files are deleted (the env is closed) and its settings returned, to be
        written into a new, empty environment. A newer layout is refused."""
        data = os.path.join(self.path, DATA_FILE)
        with self.env.begin() as txn:
            fmt = meta.layout_format(txn, self.meta)
            if fmt == meta.FORMAT:
                return None
            if fmt is not None and fmt > meta.FORMAT:
                self.env.close()
                raise IndexStoreError(
                    f"index environment {data} has layout format {fmt}, newer than this "
                    f"version's {meta.FORMAT}: it was written by a newer Ferry. Run that "
                    "version, or delete the directory: the index is derived data, and every "
                    "partition is rebuilt from its data")
            kept = meta.settings(txn, self.meta)
        self.env.close()
        log.warning("stage=open index environment %s has layout format %s (one LMDB database "
                    "per partition), not %d: deleted; its definitions are kept and every "
                    "partition is rebuilt from its data", data, fmt, meta.FORMAT)
        io = faults.fileio.layer()
        for name in (DATA_FILE, LOCK_FILE):
            if os.path.exists(os.path.join(self.path, name)):
                io.unlink(os.path.join(self.path, name))
        io.fsync_dir(self.path)
        return kept

    def _move_aside(self) -> None:
        """Keep the corrupt file for inspection, start empty (every partition not ready)."""
        io = faults.fileio.layer()
        data = os.path.join(self.path, DATA_FILE)
        io.replace(data, f"{data}.corrupt-{int(time.time())}")
        lockf = os.path.join(self.path, LOCK_FILE)
        if os.path.exists(lockf):
            io.unlink(lockf)
        io.fsync_dir(self.path)

    def close(self) -> None:
        with self.lock:
            self.env.close()

    # -- transactions -------------------------------------------------------------
    def write(self, fn: Callable[[lmdb.Transaction[bytes]], T]) -> T:
        """Run ``fn`` in a write transaction and commit; a full map is grown and ``fn``
        run again from the start (the aborted attempt left nothing)."""
        with self.lock:
            while True:
                try:
                    with self.env.begin(write=True) as txn:
                        return fn(txn)
                except lmdb.MapFullError:
                    self._grow()
                except lmdb.DiskError as e:
                    raise OutOfDiskError(os.path.join(self.path, DATA_FILE), None,
                                         str(e)) from None
                except _CORRUPT as e:
                    raise IndexCorruptError(os.path.join(self.path, DATA_FILE),
                                            f"{type(e).__name__}: {e}") from None
                except lmdb.Error as e:
                    if self._disk_full(e):
                        raise OutOfDiskError(os.path.join(self.path, DATA_FILE), None,
                                             str(e)) from None
                    raise

    def _disk_full(self, e: lmdb.Error) -> bool:
        """A commit on a full file system fails as a plain ``lmdb.Error``: ENOSPC from
        write(2), or EIO when LMDB's writev of the dirty pages came back short (LMDB
        turns a short write into EIO). Told apart from a real I/O error by the free
        space left where the environment lives."""
        msg = str(e)
        if "No space left" in msg:
            return True
        if "Input/output error" not in msg:
            return False
        try:
            st = os.statvfs(self.path)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize < _LOW_SPACE

    def read(self, fn: Callable[[lmdb.Transaction[bytes]], T]) -> T:
        with self.lock:
            try:
                with self.env.begin(write=False) as txn:
                    return fn(txn)
            except _CORRUPT as e:
                raise IndexCorruptError(os.path.join(self.path, DATA_FILE),
                                        f"{type(e).__name__}: {e}") from None

    def _grow(self) -> None:
        cur = self.env.info()["map_size"]
        if cur >= MAX_MAP:
            raise IndexStoreError(f"index environment {self.path} reached {cur} bytes, "
                                  "the configured maximum map size")
        self.env.set_mapsize(min(cur * 2, MAX_MAP))

    def map_size(self) -> int:
        return int(self.env.info()["map_size"])
