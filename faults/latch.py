"""Failures a node outlives: a full disk, a read-only file system, no file descriptors
left. What they have in common, in one place:

* :func:`cause_of` tells them apart from every other error (following ``raise ... from``
  chains: a ``CheckpointError`` raised from an ``OutOfDiskError`` is a full disk);
* :func:`may_be_gone` asks the system, cheaply, whether the cause may have passed
  (free space, a probe file, a spare descriptor), so a component retries only then;
* :class:`Latch` is one component's failure while it lasts: it logs one WARNING per
  cause and minute (not a traceback per refused request), backs off between retries,
  logs the recovery, and is listed by :func:`latched` for the node's metrics.

Why retrying is safe where it is used: the checkpointer's failed attempt leaves its
pages dirty and the next one writes them again (``checkpoint/checkpointer.py``), and
the WAL takes back a refused write before it raises (``wal/writer.py``). Only a failed
fsync is never retried (the kernel may have dropped the pages it could not write):
the WAL stays failed and the node needs a restart, and :class:`Latch` says so.
"""
from __future__ import annotations

import enum
import errno
import logging
import os
import threading
import time
import weakref
from typing import Iterator

from .errors import OutOfDiskError

log = logging.getLogger("ferry.storage")

RESTART = "restart the node (it recovers from what is on disk)"
# Seconds between two WARNINGs of one cause (the refusals in between are counted).
WARN_EVERY = 60.0
# Retry back-off: first retry after FIRST_RETRY s, doubling up to MAX_RETRY s. The
# probe (may_be_gone) is a statvfs or an open: cheap enough to run at every step.
FIRST_RETRY = 0.1
MAX_RETRY = 2.0
# A full disk counts as "maybe freed" once this much is free (or the bytes the failed
# write needed, if more): a checkpoint writes more than the one record that failed.
MIN_FREE = 256 << 10


class Cause(enum.Enum):
    DISK_FULL = "disk_full"
    READ_ONLY = "read_only"
    OUT_OF_FDS = "out_of_fds"


_ERRNO = {errno.ENOSPC: Cause.DISK_FULL, errno.EDQUOT: Cause.DISK_FULL,
          errno.EROFS: Cause.READ_ONLY,
          errno.EMFILE: Cause.OUT_OF_FDS, errno.ENFILE: Cause.OUT_OF_FDS}


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen = 0
    while exc is not None and seen < 16:      # bounded: a cycle must not hang us
        yield exc
        exc = exc.__cause__ or exc.__context__
        seen += 1


def cause_of(exc: BaseException) -> Cause | None:
    """The cause a node outlives behind ``exc``, or None for any other error."""
    for e in _chain(exc):
        if isinstance(e, OutOfDiskError):
            return Cause.DISK_FULL
        if isinstance(e, OSError) and e.errno in _ERRNO:
            return _ERRNO[e.errno]
    return None


def _where(exc: BaseException) -> tuple[str | None, int | None]:
    """(path, bytes needed) named by the error chain, where known."""
    for e in _chain(exc):
        if isinstance(e, OutOfDiskError):
            return e.path, e.needed
        if isinstance(e, OSError) and e.filename is not None:
            return str(e.filename), None
        path = getattr(e, "path", None)       # a Ferry error that names its file
        if isinstance(path, str) and path:
            return path, None
    return None, None


def describe(cause: Cause, path: str, needed: int | None = None) -> str:
    """What happened and where, in a few words."""
    if cause is Cause.DISK_FULL:
        return f"disk full on {path}: " + (f"{needed} bytes needed" if needed is not None
                                           else "no space left")
    if cause is Cause.READ_ONLY:
        return f"filesystem read-only at {path}"
    return f"out of file descriptors at {path}"


def advice(cause: Cause) -> str:
    """What to do while writes are refused and retried."""
    if cause is Cause.DISK_FULL:
        return ("writes are refused until space is freed on that file system, then they "
                "resume by themselves")
    if cause is Cause.READ_ONLY:
        return ("writes are refused until it is writable again (the kernel turns a file "
                "system read-only after I/O errors: see its log), then they resume by "
                "themselves")
    return ("writes are refused until descriptors are closed, then they resume by "
            "themselves; raise `ulimit -n` (LimitNOFILE) if this recurs")


def _existing_dir(path: str) -> str:
    d = path
    while d and not os.path.isdir(d):
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    return d or "."


def may_be_gone(cause: Cause, path: str, needed: int | None = None) -> bool:
    """Whether the cause may have passed, from a cheap look at the system; a retry
    then tells for sure. ``path``: the file or directory the failure was at."""
    d = _existing_dir(path)
    try:
        if cause is Cause.DISK_FULL:
            st = os.statvfs(d)
            return st.f_bavail * st.f_frsize >= max(needed or 0, MIN_FREE)
        if cause is Cause.READ_ONLY:
            # statvfs says ST_RDONLY only for a mount made read-only; a file system the
            # kernel turned read-only after errors keeps the flag clear: create a file
            probe = os.path.join(d, f".ferry-probe-{os.getpid()}-{threading.get_ident()}")
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.close(fd)
            os.unlink(probe)
            return True
        # several: a checkpoint or a segment cut opens more than one file
        fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(4)]
        for fd in fds:
            os.close(fd)
        return True
    except OSError:
        return False


class _Warnings:
    """One WARNING per cause per :data:`WARN_EVERY` seconds, process-wide; refusals
    in between are counted and the next WARNING says how many."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[Cause, float] = {}
        self._quiet: dict[Cause, int] = {}
        self.refused: dict[Cause, int] = {}     # requests refused, since the start

    def report(self, cause: Cause, text: str, *, refusal: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            if refusal:
                self.refused[cause] = self.refused.get(cause, 0) + 1
            last = self._last.get(cause)
            if last is not None and now - last < WARN_EVERY:
                self._quiet[cause] = self._quiet.get(cause, 0) + 1
                return
            self._last[cause] = now
            quiet = self._quiet.pop(cause, 0)
        more = f" ({quiet} more refusals of this cause since the last warning)" if quiet else ""
        log.warning("stage=storage %s%s", text, more)


WARNINGS = _Warnings()


def report_refusal(exc: BaseException) -> bool:
    """For a request refused because of ``exc``: True (and the cause's WARNING, at
    most once a minute) when it is one a node outlives; False for any other error,
    which the caller reports its own way."""
    cause = cause_of(exc)
    if cause is None:
        return False
    path, needed = _where(exc)
    WARNINGS.report(cause, f"{describe(cause, path or '?', needed)}: {advice(cause)}",
                    refusal=True)
    return True


def refusals() -> dict[str, int]:
    """Requests refused so far in this process, by cause (:func:`report_refusal`)."""
    return {c.value: n for c, n in dict(WARNINGS.refused).items()}


_LATCHES: weakref.WeakSet[Latch] = weakref.WeakSet()
_LATCHES_LOCK = threading.Lock()


class Latch:
    """The failure of one component (``"checkpointer"``, ``"wal"``, ``"index"``) at
    ``path`` while it lasts, and when to try again."""

    def __init__(self, component: str, path: str) -> None:
        self.component, self.path = component, path
        self.error: BaseException | None = None
        self.cause: Cause | None = None
        self.needed: int | None = None
        self.where = path
        self.since = 0.0
        self.attempts = 0
        self.permanent = False
        self._delay = FIRST_RETRY
        with _LATCHES_LOCK:
            _LATCHES.add(self)

    @property
    def failed(self) -> bool:
        return self.error is not None

    def fail(self, exc: BaseException, *, retry: bool = True) -> bool:
        """Record a failure (the first one, or a failed retry). True when its cause is
        one to wait out (then retry after :meth:`delay`); False for any other error,
        or when ``retry`` is False (the component cannot go on: the node needs a
        restart), which is logged as an ERROR once."""
        cause = cause_of(exc)
        first = self.error is None or cause is not self.cause   # a new failure
        if self.error is None:
            self.since = time.monotonic()
        self.error, self.cause = exc, cause
        path, self.needed = _where(exc)
        self.where = path or self.path
        self.attempts += 1
        self._delay = FIRST_RETRY if first else min(self._delay * 2, MAX_RETRY)
        self.permanent = not retry or cause is None
        if self.permanent:
            if first:
                what = describe(cause, self.where, self.needed) + ": " if cause else ""
                log.error("stage=storage %s %s failed and is not retried: %s%s; %s",
                          self.component, self.path, what, exc, RESTART,
                          exc_info=cause is None)
            return False
        assert cause is not None                 # else it is permanent, above
        # at most one WARNING per cause and minute, whoever says it first (a refused
        # request usually does): the latch's own line would say the same again
        WARNINGS.report(cause, f"{self.component} {self.path}: "
                        f"{describe(cause, self.where, self.needed)}: {advice(cause)}")
        return True

    def delay(self) -> float:
        return self._delay

    def backoff(self) -> None:
        """The probe said the cause is still there: wait longer next time."""
        self._delay = min(self._delay * 2, MAX_RETRY)

    def may_retry(self) -> bool:
        """The cause may be gone (see :func:`may_be_gone`)."""
        return self.cause is not None and may_be_gone(self.cause, self.where, self.needed)

    def clear(self) -> None:
        if self.error is None:
            return
        log.info("stage=storage %s %s recovered after %.1f s (%d failed attempts): %s",
                    self.component, self.path, time.monotonic() - self.since,
                    self.attempts, self.cause.value if self.cause else type(self.error).__name__)
        self.error, self.cause, self.needed, self.attempts = None, None, None, 0
        self.permanent = False
        self._delay = FIRST_RETRY


    def close(self) -> None:
        """The component is closed: its failure is no longer one of the node's."""
        with _LATCHES_LOCK:
            _LATCHES.discard(self)


def latched() -> list[tuple[str, str, str]]:
    """(component, path, cause) of every failure that lasts now in this process
    (cause ``"other"`` for a failure that is not waited out)."""
    with _LATCHES_LOCK:
        latches = list(_LATCHES)
    return [(lt.component, lt.path, lt.cause.value if lt.cause else "other")
            for lt in latches if lt.error is not None]
