"""The ``ferry_live`` Spark data source: partitions of a RUNNING cluster, fetched by the
executors through Ferry's transfer agents and decoded there.

One Spark input partition is a list of cluster partitions, checked one at a time (the
number of input partitions bounds how many are checked at once). For each:

1. **fence**: ``validate_fence(cache, p, term)`` to the primary (node/livevalidate.py):
   it stops taking writes of p for at most its lease (2 s) and answers the counter C
   and the in-sync copies. A write is acknowledged only once every in-sync copy
   applied it, so every in-sync copy now holds exactly C.
2. **snapshots**: one transfer DEMAND per in-sync copy (``transfer.Demander``,
   authenticated as every connection of the task is: the cluster secret, or mutual
   TLS with the validator's certificate, the supplier's certificate checked to name
   the copy's node; zero-copy on the supplier with the secret), all at once.
   The supplier opens a copy-on-write snapshot (a forced checkpoint) before its
   MANIFEST, so a fetch that reached the ``accept`` stage holds its snapshot.
3. **unfence** as soon as every snapshot is open (milliseconds). The node answers
   whether the fence was still in force: if not, a snapshot may be past C, and the
   partition is tried again. Writes go on while the files travel: the snapshots send
   the pre-images of pages written after C.
4. **receive** every copy into the executor's scratch space (``SPARK_LOCAL_DIRS``,
   else the temp dir), **decode** it with :mod:`validation.source`'s decoder (the
   same rows as folder mode), and **delete** it.

Besides the entry and page-problem rows of folder mode, every copy yields one marker
row (key and problem NULL) carrying ``at`` (C), ``snapshot`` (the copy's snapshot
counter: C unless the copy diverged) and ``error`` (why the copy could not be
fetched, else NULL): an empty copy is still an owner, and the driver learns the
counter each partition was compared at from the same aggregation as the digests.

Importable on an executor with the shipped zip (``validation.ship``): it needs
``transfer``, ``node.wire`` and pyarrow.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any, Generator, Iterator

from pyspark.sql.datasource import DataSource

from validation.source import COLUMNS, RAW_SCHEMA, FerryReader, decode_task, problem_type

if TYPE_CHECKING:
    from node import Pool
    from node.rpcapi import Fence
    from transfer import Limits
    from transfer.tls import TlsContexts

log = logging.getLogger("ferry.validate")

SOURCE_NAME = "ferry_live"
LIVE_SCHEMA = RAW_SCHEMA + ", at long, snapshot long, error string"
# a fetch past these stages holds the supplier's snapshot (MANIFEST received)
OPEN_STAGES = frozenset({"accept", "receive", "verify", "install", "applied"})
ATTEMPTS = 5            # fences tried per partition (the primary moved, a fence expired)
RETRY_S = 30.0          # ... within this time
RPC_TIMEOUT_S = 10.0


class LiveDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return LIVE_SCHEMA

    def reader(self, schema: Any) -> "LiveReader":
        return LiveReader(json.loads(self.options.get("tasks", "[]")))


class LiveReader(FerryReader):
    """The folder reader's task list, one input partition per task; a task fetches and
    decodes live copies instead of reading files."""

    def run_task(self, task: dict) -> Iterator[Any]:
        return live_task(task)


def _local(path: str) -> str:
    """A file the driver named, on this executor: the file at the driver's path, else
    the copy the driver shipped with ``addFile`` (a cluster without shared storage)."""
    if not os.path.exists(path):
        from pyspark import SparkFiles
        shipped = SparkFiles.get(os.path.basename(path))
        if os.path.exists(shipped):
            path = _owner_only(shipped)
    return path


def _secret(path: str) -> bytes:
    """The cluster secret on this executor."""
    from node import load_secret
    return load_secret(_local(path))


def _tls(files: dict) -> "TlsContexts":
    """The validator's TLS contexts on this executor (the CA, certificate and key the
    driver checked)."""
    from transfer.tls import TlsContexts, TlsFiles
    return TlsContexts(TlsFiles(_local(files["ca"]), _local(files["cert"]), _local(files["key"])))


# Spark's fetch of an ``addFile`` file makes it executable for everyone ("a+x": the
# driver's 0600 arrives as 0711), and the secret check refuses any group/other bit.
# Execute permission lets nobody read the file, so on this executor's own copy those
# bits are dropped; a copy that others could read or write is left alone (and
# refused by the check, which names its mode).
_SHARED = stat.S_IRGRP | stat.S_IWGRP | stat.S_IROTH | stat.S_IWOTH


def _owner_only(path: str) -> str:
    st = os.stat(path)
    if stat.S_ISREG(st.st_mode) and not st.st_mode & _SHARED and st.st_uid == os.geteuid():
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            os.chmod(path, mode & 0o700)
    return path


def scratch_root() -> str:
    dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
    return dirs.split(",")[0] if dirs else tempfile.gettempdir()


def live_task(task: dict) -> Iterator[Any]:
    """Arrow batches (``LIVE_SCHEMA``) of every partition in ``task["parts"]``."""
    from node import Pool
    from transfer import Limits

    members: dict[str, str] = dict(task.get("members") or {})
    if task.get("tls"):
        # mutual TLS: a node's certificate must name the member the map says is there
        pool = Pool(b"", role="node", timeout=RPC_TIMEOUT_S, tls=_tls(task["tls"]), expect=members.get)
    else:
        pool = Pool(_secret(task["secret_file"]), role="node", timeout=RPC_TIMEOUT_S)
    # this task's share of the validation's byte rate (the driver divides it)
    limits = Limits(max_transfers=64, rate=task.get("rate") or None)
    try:
        for part in task["parts"]:
            yield from _PartitionCheck(pool, limits, task["seeds"], part, members).run()
    finally:
        pool.close()


class _PartitionCheck:
    """The fence -> snapshots -> unfence -> receive -> decode of one partition."""

    def __init__(self, pool: "Pool", limits: "Limits", seeds: list[str], part: dict,
                 members: dict[str, str] | None = None) -> None:
        self.pool, self.limits, self.seeds = pool, limits, seeds
        self.members = members if members is not None else {}
        self.cache, self.p = part["cache"], int(part["partition"])
        self.primary, self.address, self.term = part["primary"], part["address"], int(part["term"])

    def _reread_map(self) -> None:
        """After the primary refused: who leads p now (any node's map)."""
        from node.rpcapi import fetch_map
        for seed in self.seeds:
            try:
                m = fetch_map(self.pool, seed)
            except Exception as e:  # noqa: BLE001 - that seed is down: ask the next
                log.info("map from %s not read: %r", seed, e)
                continue
            self.members.update({a.address: n for n, a in m.members.items() if a.address})
            rec = m.parts[self.cache][self.p]
            self.primary, self.term = rec.primary, rec.term
            self.address = m.address(rec.primary) or self.address
            return

    def run(self) -> Iterator[Any]:
        from node import NodeError
        from node.rpcapi import ValidateFence
        deadline = time.monotonic() + RETRY_S
        why = "not tried"
        for attempt in range(ATTEMPTS):
            try:
                fence = self.pool.request(self.address, ValidateFence(self.cache, self.p, self.term),
                                          timeout=RPC_TIMEOUT_S)
            except NodeError as e:
                why = f"primary {self.primary} ({self.address}) refused the fence: {e}"
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2 * (attempt + 1))
                self._reread_map()
                continue
            done = yield from self._snapshot(fence, last=attempt == ATTEMPTS - 1)
            if done:
                return
            why = f"the fence of {self.primary} expired before every snapshot was open"
        yield _marker(self.primary or "", self.cache, self.p, None, None,
                      f"not validated after {ATTEMPTS} attempts: {why}")

    def _snapshot(self, fence: "Fence", *, last: bool) -> Generator[Any, None, bool]:
        """One attempt at counter C; False (nothing yielded) when it must be retried."""
        from node.rpcapi import ValidateUnfence
        C = fence.counter
        isr: list[str] = list(fence.isr)
        scratch = tempfile.mkdtemp(prefix=f"ferry-live-{self.cache}-{self.p}-", dir=scratch_root())
        fetches = [_CopyFetch(n, fence.transfer.get(n, ""), self.cache, self.p,
                              os.path.join(scratch, n), self.pool.secret, self.limits, self.pool.tls)
                   for n in isr]
        try:
            for f in fetches:
                f.start()
            end = time.monotonic() + fence.lease_s
            for f in fetches:
                f.opened.wait(max(0.0, end - time.monotonic()))
            # every snapshot opened before the unfence: all at C if the fence still held
            all_open = all(f.was_open_in_time for f in fetches)
            held = False
            try:
                held = self.pool.request(self.address, ValidateUnfence(self.cache, self.p, fence.token),
                                         timeout=RPC_TIMEOUT_S)
            except Exception as e:  # noqa: BLE001 - the fence expires by itself; retry below
                log.info("unfence of %s/%d at %s failed: %r", self.cache, self.p, self.address, e)
                held = False
            for f in fetches:
                f.join()
            if not (held and all_open) and not last:
                return False
            for f in fetches:
                if f.error is not None:
                    yield _marker(f.node, self.cache, self.p, C, None, f.error)
                    continue
                assert f.path is not None
                yield from _with_live(decode_task({"node": f.node, "cache": self.cache,
                                                   "partition": self.p, "path": f.path}),
                                      C, f.counter)
                yield _marker(f.node, self.cache, self.p, C, f.counter, None)
                os.unlink(f.path)          # decoded: do not hold the disk longer
            return True
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


class _CopyFetch(threading.Thread):
    """Fetch one in-sync copy of p into ``root`` (a DirectoryStorage); with ``tls`` the
    supplier's certificate must name ``node``."""

    def __init__(self, node: str, address: str, cache: str, p: int, root: str, secret: bytes,
                 limits: Any, tls: "TlsContexts | None" = None) -> None:
        super().__init__(name=f"live-fetch-{node}", daemon=True)
        self.node, self.address, self.cache, self.p = node, address, cache, p
        self.root, self.secret, self.limits, self.tls = root, secret, limits, tls
        self.opened = threading.Event()
        self.was_open_in_time = False
        self.error: str | None = None
        self.path: str | None = None
        self.counter: int | None = None

    def run(self) -> None:
        from transfer import Demander, DirectoryStorage, Priority, TransferError

        def progress(pr: Any) -> None:
            if pr.stage in OPEN_STAGES and not self.opened.is_set():
                self.opened.set()
                self.was_open_in_time = True
        try:
            if not self.address:
                raise TransferError(f"{self.node} advertises no file supplier")
            os.makedirs(self.root, exist_ok=True)
            storage = DirectoryStorage(self.root)
            res = Demander(storage, self.address, self.secret, limits=self.limits, timeout=30.0,
                           margin=16 << 20, tls=self.tls,
                           tls_peer=self.node if self.tls is not None else None).fetch(self.p, cache=self.cache, progress=progress,
                                                  priority=Priority.BACKGROUND)
            self.counter = int(res.counter)
            self.path = storage.target_path(self.cache, self.p)
        except (TransferError, OSError) as e:
            self.error = f"fetch from {self.node} ({self.address}) failed: {e}"
        finally:
            self.opened.set()


def _with_live(batches: Iterator[Any], at: int, snapshot: int | None) -> Iterator[Any]:
    import pyarrow as pa
    for b in batches:
        n = b.num_rows
        yield pa.RecordBatch.from_arrays(
            list(b.columns) + [pa.array([at] * n, pa.int64()), pa.array([snapshot] * n, pa.int64()),
                               pa.array([None] * n, pa.string())],
            names=list(b.schema.names) + ["at", "snapshot", "error"])


def _marker(node: str, cache: str, p: int, at: int | None, snapshot: int | None,
            error: str | None) -> Any:
    """The one row per copy that says the copy exists (or why it could not be read)."""
    import pyarrow as pa
    nulls = [pa.array([None], t) for t in (pa.binary(), pa.binary(), pa.int64(), pa.bool_())]
    return pa.RecordBatch.from_arrays(
        [pa.array([node], pa.string()), pa.array([cache], pa.string()), pa.array([p], pa.int32()),
         *nulls, pa.array([None], problem_type(pa)),
         pa.array([at], pa.int64()), pa.array([snapshot], pa.int64()), pa.array([error], pa.string())],
        names=COLUMNS + ["at", "snapshot", "error"])
