"""The WAL's on-disk format, in one place: segment names, segment header, frames.

Written out in prose in ``docs/formats.md`` ("Write-ahead log"). Summary:

* A segment file is named ``<seq:016x>-<first_lsn:016x>.wal``; :func:`parse_segment_name`
  is the exact inverse of :func:`segment_name` (lower-case hex, 16 digits each, nothing
  else), so a name that does not round-trip is not a segment.
* It starts with a 32-byte header: magic ``FWAL``, format version, flags, sequence,
  first LSN, the CRC the chain continues from, and a CRC32C of the header itself.
* Then frames, back to back, no padding::

      crc u32 | length u32 | lsn u64 | type u16 | reserved u16 (0) | payload[length]

  ``crc`` is CRC32C over the frame from ``length`` to the end of the payload, seeded
  with the previous frame's ``crc`` (the header's ``prev_crc`` for a segment's first
  frame). The chain is a running CRC: a frame is only valid after all before it.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Iterable, Sequence

from crc32c import crc32c

MAGIC = b"FWAL"
VERSION = 1

# The header has its own CRC so a flipped bit in it is caught before its fields
# (first LSN, chain seed) are trusted.
HEADER = struct.Struct("<4sHHQQII")          # magic, version, flags, seq, first_lsn, prev_crc, crc
HEADER_SIZE = HEADER.size                     # 32
_HEADER_BODY = struct.Struct("<4sHHQQI")      # the part the header CRC covers

FRAME = struct.Struct("<IIQH2x")              # crc, length, lsn, type (+2 reserved zero bytes)
FRAME_HEADER_SIZE = FRAME.size                # 20
FRAME_REST = struct.Struct("<IQH2x")         # what the CRC covers before the payload
CRC_FIELD = struct.Struct("<I")

MAX_TYPE = 0xFFFF
MAX_PAYLOAD = 0xFFFFFFFF                      # u32 length; 4 GiB - 1

SUFFIX = ".wal"
TMP_SUFFIX = ".tmp"
_NAME = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})\.wal$")


def segment_name(seq: int, first_lsn: int) -> str:
    return f"{seq:016x}-{first_lsn:016x}{SUFFIX}"


def parse_segment_name(name: str) -> tuple[int, int] | None:
    """``(seq, first_lsn)`` of a segment file name, or None when it is not one."""
    m = _NAME.match(name)
    if m is None:
        return None
    return int(m.group(1), 16), int(m.group(2), 16)


def looks_like_segment(name: str) -> bool:
    """True for names that claim to be segments (end in ``.wal``) whether or not they
    parse: a file someone renamed by hand must not be ignored silently."""
    return name.endswith(SUFFIX)


@dataclass(frozen=True)
class SegmentHeader:
    seq: int
    first_lsn: int
    prev_crc: int

    def encode(self) -> bytes:
        body = _HEADER_BODY.pack(MAGIC, VERSION, 0, self.seq, self.first_lsn, self.prev_crc)
        return body + CRC_FIELD.pack(crc32c(body))

    @staticmethod
    def decode(data: bytes) -> SegmentHeader | str:
        """The header, or a string saying why ``data`` is not a valid one."""
        if len(data) < HEADER_SIZE:
            return f"segment header is {len(data)} bytes, expected {HEADER_SIZE}"
        magic, version, flags, seq, first_lsn, prev_crc, crc = HEADER.unpack_from(data)
        if magic != MAGIC:
            return f"bad segment magic {magic!r}"
        if crc32c(data[:HEADER_SIZE - 4]) != crc:
            return "segment header CRC mismatch"
        if version != VERSION:
            return f"unsupported segment format version {version} (this build reads {VERSION})"
        if flags != 0:
            return f"unknown segment flags {flags:#x}"
        return SegmentHeader(seq, first_lsn, prev_crc)


def encode_frame(payload: bytes, lsn: int, type: int, prev_crc: int) -> tuple[bytes, int]:
    """One frame and its CRC (the seed of the next frame)."""
    rest = FRAME_REST.pack(len(payload), lsn, type)
    crc = crc32c(payload, crc32c(rest, prev_crc))
    return b"".join((CRC_FIELD.pack(crc), rest, payload)), crc


def encode_frames(payloads: Iterable[bytes], first_lsn: int, type: int, prev_crc: int,
                  out: bytearray) -> tuple[int, int]:
    """Append the frames of ``payloads`` to ``out``; return (count, last crc).

    The hot loop of ``append_many``: locals only, one bytearray, no per-record object
    beyond the packed header (pure Python pays for every attribute lookup here)."""
    pack_rest = FRAME_REST.pack
    pack_crc = CRC_FIELD.pack
    c = crc32c
    crc = prev_crc
    lsn = first_lsn
    for p in payloads:
        rest = pack_rest(len(p), lsn, type)
        crc = c(p, c(rest, crc))
        out += pack_crc(crc)
        out += rest
        out += p
        lsn += 1
    return lsn - first_lsn, crc


def encode_typed_frames(payloads: Sequence[bytes], types: Sequence[int], first_lsn: int,
                        prev_crc: int, out: bytearray) -> tuple[int, int]:
    """:func:`encode_frames` with a type per record (the group-commit queue)."""
    pack_rest = FRAME_REST.pack
    pack_crc = CRC_FIELD.pack
    c = crc32c
    crc = prev_crc
    lsn = first_lsn
    for p, t in zip(payloads, types):
        rest = pack_rest(len(p), lsn, t)
        crc = c(p, c(rest, crc))
        out += pack_crc(crc)
        out += rest
        out += p
        lsn += 1
    return lsn - first_lsn, crc


def check_type(type: int) -> None:
    if not 0 <= type <= MAX_TYPE:
        raise ValueError(f"record type must be in 0..{MAX_TYPE}, got {type}")
