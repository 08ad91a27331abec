"""LEGACY (the first checkpoint format): the double-write file ``<store>/checkpoint.dwb``.

Checkpoints now log undo images to the node WAL instead (checkpointer.py); recovery
still applies a complete double-write file that a crash of the old version left.
What follows describes how that version used it.

Before a checkpoint overwrites any page in place it writes the new images of all
those pages here and fsyncs.  A crash while pages are overwritten can leave torn
pages in partition files; at the next open the complete double-write file is written
over them again, so every page is whole and of the same cut.  A torn double-write
file (crash while it was written) is ignored: partition files were not touched yet.
Pages appended past a file's durable page count are written (and fsynced) before the
double-write file, so a complete double-write file always implies complete appends.
After the checkpoint marker is durable the file is truncated to zero (and fsynced),
so a later install or drop of a partition never sees stale images replayed over it.

Layout (little-endian)::

    magic "FERRYDW\\0" | version u16 | reserved u16 | page_size u32 | count u32 | checkpoint_id u64
    count x (partition u32 | page u32)
    count x page bytes
    crc u32  - CRC32C of everything before it
"""
from __future__ import annotations

import os
import struct
from typing import Iterator

from faults.crc import crc32c

from faults import fileio

MAGIC = b"FERRYDW\x00"
VERSION = 1
_HEAD = struct.Struct("<8sHHIIQ")
_DIR = struct.Struct("<II")
_CRC = struct.Struct("<I")
NAME = "checkpoint.dwb"




def write(path: str, page_size: int, checkpoint_id: int,
          pages: list[tuple[int, int, bytes | bytearray]]) -> None:
    """Write and fsync the images of ``pages`` ((partition, index, bytes))."""
    io = fileio.layer()
    head = _HEAD.pack(MAGIC, VERSION, 0, page_size, len(pages), checkpoint_id)
    directory = b"".join(_DIR.pack(p, i) for p, i, _ in pages)
    fd = io.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        crc = crc32c(head)
        crc = crc32c(directory, crc)
        batch: list[bytes | bytearray] = [head, directory]
        size = len(head) + len(directory)
        for _p, _i, buf in pages:
            crc = crc32c(buf, crc)
            batch.append(buf)
            size += len(buf)
            if size >= 1 << 20:
                fileio.write_all(fd, b"".join(batch), path, io=io)
                batch, size = [], 0
        batch.append(_CRC.pack(crc))
        fileio.write_all(fd, b"".join(batch), path, io=io)
        io.fsync(fd)
    finally:
        io.close(fd)


def read(path: str) -> tuple[int, list[tuple[int, int, bytes]]] | None:
    """(page_size, pages) of a complete double-write file, or None when it is absent,
    empty or torn (the checkpoint that wrote it never touched partition files)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    if len(data) < _HEAD.size + _CRC.size:
        return None
    magic, version, _r, page_size, count, _id = _HEAD.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION:
        return None
    expect = _HEAD.size + count * (_DIR.size + page_size) + _CRC.size
    if len(data) != expect or _CRC.unpack_from(data, expect - 4)[0] != crc32c(
            memoryview(data)[:expect - 4]):
        return None
    pages = []
    body = _HEAD.size + count * _DIR.size
    for n in range(count):
        p, i = _DIR.unpack_from(data, _HEAD.size + n * _DIR.size)
        pages.append((p, i, data[body + n * page_size:body + (n + 1) * page_size]))
    return page_size, pages


def clear(path: str) -> None:
    """Truncate to zero, durably: the images must never be replayed once the
    checkpoint is complete."""
    io = fileio.layer()
    try:
        fd = io.open(path, os.O_WRONLY)
    except FileNotFoundError:
        return
    try:
        io.ftruncate(fd, 0)
        io.fsync(fd)
    finally:
        io.close(fd)


def by_partition(pages: list[tuple[int, int, bytes]]) -> Iterator[tuple[int, list[tuple[int, bytes]]]]:
    out: dict[int, list[tuple[int, bytes]]] = {}
    for p, i, buf in pages:
        out.setdefault(p, []).append((i, buf))
    return iter(sorted(out.items()))
