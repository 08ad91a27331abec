"""The one LMDB environment of an :class:`IndexStore`: opening with corruption checks,
the map that grows on demand, and the named databases.

Layout (docs/indexes.md says why): the unnamed main database holds only the names of
the named ones; ``meta`` holds the store's settings, index ids and per-partition
ready markers; ``p/<partition>`` holds every index entry of one partition, keys
prefixed by the index id. A partition's entries are thus one database: ``drop`` and
the start of a rebuild empty it in one call, and a rebuild fills an empty database in
key order, which is LMDB's append mode.

LMDB does its own I/O through its memory map and write(2), so it is outside the
``faults.fileio`` seam. Its commit protocol is the durability boundary: the
environment is opened with sync on, so a commit that returned is on disk.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Callable, TypeVar

import lmdb

import faults

from .errors import IndexCorruptError, IndexStoreError, OutOfDiskError

T = TypeVar("T")

DATA_FILE = "data.mdb"
LOCK_FILE = "lock.mdb"
# Small start (sparse file; costs nothing) and doubling growth: a full map is a resize.
INITIAL_MAP = 64 << 20
MAX_MAP = 1 << 40
# One named database per partition + meta. LMDB allocates per read transaction an
# array of this size, so it is not set far above what a node needs.
MAX_DBS = 4096

# Below this much free space, an EIO from a commit is taken for a full disk.
_LOW_SPACE = 16 << 20
_CORRUPT = (lmdb.CorruptedError, lmdb.InvalidError, lmdb.PageNotFoundError,
            lmdb.VersionMismatchError, lmdb.PanicError, lmdb.BadValsizeError)


def _partition_name(p: int) -> bytes:
    return b"p/%d" % p


class LmdbEnv:
    """Thread-safe wrapper: every transaction runs under one lock, so a resize (which
    LMDB allows only with no transaction open in the process) never races a reader."""

    def __init__(self, path: str, *, map_size: int = INITIAL_MAP, max_dbs: int = MAX_DBS,
                 reset_corrupt: bool = False) -> None:
        self.path = os.path.abspath(path)
        self.lock = threading.RLock()
        self._dbs: dict[int, object] = {}
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
        self.max_key = self.env.max_key_size()
        self.meta = self.env.open_db(b"meta")

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
            with env.begin(write=True) as txn:  # opens (or creates) meta
                env.open_db(b"meta", txn=txn)
        except _CORRUPT as e:
            env.close()
            raise IndexCorruptError(data, f"{type(e).__name__}: {e}") from None
        return env

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
            self._dbs.clear()
            self.env.close()

    # -- transactions -------------------------------------------------------------
    def write(self, fn: Callable[[lmdb.Transaction], T]) -> T:
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

    def read(self, fn: Callable[[lmdb.Transaction], T]) -> T:
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

    # -- partition databases ------------------------------------------------------
    def partition_db(self, p: int, *, create: bool) -> object | None:
        """The handle of partition p's database (created when ``create``), else None."""
        with self.lock:
            db = self._dbs.get(p)
            if db is not None:
                return db
            name = _partition_name(p)
            if create:
                db = self.write(lambda txn: self.env.open_db(name, txn=txn))
            else:
                exists = self.read(lambda txn: txn.get(name) is not None)
                if not exists:
                    return None
                db = self.write(lambda txn: self.env.open_db(name, txn=txn, create=False))
            self._dbs[p] = db
            return db

    def forget_db(self, p: int) -> None:
        self._dbs.pop(p, None)
