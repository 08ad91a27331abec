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
grow with the number of partitions. When the log has grown past the snapshot's size
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
            old = self._states.get((cache, p))
            if old == new:
                return old
            if not allowed(old, new):
                raise IllegalTransition(
                    f"partition {cache}/{p}: {old.value if old else 'absent'} -> {new.value} is "
                    f"not an allowed transition ({reason or 'no reason given'})")
            self._commit([(cache, p, new)])
        if self._on_change:
            self._on_change(cache, p, old, new)
        return old

    def set_many(self, changes: list[tuple[str, int, State]], *, reason: str = "") -> None:
        """Several transitions in one durable write (all checked first)."""
        with self._lock:
            olds = []
            for cache, p, new in changes:
                old = self._states.get((cache, p))
                if old != new and not allowed(old, new):
                    raise IllegalTransition(f"partition {cache}/{p}: {old} -> {new.value} not allowed ({reason})")
                olds.append(old)
            if changes:
                self._commit(changes)
        if self._on_change:
            for (cache, p, new), old in zip(changes, olds):
                if old != new:
                    self._on_change(cache, p, old, new)

    # -- durability ------------------------------------------------------------------
    def _commit(self, changes: list[tuple[str, int, State]]) -> None:
        """(lock held) Append ``changes`` to the log as one frame, durably, then make
        them the table: a reader (``get`` takes no lock) never sees a state that is not
        on disk yet, and a failed write (a full disk) leaves the table as it was."""
        self._append(statelog.encode([(c, p, s.value) for c, p, s in changes]))
        for cache, p, new in changes:
            self._states[(cache, p)] = new
        if self._log_size > self._compact_at:
            self._compact()

    def _append(self, frame: bytes) -> None:
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
            io.fdatasync(fd)
            if not self._log_exists:    # a new name is durable with its directory's fsync
                io.fsync_dir(self.dir)
                self._log_exists = True
        except BaseException as e:
            self._take_back(io, fd)
            if isinstance(e, OSError) and is_disk_full(e):
                raise OutOfDiskError(self.log_path, len(frame), e.strerror or "") from e
            raise
        finally:
            io.close(fd)
        self._log_size += len(frame)

    def _take_back(self, io: fileio.FileLayer, fd: int) -> None:
        """Cut the log back to its last acknowledged frame after a failed append: a
        frame that reached the file without its fsync returning must not come back at
        the next start as a change that was refused. Should that fail too, the next
        append cuts it first (and appends at the right offset meanwhile)."""
        try:
            io.ftruncate(fd, self._log_size)
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
            self._log_size = 0
            self._cut_log = False
        except (OSError, FerryError) as e:
            log.warning("compaction of %s into %s failed (%s); the changes are in the log, "
                        "compaction is tried again later", self.log_path, self.path, e)
        self._compact_at = self._log_size + self._threshold()
