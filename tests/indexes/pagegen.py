"""Partition files for tests and benchmarks, written fast and directly with the
checkpoint package's own page code (``page.new_page``/``page.insert``) and layout
(``checkpoint.layout``: entry size, flags, page types, meta page, seal): no node, no
WAL, no page memory. Values must be inline (no overflow chains); the format itself
lives only in ``checkpoint``.

A test helper, not production code (it was ``indexes/testing.py``). Tests import it as
``pagegen`` (tests/indexes is on their path), benchmarks as ``tests.indexes.pagegen``.
"""
from __future__ import annotations

import os
from typing import Iterable

from checkpoint import layout
from checkpoint import page as pg
from faults import fileio


def write_partition_file(path: str, partition: int, items: Iterable[tuple[bytes, bytes | None]],
                         *, page_size: int = 4096, counter: int | None = None) -> int:
    """Write ``items`` (value None: a tombstone) as partition file ``path``; returns
    the number of entries. Atomic (temp file, fsync, rename)."""
    io = fileio.layer()
    tmp = path + ".tmp"
    fd = io.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    n = 0
    try:
        index = 1
        buf = pg.new_page(index, page_size, layout.PageType.DATA)
        free = pg.free_bytes(buf)
        limit = pg.inline_limit(page_size)
        os.lseek(fd, page_size, os.SEEK_SET)
        for key, value in items:
            n += 1
            flags = layout.F_TOMBSTONE if value is None else 0
            stored = b"" if value is None else value
            if layout.entry_size(len(key), len(stored)) > limit:
                raise ValueError(f"entry of key {key!r} too big for an inline test entry")
            got = pg.insert(buf, free, flags, key, n, len(stored), stored)
            if got is None:
                layout.seal(buf)
                fileio.write_all(fd, buf, tmp, io=io)
                index += 1
                buf = pg.new_page(index, page_size, layout.PageType.DATA)
                free = pg.free_bytes(buf)
                got = pg.insert(buf, free, flags, key, n, len(stored), stored)
                assert got is not None
            free -= got[1]
        layout.seal(buf)
        fileio.write_all(fd, buf, tmp, io=io)
        meta = layout.encode_meta(partition, page_size, index + 1,
                                  n if counter is None else counter)
        io.pwrite(fd, meta, 0)
        io.fsync(fd)
    finally:
        io.close(fd)
    io.replace(tmp, path)
    io.fsync_dir(os.path.dirname(os.path.abspath(path)))
    return n
