"""The records the partition store writes to the node WAL (payload formats, one place).

Record types are WAL ``type`` values; payloads are little-endian structs:

* UPDATE  ``partition u32 | counter u64 | flags u8 | key_len u16 | key | value``
  (flags bit 0 = remove: no value).  Replayed idempotently by counter.
* MARKER  ``mark_lsn u64 | checkpoint_id u64 | images_from u64``: every record with
  lsn <= mark_lsn is in the partition files (written and fsynced) when this record
  exists; IMAGES records with lsn > images_from (the WAL's last lsn at the cut) are
  the undo images of later checkpoints.  A 16-byte marker (format 1, no images_from)
  counts as ``images_from`` = its own lsn: format 1 logged a checkpoint's images
  between its cut and its marker, and they were of the checkpoint before.
* INSTALL ``partition u32 | counter u64``: a received file replaced the partition;
  earlier records of that partition are not replayed.
* DROP    ``partition u32``: the partition was deleted; earlier records are not replayed.
* IMAGES  ``partition u32 | page_size u32 | count u32 | free_count u32 | count x page u32 |
  free_count x page u32 | count x page bytes``: undo images - pages as the last
  checkpoint cut left them, logged at each page's first change after that cut
  (``undo.py``; the meta page by the checkpoint itself), except pages that were FREE,
  which are only listed (``free``: restored as an empty FREE page).  IMAGES records
  with lsn > the last complete MARKER's images_from are written back at open (earliest
  image of a page wins), so every file is exactly as of that marker, then replay.
"""
from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Sequence

_UPDATE = struct.Struct("<IQBH")
_MARKER = struct.Struct("<QQQ")
_MARKER_V1 = struct.Struct("<QQ")
_INSTALL = struct.Struct("<IQ")
_DROP = struct.Struct("<I")
_IMAGES = struct.Struct("<IIII")
_REMOVE = 1


class RecordType(enum.IntEnum):
    UPDATE = 0x4301
    MARKER = 0x4302
    INSTALL = 0x4303
    DROP = 0x4304
    IMAGES = 0x4305


@dataclass(frozen=True)
class Update:
    partition: int
    counter: int
    key: bytes
    value: bytes | None


def encode_update(partition: int, counter: int, key: bytes, value: bytes | None) -> bytes:
    head = _UPDATE.pack(partition, counter, _REMOVE if value is None else 0, len(key))
    return b"".join((head, key, value or b""))


def decode_update(payload: bytes) -> Update:
    partition, counter, flags, klen = _UPDATE.unpack_from(payload, 0)
    k0 = _UPDATE.size
    key = bytes(payload[k0:k0 + klen])
    value = None if flags & _REMOVE else bytes(payload[k0 + klen:])
    return Update(partition, counter, key, value)


def encode_marker(mark_lsn: int, checkpoint_id: int, images_from: int) -> bytes:
    return _MARKER.pack(mark_lsn, checkpoint_id, images_from)


def decode_marker(payload: bytes) -> tuple[int, int, int | None]:
    """(mark_lsn, checkpoint_id, images_from); images_from is None for a format-1
    marker (the caller uses the marker's own lsn)."""
    if len(payload) == _MARKER_V1.size:
        return (*_MARKER_V1.unpack_from(payload, 0), None)
    if len(payload) != _MARKER.size:
        raise ValueError(f"MARKER record of {len(payload)} bytes, expected {_MARKER.size}")
    return _MARKER.unpack_from(payload, 0)


def encode_install(partition: int, counter: int) -> bytes:
    return _INSTALL.pack(partition, counter)


def encode_drop(partition: int) -> bytes:
    return _DROP.pack(partition)


@dataclass(frozen=True)
class Images:
    partition: int
    page_size: int
    pages: list[tuple[int, bytes]]     # (page index, bytes to restore)
    free: list[int]                    # pages to restore as empty FREE pages


def encode_images(partition: int, page_size: int,
                  pages: Sequence[tuple[int, bytes | bytearray | memoryview]],
                  free: list[int]) -> bytes:
    n, f = len(pages), len(free)
    index = struct.pack(f"<{n + f}I", *[i for i, _ in pages], *free)
    return b"".join([_IMAGES.pack(partition, page_size, n, f), index, *[b for _, b in pages]])


def decode_images(payload: bytes) -> Images:
    partition, ps, n, f = _IMAGES.unpack_from(payload, 0)
    idx = struct.unpack_from(f"<{n + f}I", payload, _IMAGES.size)
    body = _IMAGES.size + 4 * (n + f)
    if len(payload) != body + n * ps:
        raise ValueError(f"IMAGES record of {len(payload)} bytes, expected {body + n * ps}")
    pages = [(idx[j], bytes(payload[body + j * ps:body + (j + 1) * ps])) for j in range(n)]
    return Images(partition, ps, pages, list(idx[n:]))


def record_partition(payload: bytes) -> int:
    """The partition of an UPDATE, INSTALL, DROP or IMAGES record (all start with it)."""
    partition: int = _DROP.unpack_from(payload, 0)[0]
    return partition
