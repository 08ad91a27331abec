"""Partition states of one node and the ONE table of allowed transitions.

::

    (absent) --create-->  OWNING      a new cluster creates its partitions
    (absent) --assign-->  MOVING      this node is a new owner; it pulls the data
    MOVING   --gate---->  OWNING      data complete and durable (see docs/node.md)
    MOVING   --cancel-->  EVICTED     no longer assigned before the move finished
    MOVING   --lost---->  LOST        no owner left to pull from
    OWNING   --resync-->  MOVING      a copy that may be stale (restart, counter gap)
    OWNING   --rent---->  RENTING     no longer an owner; the new owners are OWNING
    RENTING  --evict--->  EVICTED     data deleted once no read uses it
    RENTING  --reclaim->  OWNING      assigned again before eviction
    EVICTED  --assign-->  MOVING      assigned again later
    LOST     --assign-->  MOVING      an owner came back
    LOST     --found--->  OWNING      this node's own copy is the best one left

Every change goes through :meth:`StateTable.set`, which checks the table and makes the
change durable before it returns, so after a crash the node knows what it held (a
MOVING partition restarts its move; an OWNING one is re-synced).

On disk (``DATA/``): ``states.json``, a snapshot ``{"caches": {CACHE: {PARTITION:
STATE}}}``, and ``states.log``, the changes made since (framing in
:mod:`node.statelog`). A change is one frame appended and fsynced: its cost does not
grow with the number of partitions, and changes made at the same time by several
threads (a node's concurrent moves) share one fdatasync (group commit: each caller
returns once its own frame is durable, and sees the table change only then). When the log has grown past the snapshot's size
the table is written as a new snapshot (temp file, fsync, rename, fsync of the
directory) and the log emptied, so rewriting the whole table is paid once per about
as many bytes of changes: O(1) per change, amortised. A data dir of a node that
rewrote ``states.json`` on every change is simply a snapshot with no log.
:func:`read_states` reads both, for tools and tests.
"""
from __future__ import annotations

import enum
import json
import logging
import os
import threading
from typing import Callable, Iterator

from faults import FerryError, OutOfDiskError, fileio, is_disk_full

from . import statelog
from .errors import DataDirError, IllegalTransition

log = logging.getLogger("ferry.node.states")


class State(str, enum.Enum):
    MOVING = "MOVING"
    OWNING = "OWNING"
    RENTING = "RENTING"
    EVICTED = "EVICTED"
    LOST = "LOST"


ABSENT = None
ALLOWED: dict[State | None, frozenset[State]] = {
    ABSENT: frozenset({State.OWNING, State.MOVING}),
    State.MOVING: frozenset({State.OWNING, State.EVICTED, State.LOST}),
    State.OWNING: frozenset({State.MOVING, State.RENTING}),
    State.RENTING: frozenset({State.EVICTED, State.OWNING}),
    State.EVICTED: frozenset({State.MOVING}),
    State.LOST: frozenset({State.MOVING, State.OWNING}),
}


def allowed(old: State | None, new: State) -> bool:
    return new in ALLOWED[old]


Key = tuple[str, int]


# The log is compacted once past the snapshot's size, but never below this: a table of
# a few partitions would otherwise be rewritten every change or two (four fsyncs per
# change instead of one); reading this much more at start costs nothing.
MIN_COMPACT = 64 << 10

SNAPSHOT = "states.json"
LOG = "states.log"


class _OnDisk:
    """What ``states.json`` + ``states.log`` hold: the table, the snapshot's size, and
    the log's length up to its last whole frame (a torn tail past it is ignored)."""

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, SNAPSHOT)
        self.log_path = os.path.join(data_dir, LOG)
        self.states: dict[Key, State] = {}
        self.snapshot_size: int | None = None       # None: no snapshot yet
        self.log_size = 0
        self.torn = 0
        self.log_exists = False
        # The log before the snapshot: a reader beside a running node then never pairs
        # an older snapshot with a log emptied by a compaction in between (a newer
        # snapshot with an older log is fine: frames are absolute, replaying changes
        # the snapshot holds already changes nothing).
        raw_log = self._read(self.log_path)
        raw = self._read(self.path)
        if raw is not None:
            self.snapshot_size = len(raw)
            self._snapshot(raw)
        if raw_log is not None:
            raw = raw_log
            self.log_exists = True
            try:
                got = statelog.decode(raw, State.__members__.keys())
            except statelog.LogDamaged as e:
                raise self._damaged(self.log_path, str(e), "a torn write only ever cuts its "
                                    "end") from None
            for frame in got.frames:
                for cache, p, st in frame:
                    self.states[(cache, p)] = State(st)
            self.log_size, self.torn = got.end, got.torn

    @staticmethod
    def _damaged(path: str, why: str, because: str = "the file is written atomically") -> DataDirError:
        return DataDirError(f"cannot read partition states {path}: {why}; {because}, so this "
                            "is damage: restore it or wipe the data dir")

    def _read(self, path: str) -> bytes | None:
        try:
            return fileio.read_regular(path)      # a FIFO must not hang the start
        except FileNotFoundError:
            return None
        except fileio.NotRegularFile:
            raise self._damaged(path, "not a regular file") from None
        except OSError as e:
            raise self._damaged(path, e.strerror or str(e)) from None

    def _snapshot(self, raw: bytes) -> None:
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError) as e:       # UnicodeDecodeError is a ValueError
            raise self._damaged(self.path, f"not JSON ({e})") from None
        caches = doc.get("caches", {}) if isinstance(doc, dict) else None
        if not isinstance(caches, dict) or not all(isinstance(v, dict) for v in caches.values()):
            raise self._damaged(self.path, 'expected {"caches": {CACHE: {PARTITION: STATE}}}')
        for cache, parts in caches.items():
            for p, s in parts.items():
                if not p.isdigit() or not isinstance(s, str) or s not in State.__members__:
                    raise self._damaged(self.path, f"cache {cache!r}: {p!r}: {s!r} is not "
                                        f"PARTITION: STATE (states: {', '.join(State.__members__)})")
                self.states[(cache, int(p))] = State(s)


def read_states(data_dir: str) -> dict[str, dict[str, str]]:
    """The partition states a data dir holds (snapshot and log), read only:
    ``{cache: {"<partition>": "STATE"}}``, the ``"caches"`` of ``states.json``. For
    tools and tests that look at a data dir, of a running node too (a torn tail of
    the log is a change not yet acknowledged: left out). Raises DataDirError on
    damage."""
    out: dict[str, dict[str, str]] = {}
    for (cache, p), s in sorted(_OnDisk(data_dir).states.items()):
        out.setdefault(cache, {})[str(p)] = s.value
    return out


def _snapshot_bytes(states: dict[Key, State]) -> bytes:
    doc: dict[str, dict[str, dict[str, str]]] = {"caches": {}}
    for (cache, p), s in sorted(states.items()):
        doc["caches"].setdefault(cache, {})[str(p)] = s.value
    return json.dumps(doc, sort_keys=True).encode()


class _Frame:
    """A frame of changes written to the log: its end offset, its changes, and once
    its sync is over, ``done`` (with ``error`` when that sync failed)."""
    __slots__ = ("end", "changes", "done", "error")

    def __init__(self, end: int, changes: dict[Key, State]) -> None:
        self.end, self.changes = end, changes
        self.done = False
        self.error: BaseException | None = None


class StateTable:
    """Durable ``(cache, partition) -> State`` of this node."""

    FILE = SNAPSHOT

    def __init__(self, data_dir: str,
                 on_change: Callable[[str, int, State | None, State], None] | None = None) -> None:
        disk = _OnDisk(data_dir)
        self.dir = os.path.abspath(data_dir)
        self.path, self.log_path = disk.path, disk.log_path
        self._lock = threading.Lock()
        self._states = disk.states
        self._on_change = on_change
        self._snapshot_size = disk.snapshot_size
        self._log_size = disk.log_size
        self._log_exists = disk.log_exists
        self._durable = disk.log_size         # log bytes known durable
        self._pending: list[_Frame] = []      # frames written, not yet durable, in log order
        self._sync_lock = threading.Lock()    # one fdatasync of the log at a time
        # no snapshot yet: the first change writes one (the table's file then exists)
        self._compact_at = self._threshold() if disk.snapshot_size is not None else 0
        # A torn tail is cut off by the first append (a frame after it would be lost in
        # it); opening the table writes nothing.
        self._cut_log = bool(disk.torn)
        if disk.torn:
            log.warning("stage=start %s: ignoring a torn tail of %d bytes after offset %d "
                        "(a change cut short by a crash, never acknowledged)",
                        self.log_path, disk.torn, disk.log_size)

    def get(self, cache: str, p: int) -> State | None:
        return self._states.get((cache, p))

    def items(self) -> Iterator[tuple[Key, State]]:
        with self._lock:
            return iter(list(self._states.items()))

    def of_cache(self, cache: str) -> dict[int, State]:
        with self._lock:
            return {p: s for (c, p), s in self._states.items() if c == cache}

    def set(self, cache: str, p: int, new: State, *, reason: str = "") -> State | None:
        """Move (cache, p) to ``new`` if the table allows it; durable on return.
        Setting the current state again is a no-op."""
        with self._lock:
            old = self._intended((cache, p))
            if old == new:
                entry = self._pending_of((cache, p))
            else:
                if not allowed(old, new):
                    raise IllegalTransition(
                        f"partition {cache}/{p}: {old.value if old else 'absent'} -> {new.value} is "
                        f"not an allowed transition ({reason or 'no reason given'})")
                entry = self._write([(cache, p, new)])
        if entry is not None:
            self._wait_durable(entry)
        if old != new and self._on_change:
            self._on_change(cache, p, old, new)
        return old

    def set_many(self, changes: list[tuple[str, int, State]], *, reason: str = "") -> None:
        """Several transitions in one durable write (all checked first)."""
        with self._lock:
            olds = []
            for cache, p, new in changes:
                old = self._intended((cache, p))
                if old != new and not allowed(old, new):
                    raise IllegalTransition(f"partition {cache}/{p}: {old} -> {new.value} not allowed ({reason})")
                olds.append(old)
            entry = self._write(changes) if changes else None
        if entry is not None:
            self._wait_durable(entry)
        if self._on_change:
            for (cache, p, new), old in zip(changes, olds):
                if old != new:
                    self._on_change(cache, p, old, new)

    # -- durability ------------------------------------------------------------------
    # Group commit: a change's frame is written under the table's lock, then made
    # durable by ONE fdatasync shared with every frame written before it (the caller
    # that finds no sync running does it for all, outside the table's lock, so others
    # write their frames meanwhile); the frames it covered become the table in log
    # order, and only then does each caller return. A failed sync takes back every
    # frame it covered, and each of their callers raises.
    def _intended(self, key: Key) -> State | None:
        """(lock held) The state ``key`` has once every written frame is durable."""
        for entry in reversed(self._pending):
            if key in entry.changes:
                return entry.changes[key]
        return self._states.get(key)

    def _pending_of(self, key: Key) -> "_Frame | None":
        """(lock held) The newest written, not yet durable frame that changes ``key``."""
        for entry in reversed(self._pending):
            if key in entry.changes:
                return entry
        return None

    def _write(self, changes: list[tuple[str, int, State]]) -> "_Frame":
        """(lock held) Write ``changes`` to the log as one frame, not yet synced; a failed
        write leaves the log as it was."""
        frame = statelog.encode([(c, p, s.value) for c, p, s in changes])
        io = fileio.layer()     # per write: a layer swapped in by a test applies at once
        try:
            fd = io.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            if is_disk_full(e):
                raise OutOfDiskError(self.log_path, len(frame), e.strerror or "") from e
            raise
        try:
            if self._cut_log:
                io.ftruncate(fd, self._log_size)
                self._cut_log = False
            os.lseek(fd, self._log_size, os.SEEK_SET)
            fileio.write_all(fd, frame, self.log_path, io=io)
        except BaseException as e:
            self._take_back(io, fd, self._log_size)
            if isinstance(e, OSError) and is_disk_full(e):
                raise OutOfDiskError(self.log_path, len(frame), e.strerror or "") from e
            raise
        finally:
            io.close(fd)
        self._log_size += len(frame)
        entry = _Frame(self._log_size, {(c, p): s for c, p, s in changes})
        self._pending.append(entry)
        return entry

    def _wait_durable(self, entry: "_Frame") -> None:
        """Return once ``entry`` is durable and in the table (raise what failed it)."""
        while True:
            with self._lock:
                if entry.done:
                    if entry.error is not None:
                        raise entry.error
                    return
            with self._sync_lock:
                with self._lock:
                    if entry.done:
                        continue
                    upto, covered = self._log_size, list(self._pending)
                    new_file = not self._log_exists
                try:
                    self._sync(new_file)
                except BaseException as e:
                    with self._lock:
                        self._fail(covered, e)
                    continue
                with self._lock:
                    self._durable = upto
                    self._log_exists = True
                    for done in covered:
                        for (cache, p), new in done.changes.items():
                            self._states[(cache, p)] = new
                        done.done = True
                    self._pending = self._pending[len(covered):]
                    # compacted when no frame is pending (a snapshot of the table then
                    # holds every frame of the log: emptying it loses none)
                    if not self._pending and self._log_size > self._compact_at:
                        self._compact()

    def _sync(self, new_file: bool) -> None:
        """fdatasync of the log (and of its folder when the log is new)."""
        io = fileio.layer()
        fd = io.open(self.log_path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            io.fdatasync(fd)
        finally:
            io.close(fd)
        if new_file:            # a new name is durable with its directory's fsync
            io.fsync_dir(self.dir)

    def _fail(self, covered: list["_Frame"], e: BaseException) -> None:
        """(lock held) The sync of ``covered`` failed: none of them is acknowledged.
        The log goes back to its last durable frame; so does every frame written after
        them (their callers raise too: their frames may follow one that is gone)."""
        failed = list(self._pending)
        for entry in failed:
            entry.done, entry.error = True, e
        self._pending = []
        io = fileio.layer()
        try:
            fd = io.open(self.log_path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            self._cut_log = True
        else:
            try:
                self._take_back(io, fd, self._durable)
            finally:
                io.close(fd)
        self._log_size = self._durable

    def _take_back(self, io: fileio.FileLayer, fd: int, size: int) -> None:
        """Cut the log back to ``size`` after a failed write or sync: a frame that
        reached the file without its fsync returning must not come back at the next
        start as a change that was refused. Should that fail too, the next write cuts
        it first (and writes at the right offset meanwhile)."""
        try:
            io.ftruncate(fd, size)
            io.fdatasync(fd)
        except OSError:
            self._cut_log = True

    def _threshold(self) -> int:
        return max(self._snapshot_size or 0, MIN_COMPACT)

    def _compact(self) -> None:
        """(lock held) Write the table as the new snapshot and empty the log. Every
        change is durable in the log already, so a failure here loses nothing: it is
        logged and tried again once the log has grown by as much again."""
        data = _snapshot_bytes(self._states)
        try:
            fileio.atomic_write(self.path, data)
            self._snapshot_size = len(data)
            io = fileio.layer()
            fd = io.open(self.log_path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                io.ftruncate(fd, 0)
                io.fdatasync(fd)
            finally:
                io.close(fd)
            self._log_size = self._durable = 0
            self._cut_log = False
        except (OSError, FerryError) as e:
            log.warning("compaction of %s into %s failed (%s); the changes are in the log, "
                        "compaction is tried again later", self.log_path, self.path, e)
        self._compact_at = self._log_size + self._threshold()
