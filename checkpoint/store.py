"""PartitionStore: the partitions of one node, their page memory, the node WAL and the
checkpointer.

Directory layout: ``part-<p>.bin`` per partition, ``wal/`` (node WAL, which also holds
the undo images of pages changed since the last checkpoint cut: ``undo.py``), and
``part-<p>.bin.delta`` while a transfer snapshot is open.  (``checkpoint.dwb`` was the
double-write file of stores of the first on-disk version; recovery still applies one
left by a crash of that version.)

Update path: under the store lock an update gets the partition's next counter, is
appended to the WAL (written to the OS, in lsn order) and applied to page memory;
the undo images of pages it changes for the first time since the last cut follow it
in the WAL before the lock is released (``undo.py``); outside the lock the caller
waits until its record is durable (group commit).  Writers
wait before changing anything while dirty + in-checkpoint pages exceed
``WAIT_FRACTION`` of the page-memory budget; a checkpoint starts at
``CHECKPOINT_FRACTION``.

Open files: partition files are opened on demand and at most ``open_files``
descriptors of them are open at once, least recently used closed first, never one in
use or written since its last fsync (``files.py``).
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, overload

from typing import TYPE_CHECKING

from faults import fileio
from faults.latch import RESTART, Latch, advice, describe

from . import checkpointer, dwb, recovery
from .check import check_page
from .errors import CheckpointError, SnapshotBusyError, StoreClosedError
from .files import FileCache, PageFile
from .layout import MAX_VALUE, part_name, valid_page_size
from .memory import PageMemory
from .page import max_key
from .partition import Partition
from .reader import read_meta
from .release import Releaser
from .records import RecordType, encode_drop, encode_install, encode_update
from .snapshot import TransferSnapshot
from .state import StoreState
from .undo import ImageLog

if TYPE_CHECKING:
    from wal import Wal

CHECKPOINT_FRACTION = 0.25
WAIT_FRACTION = 0.75


class PartitionStore:
    # Set by open(), the only constructor (see there for what each one is).
    dir: str
    page_size: int
    dwb_path: str
    mem: PageMemory
    undo: ImageLog
    state: StoreState
    files: FileCache
    parts: dict[int, Partition]
    _cond: threading.Condition
    _ckpt_lock: threading.RLock
    _snapshots: dict[int, TransferSnapshot]
    _callbacks: list[Callable[[dict[int, int]], None]]
    _checkpoint_id: int
    _closed: bool
    _failure: BaseException | None
    _latch: Latch
    _wal_sync: str
    max_key: int
    last_stats: checkpointer.CheckpointStats | None
    replayed: int
    rolled_back: int
    _wake: threading.Event
    _interval: float | None
    _retime: bool
    _thread: threading.Thread
    _release: Releaser

    def __init__(self) -> None:   # use PartitionStore.open
        raise TypeError("use PartitionStore.open(path, ...)")

    @classmethod
    def open(cls, path: str, *, page_size: int = 4096, memory_budget: int = 64 << 20,
             wal_sync: str = "group", checkpoint_interval: float | None = 60.0,
             wal_segment_size: int = 64 << 20, open_files: int | None = None) -> PartitionStore:
        """Open (recovering) the store in ``path``. ``open_files``: at most this many
        descriptors of partition files open at once (None: 1,024 or a quarter of the
        soft RLIMIT_NOFILE, whichever is smaller; at least 4)."""
        if not valid_page_size(page_size):
            raise CheckpointError(f"page size {page_size} is not a power of two in 1 KiB..64 KiB")
        files = FileCache(open_files)
        self = object.__new__(cls)
        self.dir = os.path.abspath(path)
        os.makedirs(self.dir, exist_ok=True)
        self.page_size = page_size
        self.dwb_path = os.path.join(self.dir, dwb.NAME)
        self.mem = PageMemory(page_size, memory_budget)
        snapshots: dict[int, TransferSnapshot] = {}
        self.undo = ImageLog(self.mem, page_size, snapshots)
        # What the checkpointer and recovery share with the store (state.py); the
        # names below are the same objects, for the store's own code.
        self.state = state = StoreState(self.dir, page_size, self.mem, self.undo,
                                        files=files, snapshots=snapshots)
        self.files = files
        self.parts = state.parts
        self._cond = state.cond                  # the store lock
        self._ckpt_lock = state.ckpt_lock        # one checkpoint / install / drop at a time
        self._snapshots = snapshots
        # closes the last descriptor of a replaced or dropped file, whose blocks are
        # freed in that close, off the checkpoint lock (release.py)
        self._release = Releaser(f"ferry-release-{os.path.basename(self.dir)}")
        self._callbacks = []
        self._checkpoint_id = 0
        self._closed = False
        # The background checkpointer's failure, re-raised to writers while it lasts:
        # a full disk, a read-only file system or no descriptors left is retried (with
        # back-off, once the cause may be gone) and cleared by a checkpoint that
        # succeeds; any other failure stays until the store is reopened.
        self._failure = None
        self._latch = Latch("checkpointer", self.dir)
        self._wal_sync = wal_sync
        self.max_key = max_key(page_size)
        self.last_stats = None
        opened = recovery.recover(state, wal_sync, wal_segment_size, self._checkpoint_locked)
        self.replayed = opened.replayed
        self.rolled_back = opened.rolled_back      # pages restored from undo images at open
        self._wake = threading.Event()
        self._interval = checkpoint_interval
        self._retime = False
        self._thread = threading.Thread(target=self._background, name="ferry-checkpointer",
                                        daemon=True)
        self._thread.start()
        return self

    # -- updates -----------------------------------------------------------------
    def put(self, partition: int, key: bytes, value: bytes) -> int:
        if not isinstance(value, (bytes, bytearray)):
            raise TypeError("value must be bytes")
        return self._update(partition, key, bytes(value), None)

    def remove(self, partition: int, key: bytes) -> int:
        return self._update(partition, key, None, None)

    def apply(self, partition: int, key: bytes, value: bytes | None, counter: int) -> bool:
        """Apply an update that carries its counter (replication, temp-WAL replay);
        ignored (False) when ``counter`` is at or below the partition's counter."""
        return self._update(partition, key, value, counter) is not None

    def apply_many(self, partition: int,
                   updates: Iterable[tuple[bytes, bytes | None, int]], *,
                   logged: bool = True) -> list[bool]:
        """Batch form of :meth:`apply`: ``updates`` are ``(key, value or None for a
        remove, counter)``.  Returns one bool per item, what :meth:`apply` would have
        returned (False: its counter was at or below the partition's, ignored).

        Every item is checked before anything changes (bad input loses nothing).  The
        applied ones go to the node WAL with one ``append_many`` per chunk and the call
        waits for durability ONCE at the end (temp-WAL replay is not bounded by an
        fsync per update).  Chunks are sized so page memory stays within its budget;
        between chunks writers' admission (and a checkpoint) may run, so a crash or
        an error mid-batch leaves a prefix applied - harmless, items are idempotent.

        ``logged=False``: the updates go to page memory only, not to the WAL (undo
        images still do), and nothing waits for the disk: they become durable with the
        next checkpoint that covers them, and a crash before it loses them. Only for a
        caller that rebuilds the partition another way after a crash and waits for
        :meth:`wait_checkpoint_covering` before relying on them: the temp-WAL replay of
        a moving partition (a crash restarts the move with a fresh install, and OWNING
        waits for such a checkpoint), which would otherwise log every value a second
        time."""
        items = list(updates)
        max_key = self.max_key
        for key, value, counter in items:
            # exact types first (the replay's items): one test each instead of isinstance
            if not (type(key) is bytes and (value is None or type(value) is bytes)
                    and type(counter) is int):
                if not isinstance(key, bytes) or not (value is None or isinstance(value, bytes)) \
                        or not isinstance(counter, int):
                    raise TypeError(f"apply_many wants (bytes key, bytes or None value, int "
                                    f"counter), got ({type(key).__name__}, "
                                    f"{type(value).__name__}, {type(counter).__name__})")
            if len(key) > max_key or (value is not None and len(value) > MAX_VALUE):
                self._check_sizes(key, value)       # raises, naming the limit
        result: list[bool] = []
        last_lsn = 0
        at = 0
        while at < len(items):
            end = self._chunk_end(items, at)
            with self._cond:
                self._admit()
                part = self._part(partition, create=True)
                held = part.counter
                take, payloads = [], []
                for key, value, counter in items[at:end]:
                    ok = counter > held
                    result.append(ok)
                    if ok:
                        held = counter
                        take.append((key, value, counter))
                        if logged:
                            payloads.append(encode_update(partition, counter, key, value))
                if take:
                    if payloads:
                        last_lsn = self.wal.append_many(payloads, RecordType.UPDATE, wait=False)
                    undo, write = self.undo, part.write
                    limit = self.mem.io_bytes        # undo.full, without a property call
                    try:
                        for key, value, counter in take:
                            write(key, value, counter)
                            if undo.pending_bytes >= limit:
                                undo.flush()
                    finally:
                        undo.flush()
                    if self.mem.pressure >= self.mem.capacity * CHECKPOINT_FRACTION:
                        self._wake.set()
            at = end
        if last_lsn and self._wal_sync != "none":
            self.wal.wait_durable(last_lsn)
        return result

    def _chunk_end(self, items: list[tuple[bytes, bytes | None, int]], start: int) -> int:
        """End of the chunk from ``start``: about an eighth of page memory in pages an
        update may dirty (its old page, the page it lands in, overflow pages), so one
        chunk never pushes dirty pages far past the writers' wait limit."""
        room = max(4, self.mem.capacity // 8)
        ps = self.page_size
        end = start
        while end < len(items):
            value = items[end][1]
            room -= 2 + (0 if value is None else len(value) // ps)
            if room < 0 and end > start:
                break
            end += 1
        return end

    def _check_sizes(self, key: bytes, value: bytes | None) -> None:
        if len(key) > self.max_key:
            raise CheckpointError(f"key of {len(key)} bytes exceeds the limit of {self.max_key} "
                                  f"for {self.page_size}-byte pages")
        if value is not None and len(value) > MAX_VALUE:
            raise CheckpointError(f"value of {len(value)} bytes exceeds the limit of {MAX_VALUE}")

    @overload
    def _update(self, pid: int, key: bytes, value: bytes | None, counter: None) -> int: ...
    @overload
    def _update(self, pid: int, key: bytes, value: bytes | None, counter: int) -> int | None: ...

    def _update(self, pid: int, key: bytes, value: bytes | None, counter: int | None) -> int | None:
        """Apply one update; its counter (the next one when ``counter`` is None), or
        None when ``counter`` is given and at or below the partition's counter."""
        self._check_sizes(key, value)
        with self._cond:
            self._admit()
            part = self._part(pid, create=True)
            if counter is None:
                counter = part.counter + 1
            elif counter <= part.counter:
                return None
            lsn = self.wal.append(encode_update(pid, counter, key, value), RecordType.UPDATE,
                                  wait=False)
            try:
                part.write(key, value, counter)
            finally:
                self.undo.flush()
            if self.mem.pressure >= self.mem.capacity * CHECKPOINT_FRACTION:
                self._wake.set()
        if self._wal_sync != "none":
            self.wal.wait_durable(lsn)
        return counter

    def _admit(self) -> None:
        """Wait (store lock held, released while waiting) until page memory has room."""
        self._check_open()
        limit = self.mem.capacity * WAIT_FRACTION
        while self.mem.pressure >= limit:
            self._wake.set()
            self._cond.wait(0.5)
            self._check_open()

    # -- reads -------------------------------------------------------------------
    def get(self, partition: int, key: bytes) -> bytes | None:
        with self._cond:
            self._check_readable()
            part = self.parts.get(partition)
            return None if part is None else part.get(key)

    def scan(self, partition: int) -> Iterator[tuple[bytes, bytes]]:
        """Live entries in page order.  Each batch of pages is read under the lock;
        updates made during a scan may or may not be seen.  A batch is
        ``mem.io_bytes`` of pages (1 MiB, less for a budget under 32 MiB): it and its
        decoded entries are the scan's only memory beside page memory."""
        index, batch = 1, max(1, self.mem.io_bytes // self.page_size)
        while True:
            with self._cond:
                self._check_readable()
                part = self.parts.get(partition)
                if part is None or index >= part.page_count:
                    return
                entries = part.scan_range(index, min(batch, part.page_count - index))
            index += batch
            yield from entries

    def counter(self, partition: int) -> int:
        with self._cond:
            return self._part(partition).counter

    def live_keys(self, partition: int) -> int | None:
        """Live keys of the partition (its key index), or None when this store does not
        hold it."""
        with self._cond:
            part = self.parts.get(partition)
            return None if part is None else len(part.index)

    def last_checkpoint_counter(self, partition: int) -> int:
        with self._cond:
            return self._part(partition).ckpt_counter

    def partitions(self) -> list[int]:
        with self._cond:
            return sorted(self.parts)

    def partition_path(self, partition: int) -> str:
        return self.state.partition_path(partition)

    @property
    def wal(self) -> Wal:
        """The node WAL."""
        return self.state.wal

    def stats(self) -> dict[str, int]:
        with self._cond:
            out = self.mem.stats()
            out["index_entries"] = sum(len(p.index) for p in self.parts.values())
        out.update(self.files.stats())
        return out

    # -- checkpoints -------------------------------------------------------------
    def checkpoint(self) -> checkpointer.CheckpointStats | None:
        """Write a checkpoint now (None when nothing changed since the last one)."""
        self._check_open()
        with self._ckpt_lock:
            return self._checkpoint_locked()

    def _checkpoint_locked(self) -> checkpointer.CheckpointStats | None:
        self._checkpoint_id += 1
        stats = checkpointer.run(self.state, self._checkpoint_id)
        if stats is not None:
            self.last_stats = stats
            for cb in list(self._callbacks):
                cb(dict(stats.counters))
        return stats

    def _checkpoint_unless_covered(self, partition: int, counter: int) -> None:
        """A checkpoint for a caller that needs ``partition`` at ``counter``, unless one
        that completed while it waited for the checkpoint lock already holds it: moves
        that end together (a wave of a join) then share one checkpoint instead of each
        writing every dirty page of the store again, back to back."""
        self._check_open()
        with self._ckpt_lock:
            with self._cond:
                if self._part(partition).ckpt_counter >= counter:
                    return
            self._checkpoint_locked()

    def on_checkpoint(self, callback: Callable[[dict[int, int]], None]) -> None:
        """Call ``callback({partition: counter})`` after every completed checkpoint."""
        self._callbacks.append(callback)

    def wait_checkpoint_covering(self, partition: int, counter: int,
                                 timeout: float | None = None) -> bool:
        """Return once a completed checkpoint holds ``partition`` at >= ``counter``,
        durably (checkpointing now when the update is already applied); False on
        timeout."""
        import time
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cond:
                part = self._part(partition)
                if part.ckpt_counter >= counter:
                    marker = self.wal.last_lsn
                    break
                applied = part.counter >= counter
                if not applied:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._cond.wait(0.1 if left is None else min(left, 0.1))
                    continue
            self._checkpoint_unless_covered(partition, counter)
        # The checkpoint's MARKER is appended without a wait (checkpointer stage 6);
        # until it is durable a crash rolls the files back to the previous checkpoint,
        # which loses updates applied with logged=False (they are in no WAL record).
        self.wal.wait_durable(marker)
        return True

    @contextmanager
    def checkpoints_paused(self) -> Iterator[None]:
        """Hold off every checkpoint for the block (tests take reference images here)."""
        with self._ckpt_lock:
            yield

    @property
    def checkpoint_interval(self) -> float | None:
        """Seconds between periodic checkpoints (None: only on pressure / on demand)."""
        return self._interval

    def set_checkpoint_interval(self, seconds: float | None) -> None:
        """Change the periodic checkpoint interval live; the next periodic checkpoint
        is due ``seconds`` after the last one (at once if that is past).  Changing it
        does not by itself force a checkpoint."""
        if seconds is not None and not seconds > 0:
            raise ValueError(f"checkpoint interval must be > 0 seconds or None, not {seconds!r}")
        self._interval = seconds
        self._retime = True
        self._wake.set()

    def _background(self) -> None:
        import time
        last = time.monotonic()
        while not self._closed:
            if self._failure is not None:
                if not self._wait_out_failure():
                    return
                last = time.monotonic()
                continue
            interval = self._interval
            timeout = None if interval is None else max(0.0, last + interval - time.monotonic())
            self._wake.wait(timeout)
            self._wake.clear()
            if self._closed:
                return
            if self._retime:
                # Woken to re-read the interval: checkpoint only if one is due anyway
                # (interval elapsed or dirty pages over the threshold).
                self._retime = False
                interval = self._interval
                due = interval is not None and time.monotonic() - last >= interval
                with self._cond:
                    pressed = self.mem.pressure >= self.mem.capacity * CHECKPOINT_FRACTION
                if not due and not pressed:
                    continue
            last = time.monotonic()
            try:
                self.checkpoint()
            except BaseException as e:  # latched, re-raised to the next writer
                if not self._latch_failure(e):
                    return

    def _latch_failure(self, e: BaseException) -> bool:
        """Refuse writes with ``e`` from now on; True when it is waited out and retried
        (a full disk, a read-only file system, no descriptors left), False when it
        stays (anything else, or a WAL that failed an fsync: only a restart helps)."""
        wal = self.undo.wal
        retry = self._latch.fail(e, retry=wal is None or wal.failure is None)
        with self._cond:
            self._failure = e
            self._cond.notify_all()
        return retry

    def _wait_out_failure(self) -> bool:
        """One step of waiting out a latched failure: sleep the back-off, and when the
        cause may be gone, checkpoint. False when the store closed or the failure
        turned out to stay."""
        self._wake.wait(self._latch.delay())
        self._wake.clear()
        if self._closed:
            return False
        if not self._latch.may_retry():
            self._latch.backoff()
            return True
        try:
            with self._ckpt_lock:
                if self._closed:
                    return False
                self._checkpoint_locked()
        except BaseException as e:
            return self._latch_failure(e)
        with self._cond:
            self._failure = None
            self._cond.notify_all()
        self._latch.clear()
        return True

    # -- partitions --------------------------------------------------------------
    def create_partition(self, partition: int) -> None:
        with self._cond:
            self._part(partition, create=True)

    def _part(self, pid: int, create: bool = False) -> Partition:
        part = self.parts.get(pid)             # the common case without a second call
        return part if part is not None else self.state.part(pid, create)

    def prepare_install(self, partition: int, src_path: str) -> Partition:
        """Check a received file for install, without any store lock: its meta page
        names this partition and page size, and one sequential pass checks every page
        (CRC and structure) while it builds the key index and space maps that the
        installed partition will use. A bad page raises CorruptPageError (page, reason)
        and nothing changes. Pass the result to :meth:`install_partition`, or
        ``close()`` it to give up."""
        meta = read_meta(src_path)
        if meta.partition != partition or meta.page_size != self.page_size:
            raise CheckpointError(f"{src_path}: partition {meta.partition} / page size "
                                  f"{meta.page_size} cannot be installed as partition "
                                  f"{partition} of a store with {self.page_size}-byte pages")
        return Partition(partition, src_path, self.mem, self.undo, self.files)

    def install_partition(self, partition: int, src_path: str,
                          prepared: Partition | None = None) -> None:
        """Atomically replace ``partition`` by a verified received file: fsync it,
        WAL INSTALL record (earlier records of the partition are never replayed),
        os.replace, fsync the directory, then forget the old page memory.

        The page check and key scan (:meth:`prepare_install`, done here unless
        ``prepared`` is given) run before the store lock is taken: writers of other
        partitions and the checkpointer do not wait for a scan of the whole file."""
        part = prepared if prepared is not None else self.prepare_install(partition, src_path)
        if part.pid != partition or part.path != src_path:
            part.close()
            raise CheckpointError(f"prepared install of {part.path} (partition {part.pid}) "
                                  f"used for {src_path} (partition {partition})")
        old: int | None = None
        try:
            io = fileio.layer()
            fd = io.open(src_path, os.O_RDONLY)
            try:
                io.fsync(fd)
            finally:
                io.close(fd)
            with self._ckpt_lock, self._cond:
                self._check_open()
                if partition in self._snapshots:
                    raise SnapshotBusyError(f"partition {partition} has an open transfer snapshot")
                lsn = self.wal.append(encode_install(partition, part.counter), RecordType.INSTALL)
                self.wal.wait_durable(lsn)
                self._forget(partition)
                dst = self.partition_path(partition)
                # the replaced file's blocks are freed after the lock and the directory's
                # fsync, on the releaser's thread (release.py)
                old = self._release.hold(dst)
                io.replace(src_path, dst)
                part.path = dst           # the same inode: later opens use dst
                io.fsync_dir(self.dir)
                self.parts[partition] = part
                self._cond.notify_all()
        except BaseException:
            if self.parts.get(partition) is not part:
                part.close()
            raise
        finally:
            self._release.release(old)

    def file_checked(self, partition: int) -> bool:
        """Whether every page of ``partition``'s file passed check_page (CRC and
        structure) in the scan that opened or installed it, and nothing was written
        to the file since (no checkpoint of the partition): then a reader of the whole
        file, such as the index rebuild right after an install, may skip the CRCs
        (``checkpoint.pagefile.iter_live_columns(..., verified=True)``); it still
        checks each page's structure before cutting it."""
        part = self.parts.get(partition)
        return part is not None and part.checked_whole

    def drop_partition(self, partition: int) -> None:
        """Delete the partition's file and memory, durably (WAL DROP record first)."""
        with self._ckpt_lock, self._cond:
            self._check_open()
            if partition in self._snapshots:
                raise SnapshotBusyError(f"partition {partition} has an open transfer snapshot")
            lsn = self.wal.append(encode_drop(partition), RecordType.DROP)
            self.wal.wait_durable(lsn)
            self._forget(partition)
            path = self.partition_path(partition)
            old = self._release.hold(path)
            try:
                recovery.delete_partition_file(path)
            finally:
                # its blocks are freed after the lock and the directory's fsync, on the
                # releaser's thread (release.py)
                self._release.release(old)

    def give_up_file(self, partition: int, to_path: str) -> bool:
        """Forget ``partition`` and hand its file over, renamed to ``to_path`` (a name
        beside it, ``part-<p>.bin.<suffix>``): the base of a delta fetch that replaces
        the partition, written in place by the fetch instead of copied. False, and
        nothing changed, when the store holds no file of it.

        Crash-safe as :meth:`drop_partition`: the WAL DROP record is durable before the
        rename, so a restart replays none of the partition's earlier records (and
        deletes its file if the rename had not happened). Whatever of it was in page
        memory and not checkpointed is dropped with it: the caller replaces the
        partition by a fetched copy, for which any set of pages is a base (a delta
        fetch compares pages by content)."""
        dst = os.path.abspath(to_path)
        mine = part_name(partition) + "."
        if os.path.dirname(dst) != self.dir or not os.path.basename(dst).startswith(mine):
            raise CheckpointError(f"{to_path} is not a name beside partition {partition}'s file "
                                  f"in {self.dir} ({mine}<suffix>)")
        io = fileio.layer()
        old: int | None = None
        try:
            # the checkpoint lock throughout (no checkpoint writes the file meanwhile);
            # the DROP's durability is waited for without the store lock, which every
            # writer takes
            with self._ckpt_lock:
                with self._cond:
                    self._check_open()
                    if partition in self._snapshots:
                        raise SnapshotBusyError(f"partition {partition} has an open transfer "
                                                "snapshot")
                    src = self.partition_path(partition)
                    if partition not in self.parts or not os.path.isfile(src):
                        return False
                    lsn = self.wal.append(encode_drop(partition), RecordType.DROP)
                    self._forget(partition)
                self.wal.wait_durable(lsn)      # before the rename: see the docstring
                with self._cond:
                    if partition in self.parts:
                        return False            # made again meanwhile: it stays
                    # a file left at that name (an earlier fetch's) is freed off this lock
                    old = self._release.hold(dst)
                    io.replace(src, dst)
                    io.fsync_dir(self.dir)
            return True
        finally:
            self._release.release(old)

    def _forget(self, partition: int) -> None:
        part = self.parts.pop(partition, None)
        if part is not None:
            part.close()
        self.mem.forget_partition(partition)
        self.undo.discard(partition)

    # -- transfer snapshots ------------------------------------------------------
    def open_transfer_snapshot(self, partition: int) -> TransferSnapshot:
        """Fix a copy-on-write snapshot of the partition at its counter C, flushing its
        pages first (``checkpointer.run(..., only=partition)``: not the other
        partitions', no marker; nothing when its file already holds it at its
        counter). The partition's file stays open
        (pinned) until the snapshot closes: ``snap.fileno()`` is its descriptor, for the
        sender."""
        with self._ckpt_lock:
            self._check_open()
            if partition in self._snapshots:
                raise SnapshotBusyError(f"partition {partition} already has an open transfer "
                                        "snapshot; close it first")
            # its own pages only: a checkpoint of the whole store would write every
            # other partition's dirty pages too
            checkpointer.run(self.state, self._checkpoint_id, only=partition)
            snap: TransferSnapshot | None = None
            try:
                with self._cond:
                    part = self._part(partition)
                    file = part.file
                    fd = self.files.pin(file)
                    try:
                        snap = TransferSnapshot(partition, part.path, self.page_size,
                                                part.file_pages, part.file_counter,
                                                lambda s: self._snapshot_closed(s, file), fd=fd)
                    except BaseException:
                        self.files.unpin(file)
                        raise
                    self._snapshots[partition] = snap
                    self._save_changed_pages(part, snap)
            except BaseException:
                if snap is not None:
                    snap.close()          # unregistered, the file unpinned
                raise
            return snap

    def _save_changed_pages(self, part: Partition, snap: TransferSnapshot) -> None:
        """Pages changed since the snapshot's checkpoint cut, before the snapshot was
        registered, logged their undo image without it; the file (that checkpoint,
        complete) still holds them as of C: save them now.  Later first changes save
        their page as they log its image (undo.py).  Store lock held."""
        lo = part.pid << 32
        ps = self.page_size
        indexes = sorted(k - lo for k in self.mem.dirty if lo <= k < lo + snap.page_count)
        for index in indexes:
            self.undo.preimages += snap.save_preimages([(index, part.pread(ps, index * ps))])

    def _snapshot_closed(self, snap: TransferSnapshot, file: PageFile) -> None:
        with self._cond:
            if self._snapshots.get(snap.partition) is snap:
                del self._snapshots[snap.partition]
        self.files.unpin(file)

    def check_page(self, buf: bytes, index: int) -> str | None:
        return check_page(buf, index, self.page_size)

    # -- lifecycle ---------------------------------------------------------------
    def _check_open(self) -> None:
        """Before a change: the store is open and its checkpointer is not failed."""
        failure = self._failure
        if failure is not None:
            latch = self._latch
            if latch.cause is None:
                raise CheckpointError(f"store {self.dir}: the background checkpointer failed: "
                                      f"{failure}; {RESTART}") from failure
            what = describe(latch.cause, latch.where, latch.needed)
            if latch.permanent:
                raise CheckpointError(f"store {self.dir} refuses writes: its last checkpoint "
                                      f"failed ({what}) and is not retried: {failure}; "
                                      f"{RESTART}") from failure
            raise CheckpointError(f"store {self.dir} refuses writes: its last checkpoint failed: "
                                  f"{what}; {advice(latch.cause)}") from failure
        if self._closed:
            raise StoreClosedError(f"store {self.dir} is closed")

    def _check_readable(self) -> None:
        """Before a read: page memory stays right while the checkpointer is failed."""
        if self._closed:
            raise StoreClosedError(f"store {self.dir} is closed")

    @property
    def failure(self) -> BaseException | None:
        """The background checkpointer's failure while writes are refused, else None."""
        return self._failure

    def close(self, *, checkpoint: bool = True) -> None:
        if self._closed:
            return
        if checkpoint and self._failure is None:
            self.checkpoint()
        self._closed = True
        self._latch.close()
        self._wake.set()
        self._thread.join()
        with self._ckpt_lock:
            for snap in list(self._snapshots.values()):
                snap.close()              # takes the store lock itself
        with self._ckpt_lock, self._cond:
            for pid in list(self.parts):
                self.parts.pop(pid).close()
            self.wal.close()
            if self._failure is None:
                checkpointer.note_wal_start(self.state)   # the final marker is durable now
            self._cond.notify_all()
        self._release.close()

    def __enter__(self) -> PartitionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
