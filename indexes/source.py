"""Sources for rebuild and verify: anything with ``scan(partition)`` yielding the
partition's live (key, value) pairs; ``count(partition)``, when present, gives
progress a total."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Iterable, Iterator, Mapping, Protocol

from checkpoint.layout import parse_part_name, part_name

from .errors import IndexStoreError

if TYPE_CHECKING:
    from checkpoint.decode import LiveColumns


class Source(Protocol):
    """Anything that lists a partition's live (key, value) pairs. A source may also
    have ``scan_batches(partition)`` (the same pairs in lists; rebuild and verify
    prefer it), ``scan_columns(partition)`` (the same pairs as lists or the decoder's
    ``LiveColumns``; preferred to both) and ``count(partition)`` (progress totals)."""

    def scan(self, partition: int) -> Iterable[tuple[bytes, bytes]]: ...


class PartitionFileSource:
    """Reads partition files with ``checkpoint.pagefile.iter_entries`` (tombstones
    left out). ``path`` is one partition file (scanned whatever partition is asked),
    or a directory of ``part-<p>.bin`` files. ``verified=True``: the caller vouches
    that every page of the file(s) passed check_page since last written (the store's
    install scan read them: ``PartitionStore.file_checked``), so the scan does not
    compute the page CRCs again; page structure is checked all the same."""

    def __init__(self, path: str, verified: bool = False) -> None:
        self.path = os.path.abspath(path)
        self.verified = verified

    def file_for(self, partition: int) -> str:
        if os.path.isdir(self.path):
            return os.path.join(self.path, part_name(partition))
        return self.path

    def partitions(self) -> list[int]:
        """The partitions a directory holds files for (sorted)."""
        if not os.path.isdir(self.path):
            raise IndexStoreError(f"{self.path} is a file, not a directory of partitions")
        found = (parse_part_name(name) for name in os.listdir(self.path))
        return sorted(p for p in found if p is not None)

    def scan(self, partition: int) -> Iterator[tuple[bytes, bytes]]:
        from checkpoint.pagefile import iter_entries  # lower layer; loaded on first use
        path = self.file_for(partition)
        if not os.path.exists(path):
            raise IndexStoreError(f"partition file {path} does not exist")
        for e in iter_entries(path, include_tombstones=False):
            assert e.value is not None       # only a tombstone has no value
            yield e.key, e.value

    def scan_batches(self, partition: int) -> Iterator[list[tuple[bytes, bytes]]]:
        """The same pairs as :meth:`scan`, a read chunk (~2 MiB) at a time: the
        decoder's bulk path, several times cheaper per entry than ``scan``."""
        from checkpoint.pagefile import iter_live_batches  # lower layer; loaded on first use
        path = self.file_for(partition)
        if not os.path.exists(path):
            raise IndexStoreError(f"partition file {path} does not exist")
        return iter_live_batches(path)

    def scan_columns(self, partition: int) -> Iterator[LiveColumns | list[tuple[bytes, bytes]]]:
        """The same pairs for the index feed: what the page accelerator decodes as
        ``LiveColumns`` (keys and values in buffers, no object per pair), the rest in
        lists (``checkpoint.pagefile.iter_live_columns``); the scan rebuild and verify
        use when present."""
        from checkpoint.pagefile import iter_live_columns  # lower layer; loaded on first use
        path = self.file_for(partition)
        if not os.path.exists(path):
            raise IndexStoreError(f"partition file {path} does not exist")
        return iter_live_columns(path, verified=self.verified)


class MemorySource:
    """In-memory partitions ``{partition: {key: value}}`` (tests, tools)."""

    def __init__(self, data: Mapping[int, Mapping[bytes, bytes]] | None = None) -> None:
        self.data: dict[int, dict[bytes, bytes]] = {p: dict(kv) for p, kv in (data or {}).items()}

    def scan(self, partition: int) -> Iterable[tuple[bytes, bytes]]:
        return iter(self.data.get(partition, {}).items())

    def count(self, partition: int) -> int:
        return len(self.data.get(partition, {}))


EMPTY = MemorySource()
