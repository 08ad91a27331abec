"""The records the partition store writes to the node WAL (payload formats, one place).

Record types are WAL ``type`` values; payloads are little-endian structs:

* UPDATE  ``partition u32 | counter u64 | flags u8 | key_len u16 | key | value``
  (flags bit 0 = remove: no value).  Replayed idempotently by counter.
* MARKER  ``mark_lsn u64 | checkpoint_id u64``: every record with lsn <= mark_lsn is in
  the partition files (written and fsynced) when this record exists.
* INSTALL ``partition u32 | counter u64``: a received file replaced the partition;
  earlier records of that partition are not replayed.
* DROP    ``partition u32``: the partition was deleted; earlier records are not replayed.
"""
from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

_UPDATE = struct.Struct("<IQBH")
_MARKER = struct.Struct("<QQ")
_INSTALL = struct.Struct("<IQ")
_DROP = struct.Struct("<I")
_REMOVE = 1


class RecordType(enum.IntEnum):
    UPDATE = 0x4301
    MARKER = 0x4302
    INSTALL = 0x4303
    DROP = 0x4304


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


def encode_marker(mark_lsn: int, checkpoint_id: int) -> bytes:
    return _MARKER.pack(mark_lsn, checkpoint_id)


def decode_marker(payload: bytes) -> tuple[int, int]:
    return _MARKER.unpack_from(payload, 0)


def encode_install(partition: int, counter: int) -> bytes:
    return _INSTALL.pack(partition, counter)


def encode_drop(partition: int) -> bytes:
    return _DROP.pack(partition)


def record_partition(payload: bytes) -> int:
    """The partition of an UPDATE, INSTALL or DROP record (all start with it)."""
    return _DROP.unpack_from(payload, 0)[0]
