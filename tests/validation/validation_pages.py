"""Writes partition files fast, straight from checkpoint's page functions.

Used where going through ``checkpoint.PartitionStore`` (WAL, page memory,
checkpointer) would cost more than the test is worth: the benchmark's millions of
entries and tests that run before the store exists. Pages come from checkpoint's own
encoders (``page.new_page``/``page.insert``, ``pagefile.seal``/``encode_meta``), so no
format is written here; values must fit inline (no overflow chains).
"""
from __future__ import annotations

import os
from typing import Iterable

from checkpoint import page, pagefile

PAGE_SIZE = 4096


def write_partition(path: str, partition: int,
                    entries: Iterable[tuple[bytes, bytes | None, int]],
                    page_size: int = PAGE_SIZE) -> int:
    """Write ``(key, value or None for a tombstone, counter)`` entries; returns the
    number of pages (meta included)."""
    pages: list[bytearray] = []
    buf = page.new_page(1, page_size, pagefile.PageType.DATA)
    free = page.free_bytes(buf)
    top = 0
    for key, value, counter in entries:
        flags = pagefile.EntryFlag.TOMBSTONE if value is None else 0
        stored = b"" if value is None else value
        top = max(top, counter)
        got = page.insert(buf, free, flags, key, counter, len(stored), stored)
        if got is None:
            pages.append(buf)
            buf = page.new_page(len(pages) + 1, page_size, pagefile.PageType.DATA)
            free = page.free_bytes(buf)
            got = page.insert(buf, free, flags, key, counter, len(stored), stored)
            assert got is not None, "entry larger than a page: use PartitionStore"
        free -= got[1]
    pages.append(buf)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(pagefile.encode_meta(partition, page_size, len(pages) + 1, top))
        for p in pages:
            pagefile.seal(p)
            f.write(p)
    os.replace(tmp, path)
    return len(pages) + 1


def write_node(data_dir: str, cache: str, parts: dict[int, list[tuple[bytes, bytes | None, int]]],
               node_id: str | None = None) -> str:
    """A node data folder ``data_dir/caches/<cache>/part-<p>.bin`` (+ ``node.id``)."""
    folder = os.path.join(data_dir, "caches", cache)
    os.makedirs(folder, exist_ok=True)
    if node_id is not None:
        with open(os.path.join(data_dir, "node.id"), "w") as f:
            f.write(node_id + "\n")
    for p, entries in parts.items():
        write_partition(os.path.join(folder, f"part-{p}.bin"), p, entries)
    return data_dir


def entries(p: int, n: int, *, prefix: str = "k",
            value: str = "v") -> list[tuple[bytes, bytes, int]]:
    """``n`` entries of partition ``p``: key ``k<p>-<i>``, value ``v<i>``, counter i+1."""
    return [(f"{prefix}{p}-{i}".encode(), f"{value}{i}".encode(), i + 1) for i in range(n)]
