"""Ferry's one error hierarchy.

Every package defines its own subclass of :class:`FerryError` (``WalError``,
``CheckpointError``, ``TransferError``, ``IndexStoreError`` ...). OS errors are
translated where they enter: :func:`translate_os_error` turns ENOSPC/EDQUOT into
:class:`OutOfDiskError` naming the path and the bytes that were needed.
"""
from __future__ import annotations

import errno


class FerryError(Exception):
    """Base of every error Ferry raises on purpose. Messages say what happened,
    where, and what to do."""


class OutOfDiskError(FerryError):
    """The file system holding ``path`` has no room for ``needed`` more bytes."""

    def __init__(self, path: str, needed: int | None = None, detail: str = "") -> None:
        self.path = str(path)
        self.needed = needed
        need = f" ({needed} bytes needed)" if needed is not None else ""
        extra = f": {detail}" if detail else ""
        super().__init__(
            f"out of disk space writing {self.path}{need}{extra}; "
            "free space on that file system and retry"
        )


class NotRegularFile(FerryError):
    """:func:`faults.fileio.read_regular` found something other than a regular file."""


class FileTooLarge(FerryError):
    """:func:`faults.fileio.read_regular` found a file over its limit; ``size`` is its
    size."""

    def __init__(self, size: int) -> None:
        self.size = size
        super().__init__(f"{size} bytes")


_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _DISK_FULL


def translate_os_error(exc: OSError, path: str, needed: int | None = None,
                       cls: type[OutOfDiskError] = OutOfDiskError) -> BaseException:
    """Return the Ferry error for ``exc`` (an OutOfDiskError subclass for a full disk),
    or ``exc`` itself when it is not one Ferry translates."""
    if is_disk_full(exc):
        return cls(path, needed, exc.strerror or "")
    return exc
