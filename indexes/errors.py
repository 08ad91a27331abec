"""The index package's errors: one subclass of :class:`FerryError` per failure a caller
can act on. Messages name the environment, partition or index and say what to do."""
from __future__ import annotations

import faults


class IndexStoreError(faults.FerryError):
    """Base of every error of the ``indexes`` package."""


class OutOfDiskError(IndexStoreError, faults.OutOfDiskError):
    """The index environment or a rebuild's scratch files ran out of disk space."""


class IndexCorruptError(IndexStoreError):
    """The LMDB file is not a valid environment (garbage, truncated, damaged pages).
    Nothing in it can be trusted; every partition is rebuilt from data."""

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        super().__init__(
            f"index environment {path} is corrupt: {detail}. The indexes hold no data of "
            "their own: open it with IndexStore.open(..., reset_corrupt=True) or "
            f"`ferry index rebuild --reset-corrupt --index {path} ...` to move the "
            "damaged file aside and rebuild every partition from the partition files")


class IndexDefinitionError(IndexStoreError, ValueError):
    """An index definition is malformed or names an unknown index."""


class IndexNotReadyError(IndexStoreError):
    """``apply`` was called for a partition whose index is not ready (never rebuilt,
    rebuild cut short, or dropped). A MOVING partition's updates must stay in its temp
    WAL until ``rebuild`` has finished."""


class BadValueError(IndexStoreError, ValueError):
    """A value refused by an index whose policy is ``on_bad="refuse"``: not a valid
    document, the field is missing, or it has a type the index does not take."""

    def __init__(self, index: str, key: bytes, reason: str) -> None:
        self.index, self.key, self.reason = index, key, reason
        super().__init__(f"index {index!r} refuses the value of key {key!r}: {reason}; "
                         "fix the document or declare the index with on_bad='skip'")


class UniqueViolationError(IndexStoreError):
    """A unique index already maps the value to another primary key."""

    def __init__(self, index: str, value: object, key: bytes, holder: bytes) -> None:
        self.index, self.value, self.key, self.holder = index, value, key, holder
        super().__init__(f"unique index {index!r}: value {value!r} of key {key!r} is "
                         f"already held by key {holder!r}; nothing was changed")


class RebuildCancelled(IndexStoreError):
    """A rebuild was cancelled by its caller. The partition is left not ready; the
    next rebuild starts clean."""


class BadQueryError(IndexStoreError, ValueError):
    """A lookup or range bound that no index value can equal (list, dict, NaN ...)."""


class BadDocument(IndexStoreError, ValueError):
    """A stored value is not a document of the store's codec (the indexer counts it as
    a bad value, or refuses it under ``on_bad="refuse"``)."""


class UnencodableValue(IndexStoreError, ValueError):
    """The value has no place in the index order (list, dict, NaN, huge int)."""


class StreamingUnavailable(IndexStoreError):
    """A streamed index build cannot be used (its memory bound was passed, the index
    definitions changed, a page range did not decode): rebuild from the file."""


class ShippedIndexRefused(IndexStoreError):
    """A partition's index shipped by a file supplier failed a check (header, digest,
    order, count, a sample against the installed file): the partition is left not
    ready and its index is rebuilt from the file instead."""
