"""The WAL's on-disk format, in one place: segment names, segment header, frames.

Written out in prose in ``docs/formats.md`` ("Write-ahead log"). Summary:

* A segment file is named ``<seq:016x>-<first_lsn:016x>.wal``; :func:`parse_segment_name`
  is the exact inverse of :func:`segment_name` (lower-case hex, 16 digits each, nothing
  else), so a name that does not round-trip is not a segment.
* It starts with a 32-byte header: magic ``FWAL``, format version, flags, sequence,
  first LSN, the CRC the chain continues from, and a CRC32C of the header itself.
* Then frames, back to back, no padding. Version 2 (still read)::

      length u32 | lsn u64 | type u16 | reserved u16 (0) | payload[length] | check u32

  The *chain* is the running CRC32C of the segment's frame bytes, seeded with the
  header's ``prev_crc``. ``check`` is ``mix(chain just before check)``, and the chain
  then runs on through ``check``'s own bytes. So a whole run of frames is verified
  with ONE CRC32C call over its bytes (up to the last ``check``) against the last
  ``check``. ``mix`` (:func:`mix`) is a fixed invertible bit mix whose sum with the
  identity is invertible too: storing the plain CRC would bring the running CRC back
  to a constant after every frame (CRC residue), and the chain would forget what came
  before -- with ``mix`` the chain after a frame is a bijection of everything before it,
  so a missing, extra or reordered frame still changes every later check.
* Version 1 (still read; never written now)::

      crc u32 | length u32 | lsn u64 | type u16 | reserved u16 (0) | payload[length]

  ``crc`` is CRC32C over the frame from ``length`` to the end of the payload, seeded
  with the previous frame's ``crc``: one CRC call per frame, as the CRC fields of the
  frames before are not covered.

* Version 3 (written by this build): version 2, whose reserved field is ``flags``.
  ``flags`` 0 is a plain frame (as in version 2); :data:`FLAG_BATCH` a *batch frame*
  (``append_many``, like RocksDB's WriteBatch): ``count`` records with LSNs
  ``lsn .. lsn + count - 1`` and one type, body ``count u32 | lengths u32[count] |
  payloads``. One check covers the batch: after a crash all of it is there or none.

Plain frames spend 20 bytes (:data:`FRAME_OVERHEAD`), a batch frame 24 + 4 per record.
"""
from __future__ import annotations

import re
import struct
import sys
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

from faults.crc import crc32c

if TYPE_CHECKING:
    from typing_extensions import Buffer    # bytes, or a batch frame's array of lengths

MAGIC = b"FWAL"
VERSION = 3                                   # what new segments are written as
READABLE_VERSIONS = (1, 2, 3)

# The header has its own CRC so a flipped bit in it is caught before its fields
# (first LSN, chain seed) are trusted.
HEADER = struct.Struct("<4sHHQQII")          # magic, version, flags, seq, first_lsn, prev_crc, crc
HEADER_SIZE = HEADER.size                     # 32
_HEADER_BODY = struct.Struct("<4sHHQQI")      # the part the header CRC covers

# Version 2: head, payload, check.
HEAD = struct.Struct("<IQH2x")                # length, lsn, type (+2 reserved zero bytes)
HEAD_SIZE = HEAD.size                         # 16
CHECK = struct.Struct("<I")                   # mix(chain) after the payload
CHECK_SIZE = CHECK.size                       # 4
# The previous frame's check and this frame's head, packed in one call (append_many).
CHECK_HEAD = struct.Struct("<IIQH2x")

# Version 3: version 2's frame, whose reserved field became ``flags``. Flags 0: a plain
# frame, byte for byte as in version 2. FLAG_BATCH: a *batch frame* holding ``count``
# records of consecutive LSNs (head.lsn ..) and one type; its payload ("body") is
# count u32 | lengths u32[count] | the payloads back to back (BATCH_HEAD packs the head
# and count together). One frame, one check: all of its records or none.
HEAD3 = struct.Struct("<IQHH")                # length, lsn, type, flags
FLAG_BATCH = 1
BATCH_HEAD = struct.Struct("<IQHHI")          # length, lsn, type, flags, count
BATCH_COUNT = struct.Struct("<I")             # count, first field of a batch body
BATCH_OVERHEAD = HEAD_SIZE + 4 + CHECK_SIZE   # per batch frame; plus 4 bytes per record

# Version 1: crc, then what the crc covers (the same fields as HEAD), then the payload.
FRAME = struct.Struct("<IIQH2x")              # crc, length, lsn, type (+2 reserved zero bytes)
FRAME_REST = HEAD                             # what the v1 CRC covers before the payload
CRC_FIELD = CHECK

FRAME_OVERHEAD = HEAD_SIZE + CHECK_SIZE       # 20 bytes per frame, both versions
FRAME_HEADER_SIZE = FRAME_OVERHEAD            # (old name, kept for callers)

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
    prev_crc: int            # the chain value the segment's first frame continues from
    version: int = VERSION   # frame format of this segment

    def encode(self) -> bytes:
        body = _HEADER_BODY.pack(MAGIC, self.version, 0, self.seq, self.first_lsn,
                                 self.prev_crc)
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
        if version not in READABLE_VERSIONS:
            return (f"unsupported segment format version {version} (this build reads "
                    f"{', '.join(map(str, READABLE_VERSIONS))})")
        if flags != 0:
            return f"unknown segment flags {flags:#x}"
        return SegmentHeader(seq, first_lsn, prev_crc, version)


def mix(v: int) -> int:
    """The check stored for chain value ``v``: the 16-bit halves (hi, lo) become
    (hi ^ lo, hi). Over GF(2) both this map M and M + I are invertible: M so the check
    keeps all 32 bits, M + I so the chain after the check's bytes (``~v ^ M(v)`` fed
    through the CRC) still depends on ``v`` -- storing ``v`` itself (M = I) would
    reset the chain to a constant after every frame. The one spelling of the mix in
    Python (wal/_accel.c has its own for the C frame path; tests/wal/test_accel.py
    checks that the two agree)."""
    h = v >> 16
    return (((h ^ v) & 0xFFFF) << 16) | h


def unmix(g: int) -> int:
    """Inverse of :func:`mix`."""
    lo = g & 0xFFFF
    return (lo << 16) | ((g >> 16) ^ lo)


def encode_frame(payload: bytes, lsn: int, type: int, chain: int) -> tuple[bytes, int]:
    """One version-2 frame and the chain after it (the seed of the next frame)."""
    head = HEAD.pack(len(payload), lsn, type)
    v = crc32c(payload, crc32c(head, chain))
    check = CHECK.pack(mix(v))
    return b"".join((head, payload, check)), crc32c(check, v)


def encode_batch(payloads: Sequence[bytes], first_lsn: int, type: int,
                 chain: int) -> tuple[list[Buffer], int, int]:
    """A version-3 batch frame of ``payloads`` (at least one) as its parts, in file
    order (head with count, lengths, the joined payloads, check); its size; the chain
    after it. Per record this costs only ``len`` (mapped in C) and the join's copy:
    one CRC call over the whole batch. Raises ``OverflowError``/``struct.error`` when
    the batch does not fit one frame (a payload, or the body, above 4 GiB - 1)."""
    lens = array("I", map(len, payloads))
    data = b"".join(payloads)
    if sum(lens) != len(data):
        # a memoryview of wider items (array('i')): len() counts items, not bytes, and
        # the frame's lengths would lie. One sum per batch, not a check per record.
        raise ValueError(f"payloads must have 1-byte items: their lengths add up to "
                         f"{sum(lens)} but they hold {len(data)} bytes; pass bytes, or "
                         "memoryview.cast('B')")
    if not _LITTLE:
        lens.byteswap()
    count = len(lens)
    body = 4 + 4 * count + len(data)
    head = BATCH_HEAD.pack(body, first_lsn, type, FLAG_BATCH, count)
    v = crc32c(data, crc32c(lens, crc32c(head, chain)))
    check = CHECK.pack(mix(v))
    return [head, lens, data, check], body + FRAME_OVERHEAD, crc32c(check, v)


def batch_lengths(buf: bytes, p: int, end: int) -> array[int] | None:
    """The record lengths of the batch body ``buf[p:end]``, or None when the body is
    malformed (count 0, lengths that do not add up to the body)."""
    if end - p < 4:
        return None
    count = BATCH_COUNT.unpack_from(buf, p)[0]
    q = p + 4 + 4 * count
    if count == 0 or q > end:
        return None
    lens = array("I")
    lens.frombytes(buf[p + 4:q])
    if not _LITTLE:
        lens.byteswap()
    if sum(lens) != end - q:
        return None
    return lens


_LITTLE = sys.byteorder == "little"
assert array("I").itemsize == 4


def encode_frame_v1(payload: bytes, lsn: int, type: int, prev_crc: int) -> tuple[bytes, int]:
    """One version-1 frame and its CRC (for tests and tools; the log writes v2)."""
    rest = FRAME_REST.pack(len(payload), lsn, type)
    crc = crc32c(payload, crc32c(rest, prev_crc))
    return b"".join((CRC_FIELD.pack(crc), rest, payload)), crc


def encode_frames(payloads: Iterable[bytes], first_lsn: int, type: int, chain: int,
                  out: bytearray) -> tuple[int, int]:
    """Append the v2 frames of ``payloads`` to ``out``; return (count, chain after).

    The hot loop of ``append_many``: locals only, one bytearray. A frame's check and
    the next frame's head are packed together and fed to the CRC in one call, so a
    record costs what it did in version 1: one pack, two CRC calls (plus the mix)."""
    return encode_typed_frames(payloads, None, first_lsn, chain, out, type)


def encode_typed_frames(payloads: Iterable[bytes], types: Sequence[int] | None,
                        first_lsn: int, chain: int, out: bytearray,
                        type: int = 0) -> tuple[int, int]:
    """:func:`encode_frames` with a type per record (the group-commit queue), or one
    ``type`` for all when ``types`` is None."""
    pack_check_head = CHECK_HEAD.pack
    c, mx = crc32c, mix
    lsn = first_lsn
    it = iter(payloads)
    tt = iter(types) if types is not None else None
    for p in it:
        head = HEAD.pack(len(p), lsn, type if tt is None else next(tt))
        v = c(p, c(head, chain))
        out += head
        out += p
        break
    else:
        return 0, chain
    lsn += 1
    if tt is None:
        for p in it:
            ch = pack_check_head(mx(v), len(p), lsn, type)
            v = c(p, c(ch, v))
            out += ch
            out += p
            lsn += 1
    else:
        for p, t in zip(it, tt):
            ch = pack_check_head(mx(v), len(p), lsn, t)
            v = c(p, c(ch, v))
            out += ch
            out += p
            lsn += 1
    check = CHECK.pack(mix(v))
    out += check
    return lsn - first_lsn, c(check, v)


def check_type(type: int) -> None:
    if not 0 <= type <= MAX_TYPE:
        raise ValueError(f"record type must be in 0..{MAX_TYPE}, got {type}")
