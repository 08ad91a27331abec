"""The WAL's errors: one base (:class:`WalError`) under Ferry's :class:`FerryError`."""
from __future__ import annotations

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
        super().__init__(
            f"corrupt write-ahead log: {self.path} at offset {offset}: {reason}; "
            "records from here on cannot be trusted. Run `ferry wal verify` on the "
            "directory, and `ferry wal repair DIR --backup COPY` to cut the log here "
            "if losing the records after this point is acceptable")


class OutOfDiskError(WalError, faults.OutOfDiskError):
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
