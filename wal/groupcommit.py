"""Group commit: one sync thread per log that writes and fsyncs while appends accumulate.

The design of etcd's and RocksDB's pipelined writes, shaped for CPython. There are two
ways to join the current :class:`Batch` (the one shared object of the next sync
generation), both under the writer's lock:

* ``append`` in mode group *queues* its record in the batch (no write, no syscall);
* ``wait_durable``/``sync``/``append_many`` (and ``append(wait=False)`` followed by
  ``wait_durable``) write their frames themselves, then join.

The sync thread, in a loop:

1. under the writer's lock: writes the batch's queued records in order with one
   ``write`` (LSNs and CRCs are assigned here, so a full disk rolls back only them, as
   for ``append_many``), puts a fresh batch in its place, notes the last LSN written
   and pins the segment;
2. fsyncs that segment outside every lock -- appenders keep queuing and joining the
   fresh batch meanwhile;
3. publishes the new durable LSN and finishes the batch: every member returns (a
   queued one with its LSN, ``first_lsn`` + its place in the queue).

Why each batch member is covered: its record was written before it joined or in step
1, and the LSN noted in step 1 is taken after both, before the fsync starts. A member
that joins while an fsync runs is in the *next* batch, whose fsync starts as soon as
this one ends: the disk never idles while someone waits.

Why appenders queue instead of writing: on a busy CPU the wall was not the disk but the
time the appenders woken by one fsync need to come back with their next record. A
writing appender pays a syscall and two GIL hand-offs (``os.write`` releases the GIL
while the writer's lock is held, so the others pile up on the lock); a queuing one
pays neither, and the sync thread writes N frames at the cost of one.

Gathering: with the disk always busy, appenders split into two halves -- one in the
fsync running, one gathering for the next -- so N threads share fsyncs N/2 at a time.
Before it starts an fsync, the sync thread therefore waits until as many appenders
have joined as were in the previous batch (those it just woke, back with their next
record), but never longer than the previous fsync took (PostgreSQL's ``commit_delay``
with a self-tuned target). One appender, or a batch that shrinks, never waits: the
target follows the last batch size down at once.

Why this is cheaper than leader/follower in CPython: there is no election and no
``notify_all`` on a shared condition after which N threads fight for one lock to
re-check a predicate. Each member blocks on a gate (a ``Lock`` it took when it joined,
as ``Condition.wait`` does inside) and finishing the batch releases all of them: every
waiter is woken exactly once, all at the same moment, and then re-checks nothing and
takes no shared lock. (One shared gate passed on from waiter to waiter as a baton
measured the same, but one descheduled waiter stalls everyone behind it.)

Measured on 2 shared vCPUs (load 6-12): a 16-thread batch holds ~15 records (8-9 with
leader/follower) and the fsync is busy ~55% of the time; the rest is the 16 threads
waking up and queuing again, CPU time that grows with the machine's load.

All fields here except the batch gates are guarded by the writer's lock (``Wal._lock``,
handed in); :class:`SyncTarget` is what the committer needs from the log.
"""
from __future__ import annotations

import threading
import time
from typing import Protocol

from .errors import OutOfDiskError, WalError
from .segments import OpenSegment


class Batch:
    """The appenders waiting for one fsync ("sync generation"), and the records queued
    for the sync thread to write before that fsync."""

    __slots__ = ("_gates", "failed", "_done", "payloads", "types", "first_lsn",
                 "queue_error")

    def __init__(self) -> None:
        self._gates: list[threading.Lock] = []
        self.failed = False
        self._done = False
        self.payloads: list[bytes] = []     # queued records, in LSN order once written
        self.types: list[int] = []
        self.first_lsn = 0                  # LSN of payloads[0] once written
        self.queue_error: BaseException | None = None   # the queue could not be written

    @property
    def waiters(self) -> int:
        return len(self._gates)

    def add(self) -> threading.Lock:
        """A gate for one more waiter (under the log's lock), closed until the fsync ends."""
        gate = _allocate_lock()
        gate.acquire()
        self._gates.append(gate)
        return gate

    def finish(self, failed: bool) -> None:
        if self._done:
            return
        self._done = True
        self.failed = failed
        for gate in self._gates:      # everyone runnable at once, each woken once
            gate.release()


_allocate_lock = threading.Lock
# (batch, gate, index of the waiter's queued record or -1)
Ticket = tuple[Batch, threading.Lock, int]


def wait(ticket: Ticket) -> int:
    """Block until the ticket's batch is finished. Returns the LSN of the queued record
    (0 when the ticket queued none); -1 when the fsync failed. Raises the error that
    kept a queued record from being written (a full disk)."""
    batch, gate, index = ticket
    gate.acquire()
    if index >= 0 and batch.queue_error is not None:
        raise batch.queue_error
    if batch.failed:
        return -1
    return batch.first_lsn + index if index >= 0 else 0


class SyncTarget(Protocol):
    """What the committer uses of the log (``Wal`` implements it)."""

    def write_records(self, payloads: list[bytes], types: list[int]) -> int:
        """Under the lock: write queued records; their last LSN (raises like appends)."""

    def _sync_begin(self) -> tuple[OpenSegment, int] | None:
        """Under the lock: pin the current segment, return it and the last LSN
        written; None when the log is closed or failed."""

    def _sync_end(self, seg: OpenSegment, target: int, ok: bool) -> None:
        """Under the lock: unpin ``seg``; publish ``target`` as durable if ok."""

    def _fail(self, err: BaseException) -> BaseException: ...

    def _sync_fsync(self, seg: OpenSegment) -> bool:
        """fsync ``seg`` (no lock held); False when it failed (the log latched it)."""


class GroupCommitter:
    """The sync thread of one log, started on the first :meth:`join`."""

    def __init__(self, log: SyncTarget, lock: threading.Lock, name: str) -> None:
        self._log = log
        self._lock = lock
        self._name = name
        self.pending = Batch()
        self._thread: threading.Thread | None = None
        self._idle = False
        # Released by a joiner to wake the idle (or gathering) sync thread. Released
        # only by whoever clears ``_idle``/``_gathering`` under the lock, so a wake-up
        # is never lost and the lock is never released twice.
        self._kick = threading.Lock()
        self._kick.acquire()
        self._stopping = False
        self._gathering = False
        self._target = 0            # waiters that end gathering early (last batch size)
        self._last_fsync = 0.0      # seconds the previous fsync took: gathering's limit
        self._inflight: Batch | None = None   # taken, not finished yet

    def join(self, payload: bytes | None = None, type: int = 0) -> Ticket:
        """Join the next sync generation (caller holds the lock); pass the ticket to
        :func:`wait` once the lock is released. With a ``payload``, queue that record
        for the sync thread to write (in order, just before the fsync)."""
        batch = self.pending
        index = -1
        if payload is not None:
            index = len(batch.payloads)
            batch.payloads.append(payload)
            batch.types.append(type)
        gate = batch.add()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"wal-sync {self._name}",
                                            daemon=True)
            self._thread.start()
        elif self._idle or (self._gathering and batch.waiters >= self._target):
            self._idle = self._gathering = False
            self._kick.release()
        return batch, gate, index

    def write_queue(self) -> None:
        """Write the pending batch's queued records (caller holds the lock). A full
        disk fails those records only (they were rolled back); any other write error
        is latched by the log and raised."""
        batch = self.pending
        if not batch.payloads or batch.first_lsn or batch.queue_error is not None:
            return
        try:
            last = self._log.write_records(batch.payloads, batch.types)
        except OutOfDiskError as e:
            batch.queue_error = e
            return
        batch.first_lsn = last - len(batch.payloads) + 1

    def stop(self, failed: bool) -> None:
        """The log is closing (caller holds the lock, after the final fsync,
        so the waiting batch is covered -- or the log failed and it is not)."""
        self._stopping = True
        self.pending.finish(failed)
        if self._idle or self._gathering:
            self._idle = self._gathering = False
            self._kick.release()

    def join_thread(self, timeout: float = 10.0) -> None:
        """Wait for the sync thread to end (call without the lock)."""
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:    # never leave a waiter hanging
            with self._lock:
                self._log._fail(WalError(f"the sync thread of the log stopped: {e!r}"))
                self._stopping = True
                self.pending.finish(True)
                if self._inflight is not None:
                    self._inflight.finish(True)
            # Not re-raised: the error is latched in the log, and every caller of the
            # log from now on gets it with the log's path in the message.

    def _loop(self) -> None:
        lock = self._lock
        while True:
            with lock:
                if self._stopping:
                    return
                batch = self.pending
                gather = 0.0
                idle = self._idle = not batch.waiters
                if not idle and batch.waiters < self._target and self._last_fsync > 0:
                    self._gathering = True
                    gather = self._last_fsync
            if idle:
                self._kick.acquire()          # sleep until someone joins
                continue
            if gather:
                woken = self._kick.acquire(timeout=gather)
                with lock:
                    if not woken and not self._gathering:
                        self._kick.acquire()  # a joiner released it as we timed out
                    self._gathering = False
            if not self._sync_once():
                return

    def _sync_once(self) -> bool:
        """Write the pending batch's queue, fsync, finish the batch; False when the
        thread should end."""
        log = self._log
        with self._lock:
            if self._stopping:
                return False
            batch = self.pending
            try:
                self.write_queue()
            except WalError:
                work = None           # latched by the log
            else:
                work = log._sync_begin()
            if work is None:                  # failed or closed under us
                batch.finish(True)
                return False
            self.pending = Batch()
            self._inflight = batch
            self._target = batch.waiters
        seg, target = work
        t = time.monotonic()
        ok = log._sync_fsync(seg)
        self._last_fsync = time.monotonic() - t
        with self._lock:
            log._sync_end(seg, target, ok)
            if not ok:
                # The failure is latched in the log; fail whoever joined meanwhile too.
                self._stopping = True
                self.pending.finish(True)
        batch.finish(not ok)
        self._inflight = None
        return ok
