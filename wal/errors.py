"""The WAL's errors: one base (:class:`WalError`) under Ferry's :class:`FerryError`."""
from __future__ import annotations

import os

import faults


class WalError(faults.FerryError):
    """Base of every error the write-ahead log raises on purpose."""


class CorruptRecordError(WalError):
    """A record or segment that is not a torn tail failed its checks.

    Never skipped silently: everything after it is unreadable until a person decides
    (``ferry wal verify`` to locate, ``ferry wal repair --backup`` to cut it off).
    """

    def __init__(self, path: str, offset: int, reason: str) -> None:
        self.path = str(path)
        self.offset = offset
        self.reason = reason
        d = os.path.dirname(self.path) or "."
        super().__init__(
            f"corrupt write-ahead log: {self.path} at offset {offset}: {reason}; "
            f"records from here on cannot be trusted, and the log does not open for "
            f"writing until a person decides. `ferry wal verify {d}` shows the damage; "
            f"`ferry wal repair {d} --backup {d}.backup` cuts the log here (the records "
            "after this point are lost; the backup keeps a copy)")


class PositionMismatch(WalError):
    """A read asked to start at a :class:`~wal.reader.Position` that does not describe
    this log (a stale or foreign hint): nothing is wrong with the log; read it from a
    segment's start instead."""


class SegmentNotAFileError(WalError):
    """Something other than a regular file (a directory, a dangling link, a FIFO) sits
    in the log directory under a segment's name: nothing the log can read or repair;
    a person has to move it."""

    def __init__(self, path: str, kind: str) -> None:
        self.path = str(path)
        self.kind = kind
        d = os.path.dirname(self.path) or "."
        super().__init__(
            f"{self.path} is {kind}, not a write-ahead log segment file: move it out of "
            f"{d} (or put the segment file back from a backup), then run again")


class WriteRefusedError(WalError):
    """An append or segment cut the system refused: a full disk (:class:`OutOfDiskError`),
    a read-only file system, no file descriptors left. Nothing was acknowledged, what
    was written of it is taken back, and the log stays usable: appends succeed again
    once the cause is gone."""

    def __init__(self, path: str, err: OSError) -> None:
        from faults.latch import Cause, advice, cause_of, describe
        self.path = str(path)
        cause = cause_of(err) or Cause.READ_ONLY
        super().__init__(f"write-ahead log {self.path}: {describe(cause, self.path)} "
                         f"({err.strerror or err}); nothing was acknowledged: {advice(cause)}")


class OutOfDiskError(WriteRefusedError, faults.OutOfDiskError):
    """An append or segment cut found the file system full; nothing was acknowledged."""

    def __init__(self, path: str, needed: int | None = None, detail: str = "") -> None:
        faults.OutOfDiskError.__init__(self, path, needed, detail)


class WalLockedError(WalError):
    """Another writer (process or open :class:`Wal`) holds the directory's lock."""

    def __init__(self, path: str, holder: str = "") -> None:
        self.path = str(path)
        who = f" (held by {holder})" if holder else ""
        super().__init__(
            f"write-ahead log {self.path} is already open for writing{who}; only one "
            "writer per directory is allowed. Close the other writer, or open a reader "
            "with Wal.reader(path)")


class WalClosedError(WalError):
    """The log was closed (or failed) and cannot take this call."""
