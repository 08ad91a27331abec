"""The layout of a partition page file ``part-<p>.bin``: the one place it is defined.

Standard library and ``crc32c`` (through ``faults.crc``) only (Spark executors import
the decoder, which imports this). The C accelerators take the same numbers from
``csrc/ferry_page_layout.h``, generated from this module (``scripts/page_layout_h.py``;
tests/checkpoint/test_layout.py fails when the committed header differs). Written
out in prose in ``docs/formats.md`` ("Partition page files"):

* fixed-size pages (power of two, 1 KiB..64 KiB, fixed per file); page ``i`` lives at
  byte ``i * page_size``; page 0 is the meta page.
* every page starts with a 16-byte header ``crc u32 | index u32 | type u8 | flags u8 |
  count u16 | aux u32``; ``crc`` is CRC32C of bytes ``[4, page_size)`` of the page.
* the META page holds, after the header, ``magic 8s | version u16 | reserved u16 |
  partition u32 | page_size u32 | page_count u32 | counter u64``.
* DATA pages are slotted: ``count`` u16 slot offsets follow the header (0 = empty
  slot), entries are packed from the end of the page down to ``aux`` (heap start).
  Entry: ``flags u8 | key_len u16 | value_len u32 | counter u64 | key | value``, or
  with the OVERFLOW flag ``... | key | first_overflow_page u32`` (value_len = total).
* OVERFLOW pages hold ``count`` bytes of a value after the header; ``aux`` = next page
  of the chain, 0 at the end.  FREE pages are reusable and hold nothing.
"""
from __future__ import annotations

import enum
import re
import struct
from dataclasses import dataclass
from typing import Callable, NamedTuple

from faults.crc import crc32c

FORMAT_VERSION = 1
MAGIC = b"FERRYPG\x00"
MIN_PAGE_SIZE = 1024
MAX_PAGE_SIZE = 65536             # slot offsets are u16
MAX_VALUE = 16 * 1024 * 1024      # values up to 16 MiB (overflow chains)

HEADER = struct.Struct("<IIBBHI")  # crc, index, type, flags, count, aux
META = struct.Struct("<8sHHIIIQ")  # magic, version, reserved, partition, page_size, page_count, counter
ENTRY = struct.Struct("<BHIQ")     # flags, key_len, value_len, counter
SLOT = struct.Struct("<H")
PTR = struct.Struct("<I")
HDR = HEADER.size                  # 16
META_END = HDR + META.size
OVF_ENTRY = ENTRY.size + PTR.size  # an overflow entry without its key: 19

# Byte offsets of the header fields (HEADER's order), for in-place reads and writes.
OFF_CRC, OFF_INDEX, OFF_TYPE, OFF_FLAGS, OFF_COUNT, OFF_AUX = 0, 4, 8, 9, 10, 12
CRC_FROM = OFF_INDEX               # the CRC covers the page from here to its end
# Byte offsets of the entry fields (ENTRY's order), from the entry's start.
E_FLAGS, E_KEY_LEN, E_VALUE_LEN, E_COUNTER = 0, 1, 3, 7
# Byte offsets of the meta fields (META's order), from the end of the header.
M_MAGIC, M_VERSION, M_RESERVED, M_PARTITION, M_PAGE_SIZE, M_PAGE_COUNT, M_COUNTER = (
    0, 8, 10, 12, 16, 20, 24)

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")


class PageType(enum.IntEnum):
    META = 1
    DATA = 2
    OVERFLOW = 3
    FREE = 4


class EntryFlag(enum.IntFlag):
    TOMBSTONE = 1
    OVERFLOW = 2


# Plain ints for the per-entry hot paths: ``flags & EntryFlag.X`` runs enum's Python
# __and__ and costs microseconds per entry; these are the same values.
F_TOMBSTONE = int(EntryFlag.TOMBSTONE)
F_OVERFLOW = int(EntryFlag.OVERFLOW)
KNOWN_FLAGS = F_TOMBSTONE | F_OVERFLOW
T_META, T_DATA, T_OVERFLOW, T_FREE = (int(t) for t in PageType)


class PageHeader(NamedTuple):
    """The 16-byte header of a page, by name."""
    crc: int
    index: int  # type: ignore[assignment]  # a field may shadow tuple.index; mypy cannot say so
    type: int
    flags: int
    count: int  # type: ignore[assignment]  # shadows tuple.count, as above. DATA: slots; OVERFLOW: payload bytes
    aux: int            # DATA: heap start; OVERFLOW: next page of the chain (0: end)


def read_header(buf: bytes | bytearray | memoryview, offset: int = 0) -> PageHeader:
    return PageHeader._make(HEADER.unpack_from(buf, offset))


# One field of a header, without building the whole tuple (per-page hot paths).
def header_count(buf: bytes | bytearray | memoryview, base: int = 0) -> int:
    count: int = _U16.unpack_from(buf, base + OFF_COUNT)[0]
    return count


def header_aux(buf: bytes | bytearray | memoryview, base: int = 0) -> int:
    aux: int = _U32.unpack_from(buf, base + OFF_AUX)[0]
    return aux


def header_index(buf: bytes | bytearray | memoryview, base: int = 0) -> int:
    index: int = _U32.unpack_from(buf, base + OFF_INDEX)[0]
    return index


def set_count(buf: bytearray, count: int) -> None:
    _U16.pack_into(buf, OFF_COUNT, count)


def set_aux(buf: bytearray, aux: int) -> None:
    _U32.pack_into(buf, OFF_AUX, aux)


def pack_header(buf: bytearray, index: int, ptype: int, count: int = 0, aux: int = 0) -> None:
    """A header with CRC 0 (set by :func:`seal` when the page is written) and no flags."""
    HEADER.pack_into(buf, 0, 0, index, ptype, 0, count, aux)


# unpack_from of a slot directory: (buffer, offset) -> the slots' page offsets
SlotReader = Callable[["bytes | bytearray | memoryview", int], "tuple[int, ...]"]
_SLOT_STRUCTS: dict[int, SlotReader] = {}


def slot_reader(count: int) -> SlotReader:
    """``unpack_from`` of a directory of ``count`` u16 slots at once (counts are few:
    cached)."""
    f = _SLOT_STRUCTS.get(count)
    if f is None:
        f = _SLOT_STRUCTS[count] = struct.Struct(f"<{count}H").unpack_from
    return f


def valid_page_size(n: int) -> bool:
    return MIN_PAGE_SIZE <= n <= MAX_PAGE_SIZE and n & (n - 1) == 0


def entry_size(key_len: int, stored_value_len: int) -> int:
    return ENTRY.size + key_len + stored_value_len


# -- seal and check -----------------------------------------------------------------
def page_crc(buf: bytes | bytearray | memoryview) -> int:
    return crc32c(memoryview(buf)[CRC_FROM:])


def crc_ok(buf: bytes | bytearray | memoryview) -> bool:
    stored: int = _U32.unpack_from(buf, OFF_CRC)[0]
    return stored == page_crc(buf)


def seal(buf: bytearray) -> None:
    """Store the CRC of ``buf`` in its header (done when a page is written)."""
    _U32.pack_into(buf, OFF_CRC, page_crc(buf))


def seal_many(bufs: list[bytearray]) -> None:
    """:func:`seal` for each page of a checkpoint write run, with the per-page call
    overhead hoisted out of the loop (the checkpointer seals every page it writes)."""
    pack, crc, view = _U32.pack_into, crc32c, memoryview
    for buf in bufs:
        pack(buf, OFF_CRC, crc(view(buf)[CRC_FROM:]))


# -- the meta page ------------------------------------------------------------------
@dataclass(frozen=True)
class Meta:
    version: int
    partition: int
    page_size: int
    page_count: int
    counter: int


class MetaFields(NamedTuple):
    """Every field of a meta page's body, as stored (not checked)."""
    magic: bytes
    version: int
    reserved: int
    partition: int
    page_size: int
    page_count: int
    counter: int


def decode_meta(buf: bytes | bytearray | memoryview) -> MetaFields:
    """The meta fields of page 0 (``buf`` holds at least :data:`META_END` bytes)."""
    return MetaFields._make(META.unpack_from(buf, HDR))


def encode_meta(partition: int, page_size: int, page_count: int, counter: int) -> bytearray:
    """A sealed meta page."""
    buf = bytearray(page_size)
    pack_header(buf, 0, PageType.META)
    META.pack_into(buf, HDR, MAGIC, FORMAT_VERSION, 0, partition, page_size, page_count, counter)
    seal(buf)
    return buf


# -- file names ---------------------------------------------------------------------
PART_SUFFIX = ".bin"
_PART_NAME = re.compile(r"part-([0-9]+)\.bin")


def part_name(partition: int) -> str:
    """The file name of partition ``partition``: ``part-<p>.bin``."""
    return f"part-{partition}{PART_SUFFIX}"


def parse_part_name(name: str) -> int | None:
    """The inverse of :func:`part_name`: ``part-12.bin`` -> 12; anything else (temp
    files, deltas, other names) -> None."""
    m = _PART_NAME.fullmatch(name)
    return int(m.group(1)) if m else None


__all__ = [
    "CRC_FROM", "ENTRY", "EntryFlag", "E_COUNTER", "E_FLAGS", "E_KEY_LEN", "E_VALUE_LEN",
    "FORMAT_VERSION", "F_OVERFLOW", "F_TOMBSTONE", "HDR", "HEADER", "KNOWN_FLAGS", "MAGIC",
    "MAX_PAGE_SIZE", "MAX_VALUE", "META", "META_END", "MIN_PAGE_SIZE", "Meta", "MetaFields",
    "OFF_AUX", "OFF_COUNT", "OFF_CRC", "OFF_FLAGS", "OFF_INDEX", "OFF_TYPE", "OVF_ENTRY",
    "PART_SUFFIX", "PTR", "PageHeader", "PageType", "SLOT", "T_DATA", "T_FREE", "T_META",
    "T_OVERFLOW", "crc_ok", "decode_meta", "encode_meta", "entry_size", "header_aux",
    "header_count", "header_index", "pack_header", "page_crc", "parse_part_name",
    "part_name", "read_header", "seal", "seal_many", "set_aux", "set_count",
    "slot_reader", "valid_page_size",
]
