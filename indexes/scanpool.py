"""A pool of long-lived scan worker processes that rebuilds hand their whole scan to.

Why: a node that moves many partitions at once runs their index rebuilds in threads
of ONE process, next to the transfers, installs and replays of the other moves. The
scan (decoding pages, following overflow chains, parsing every document) is
interpreter work, so the rebuilds and the transfers took turns on one GIL while the
second CPU idled. With a pool, a rebuild sends its file's page ranges to a worker
process (:mod:`indexes.scanworker`'s protocol) and only merges the sorted runs that
come back and loads them into LMDB; the node's process keeps its GIL for the moves.
The processes outlive one rebuild (a Python start with these imports costs ~0.2 s of
CPU; a join moving 8 partitions would pay it 8 times), are started on first use or
by :meth:`ScanPool.warm`, and end with :meth:`ScanPool.close` or when their parent
dies (their stdin closes).

When: ``when="idle"`` (the default) hands a scan over only while a CPU is idle
(:func:`indexes.scanworker.idle_cpu`: 2+ CPUs and a 1-minute load average that leaves
one free, the rule of the shared scan); on a saturated machine the scan stays in the
caller's process. Measured on this project's shared 2-core machine (load average
6-9): moving the scans out did not shorten a join of 1 GiB and made one of 256 MiB
slower (the workers' start-up and hand-over are extra CPU that a busy machine has to
find, and the GIL was not the limit there: the CPU was). ``when="always"`` offloads
whatever the load (tests; machines where the node's GIL is known to be the limit).

A rebuild waits for a free process (first come, first served: a rebuild that gets
a whole process finishes sooner than eight sharing it, and the moves after it go on
to their replay earlier). A process that failed, was killed by a cancel or reported an
error is not given back: the next rebuild starts a fresh one.
"""
from __future__ import annotations

import subprocess
import threading
from typing import Callable

from . import scanworker
from .errors import RebuildCancelled

# Below this a file's scan takes a few tens of milliseconds in-process: not worth a
# worker's start (~0.3 s, ~0.2 s of CPU) nor the hand-over (a task, a range request
# per 1/32 of the file, a result). Measured: with 256 KiB partitions (bench --quick)
# warming the workers made a join slower.
OFFLOAD_MIN_BYTES = 8 << 20


class ScanPool:
    """Up to ``size`` scan worker processes shared by the rebuilds of one process."""

    def __init__(self, size: int = 1, min_bytes: int = OFFLOAD_MIN_BYTES, when: str = "idle") -> None:
        if size < 1:
            raise ValueError(f"a scan pool needs at least one process, not {size}")
        if when not in ("idle", "always"):
            raise ValueError(f"when must be 'idle' or 'always', not {when!r}")
        self.size, self.min_bytes, self.when = size, min_bytes, when
        self._cond = threading.Condition()
        self._idle: list[subprocess.Popen[bytes]] = []
        self._busy: set[subprocess.Popen[bytes]] = set()
        self._closed = False
        self._warming = False
        self.started = 0                    # processes started so far (tests, metrics)

    def wants(self, size: int) -> bool:
        """Should a scan of a file of ``size`` bytes go to this pool now?"""
        return size >= self.min_bytes and (self.when == "always" or scanworker.idle_cpu())

    def warm(self) -> None:
        """Start the processes now (in a thread: a start takes a few hundred ms), so the
        first rebuild does not wait for the interpreter and its imports. Once: later
        calls while it runs or after it started processes do nothing."""
        with self._cond:
            if self._warming or self._closed:
                return
            self._warming = True
            want = self.size - len(self._idle) - len(self._busy)

        def run() -> None:
            for _ in range(max(0, want)):
                proc = scanworker.spawn()
                with self._cond:
                    extra = self._closed or len(self._idle) + len(self._busy) >= self.size
                    if not extra:
                        self.started += 1
                        self._idle.append(proc)
                        self._cond.notify()
                if extra:                       # closed or filled meanwhile
                    _end(proc)
                    return
        threading.Thread(target=run, name="scan-pool-warm", daemon=True).start()

    def checkout(self, cancelled: Callable[[], bool] = lambda: False) -> subprocess.Popen[bytes]:
        """A live idle process (started when the pool has room), waiting for one while
        all are busy; RebuildCancelled when ``cancelled()`` turns true meanwhile."""
        with self._cond:
            while True:
                if self._closed:
                    raise RebuildCancelled("the scan pool is closed (the node is stopping)")
                while self._idle:
                    proc = self._idle.pop()
                    if proc.poll() is None:
                        self._busy.add(proc)
                        return proc
                    _end(proc)                  # died while idle: drop it
                if len(self._busy) < self.size:
                    break
                if cancelled():
                    raise RebuildCancelled("rebuild cancelled while waiting for a scan worker")
                self._cond.wait(0.1)
            self.started += 1
            proc = scanworker.spawn()
            self._busy.add(proc)
            return proc

    def checkin(self, proc: subprocess.Popen[bytes], healthy: bool) -> None:
        """Give ``proc`` back after a task: reused when ``healthy`` and alive, else ended."""
        with self._cond:
            self._busy.discard(proc)
            if healthy and not self._closed and proc.poll() is None:
                self._idle.append(proc)
            else:
                _end(proc)
            self._cond.notify()

    def close(self) -> None:
        """End the idle processes now; busy ones end when their rebuild gives them back
        (or when it is killed)."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for proc in idle:
            _end(proc)

    def __enter__(self) -> "ScanPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _end(proc: subprocess.Popen[bytes]) -> None:
    """Close its stdin (it exits by itself), kill it if it does not within a second."""
    for f in (proc.stdin, proc.stdout):
        if f is not None:
            try:
                f.close()
            except OSError:
                pass
    try:
        proc.wait(1.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
