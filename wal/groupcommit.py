"""Group commit: sync threads that write and fsync while appends accumulate.

The design of etcd's and RocksDB's pipelined writes, shaped for CPython. A waiter joins
the next sync generation with a *ticket* in one shared queue (a ``deque``):

* ``append`` in mode group *queues* its record in its ticket (no write, no syscall,
  and no lock: ``deque.append`` is atomic, so appenders never queue up behind the
  writer's lock while a sync thread holds it across a ``write``);
* ``wait_durable``/``sync``/``append_many`` (and ``append(wait=False)`` followed by
  ``wait_durable``) write their frames themselves, then queue a bare ticket.

The sync thread (:data:`SYNC_THREADS` per log: one unless changed), in a loop:

1. under the writer's lock: takes every ticket queued so far, writes their records in
   queue order with one ``write`` (LSNs and CRCs are assigned here, so a full disk
   rolls back only them, as for ``append_many``), notes the last LSN written and pins
   the segment;
2. fsyncs that segment outside every lock -- appenders keep queuing meanwhile (and
   with more than one sync thread, another may take them and fsync too);
3. publishes the new durable LSN and finishes its tickets.

Why each ticket is covered: its record was written before it was queued or in step 1,
and the LSN noted in step 1 is taken after both, before the fsync starts. With several
sync threads, fsyncs overlap: the durable LSN only moves up (``max``), and a sync
thread finishes only its own tickets, which its own fsync covered whatever the order
in which the fsyncs end; after any failed fsync no success is trusted (the kernel may
have dropped pages a concurrent fsync then did not write): the log is latched and
every waiter fails.

Waking: the sync thread wakes only the first waiter of its batch; each waiter, once
running, wakes the next (a baton). Releasing all gates at once made 16 threads fight
for the GIL: each woken thread slept again on the GIL's condition variable, about 2.8
context switches per acknowledged append instead of 2.2, and CPU time, not the disk,
is what bounds group commit here. A waiter interrupted by a signal before its turn
still hands the baton on (:func:`wait`).

Gathering: before it starts an fsync, a sync thread waits until as many tickets are
queued as it took last time (those it just woke, back with their next record), but
never longer than its previous fsync took (PostgreSQL's ``commit_delay`` with a
self-tuned target). One appender, or a batch that shrinks, never waits: the target
follows the last batch size down at once.

Measured on 2 shared vCPUs (load 5-9, 16 appending threads, 3 interleaved runs each):
43-51 us of process CPU per acknowledged append and 9.3-13.4k acknowledgements/s;
group/always with 16 threads 4.8-9.7x: CPU, not the disk, is the bound
(docs/benchmarks.md, `bench/wal_bench.py`).

Closing and failure: whoever stops the committer sets ``_stopping`` and then drains
the queue; a joiner queues and then checks ``_stopping`` (taking its ticket back if it
is still queued), so no ticket is ever left unfinished. All other fields are guarded by
the writer's lock (``Wal._lock``, handed in); :class:`SyncTarget` is what the
committer needs from the log.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Protocol

from .errors import WalError, WriteRefusedError
from .segments import OpenSegment
from .tickets import Ticket as Ticket, finish, new_gate, wait as wait  # Ticket, wait: re-exported

# Sync threads per log. More than one lets fsyncs of one file overlap (Linux runs
# them concurrently: 2 and 4 threads fdatasync'ing one file reached 1.7x and 3x the
# fsyncs/s of one here), but with the baton wake-up one thread already keeps up, and a
# second one cost ~40% more CPU per acknowledged append (more, smaller fsyncs) for no
# more acknowledgements per second (16 appenders, 3 interleaved A/B runs).
SYNC_THREADS = 1


class SyncTarget(Protocol):
    """What the committer uses of the log (``Wal`` implements it)."""

    _failed: BaseException | None     # the latched failure, None while the log is fine

    def write_records(self, payloads: list[bytes], types: list[int]) -> int:
        """Under the lock: write queued records; their last LSN (raises like appends)."""

    def _sync_begin(self) -> tuple[OpenSegment, int] | None:
        """Under the lock: pin the current segment, return it and the last LSN
        written; None when the log is closed or failed."""

    def _sync_end(self, seg: OpenSegment, target: int, ok: bool) -> None:
        """Under the lock: unpin ``seg``; publish ``target`` as durable if ok."""

    def _fail(self, err: BaseException, os_error: BaseException | None = None) -> BaseException: ...

    def _sync_fsync(self, seg: OpenSegment) -> bool:
        """fsync ``seg`` (no lock held); False when it failed (the log latched it)."""


class _Syncer:
    """One sync thread's own state (each has its own kick, so joiners wake an idle
    one and never a busy one)."""

    __slots__ = ("thread", "kick", "idle", "gathering", "target", "last_fsync", "inflight")

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        # Released by a joiner to wake this thread when idle (or gathering). Joiners do
        # not hold the log's lock, so two may release it: the second release fails
        # harmlessly, and a release that lands after the thread stopped waiting only
        # makes its next wait return at once (it then looks at the queue again).
        self.kick = threading.Lock()
        self.kick.acquire()
        self.idle = False
        self.gathering = False
        self.target = 0            # waiters that end gathering early (last batch size)
        self.last_fsync = 0.0      # seconds its previous fsync took: gathering's limit
        self.inflight: list[Ticket] = []   # taken, not finished yet


class GroupCommitter:
    """The sync threads of one log, started on the first :meth:`join`."""

    def __init__(self, log: SyncTarget, lock: threading.Lock, name: str,
                 threads: int = SYNC_THREADS) -> None:
        self._log = log
        self._lock = lock
        self._name = name
        self._q: deque[Ticket] = deque()
        self._syncers = [_Syncer() for _ in range(threads)]
        self._started = False
        self._start_lock = threading.Lock()
        self._stopping = False
        self._closing: list[Ticket] = []    # written by write_queue(), finished by stop()

    def join(self, payload: bytes | None = None, type: int = 0,
             abandoned: bool = False) -> Ticket:
        """Join the next sync generation; pass the ticket to :func:`wait`. With a
        ``payload``, queue that record for a sync thread to write (in queue order,
        just before its fsync). Without one, the caller's records must already be
        written. ``abandoned``: nobody will wait for the ticket (an fsync asked for
        in the background); the baton passes over it. Needs no lock:
        ``deque.append`` is atomic."""
        gate = new_gate()
        gate.acquire()
        ticket = [payload, type, gate, 0, None, abandoned]
        q = self._q
        q.append(ticket)
        if self._stopping:
            # Closed or failed meanwhile: whoever stopped the committer drained the
            # queue first, so take the ticket back unless they already finished it.
            try:
                q.remove(ticket)
            except ValueError:
                return ticket
            ticket[3] = -1
            gate.release()
            return ticket
        if not self._started:
            self._start()
        for s in self._syncers:
            if s.idle or (s.gathering and len(q) >= s.target):
                s.idle = s.gathering = False
                try:
                    s.kick.release()
                except RuntimeError:      # another joiner released it first
                    pass
                break
        return ticket

    def _start(self) -> None:
        with self._start_lock:
            if self._started:
                return
            for i, s in enumerate(self._syncers):
                s.thread = threading.Thread(target=self._run, args=(s,), daemon=True,
                                            name=f"wal-sync-{i} {self._name}")
                s.thread.start()
            self._started = True

    def write_queue(self) -> None:
        """Write the queued records now (caller holds the lock: the log is closing and
        its final fsync follows); :meth:`stop` then finishes their tickets."""
        items = self._drain()
        self._write(items)
        self._closing += items

    def stop(self, failed: bool) -> None:
        """The log is closing (caller holds the lock, after the final fsync, so what
        :meth:`write_queue` wrote is covered -- or the log failed and it is not).
        Records queued after that were not written: their appends fail."""
        self._stopping = True
        done, self._closing = self._closing, []
        finish(done, not failed)
        finish(self._drain(), False, bare_ok=not failed)
        self._wake()

    def join_thread(self, timeout: float = 10.0) -> None:
        """Wait for the sync threads to end (call without the lock)."""
        for s in self._syncers:
            t = s.thread
            if t is not None and t is not threading.current_thread():
                t.join(timeout)

    # -- the sync threads ------------------------------------------------------------
    def _run(self, s: _Syncer) -> None:
        try:
            self._loop(s)
        except BaseException as e:    # never leave a waiter hanging
            with self._lock:
                self._log._fail(WalError(f"a sync thread of the log stopped: {e!r}"), e)
                finish(s.inflight, False)
                s.inflight = []
                self._stop_failed()
            # Not re-raised: the error is latched in the log, and every caller of the
            # log from now on gets it with the log's path in the message.

    def _loop(self, s: _Syncer) -> None:
        q = self._q
        kick = s.kick
        while not self._stopping:
            if not q:
                s.idle = True     # before looking again: a joiner after this wakes us
                if not q:
                    kick.acquire()
                s.idle = False
                continue
            if len(q) < s.target and s.last_fsync > 0:
                s.gathering = True
                if len(q) < s.target:
                    kick.acquire(timeout=s.last_fsync)
                s.gathering = False
            if not self._sync_once(s):
                return

    def _sync_once(self, s: _Syncer) -> bool:
        """Write what is queued, fsync, finish those tickets; False when the thread
        should end."""
        log = self._log
        with self._lock:
            if self._stopping:
                return False
            items = s.inflight = self._drain()
            if not items:
                return True           # another sync thread took them
            try:
                self._write(items)
            except WalError:
                work = None           # latched by the log
            else:
                work = log._sync_begin()
            if work is None:                  # failed or closed under us
                s.inflight = []
                finish(items, False)
                self._stop_failed()
                return False
            s.target = len(items)
        seg, target = work
        t = time.monotonic()
        ok = log._sync_fsync(seg)
        s.last_fsync = time.monotonic() - t
        with self._lock:
            # With fsyncs overlapping, a failed one may have made the kernel drop pages
            # that a concurrent "successful" one then did not write: trust no success
            # once the log has failed.
            ok = ok and not log._failed
            log._sync_end(seg, target, ok)
            if not ok:
                # The failure is latched in the log; fail whoever joined meanwhile too.
                self._stop_failed()
        s.inflight = []
        finish(items, ok)
        return ok

    # -- helpers ---------------------------------------------------------------------
    def _drain(self) -> list[Ticket]:
        """Take what is queued now (``popleft`` is atomic; later joiners stay queued)."""
        q = self._q
        pop = q.popleft
        return [pop() for _ in range(len(q))]

    def _write(self, items: list[Ticket]) -> None:
        """Write the queued records of ``items`` with one ``write`` (under the lock) and
        give each its LSN. A full disk (or a read-only file system, no descriptors)
        fails those records only (rolled back); any other write error is latched by
        the log and raised."""
        payloads = [t[0] for t in items if t[0] is not None]
        if not payloads:
            return
        queued = [t for t in items if t[0] is not None]
        try:
            last = self._log.write_records(payloads, [t[1] for t in queued])
        except WriteRefusedError as e:
            for t in queued:
                t[3] = e
            return
        lsn = last - len(payloads) + 1
        for t in queued:
            t[3] = lsn
            t[0] = None               # written: let the payload go
            lsn += 1

    def _stop_failed(self) -> None:
        """Stop for good after a failure (caller holds the lock): fail the queue."""
        self._stopping = True
        finish(self._drain(), False)
        self._wake()

    def _wake(self) -> None:
        for s in self._syncers:
            s.idle = s.gathering = False
            try:
                s.kick.release()
            except RuntimeError:
                pass
