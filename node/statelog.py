"""The change log of the partition state table (``DATA/states.log``): its framing.

The table is a snapshot (``states.json``, rewritten whole now and then) plus this log
of the changes made since, so a change costs one small append and one fsync however
many partitions the node holds. The log is a sequence of frames::

    u32 LE  length of the body (> 0)
    u32 LE  CRC-32 (zlib) of the body
    body    UTF-8 JSON [[cache, partition, state], ...]: one StateTable.set or set_many

A frame is one durable write: its changes all happen or none does. Frames are
absolute ("partition p of cache c is now S"), so replaying a frame the snapshot
already holds changes nothing: a crash between writing a snapshot and emptying the
log is harmless.

Torn is not corrupt. A crash during an append can leave a frame cut short, a last
frame whose bytes are partly missing (bad CRC) or a tail of zeros (space allocated,
data never written); that tail was never acknowledged and is ignored (and cut off by
the next writer). A bad CRC, or a frame that does not parse, followed by another
whole frame is damage: :class:`LogDamaged` names the offset.
"""
from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from typing import Collection

HEADER = struct.Struct("<II")
# No change set is near this; a length beyond it is a torn or damaged header, and
# refusing it keeps a garbage length from making the reader allocate gigabytes.
MAX_BODY = 64 << 20

Change = tuple[str, int, str]          # (cache, partition, state name)


class LogDamaged(Exception):
    """The log holds a damaged frame before its end (``offset``: where it starts)."""

    def __init__(self, offset: int, why: str) -> None:
        self.offset, self.why = offset, why
        super().__init__(f"offset {offset}: {why}")


@dataclass(frozen=True)
class Decoded:
    frames: list[list[Change]]
    end: int                 # where the last whole frame ends: the log's true length
    torn: int                # bytes past ``end`` (a torn tail), 0 when none


def encode(changes: list[Change]) -> bytes:
    body = json.dumps([[c, p, s] for c, p, s in changes], separators=(",", ":")).encode()
    return HEADER.pack(len(body), zlib.crc32(body)) + body


def decode(buf: bytes, valid_state: Collection[str]) -> Decoded:
    """Every whole frame of ``buf`` in order; a torn tail is reported, not raised."""
    frames: list[list[Change]] = []
    off, n = 0, len(buf)
    while off < n:
        if n - off < HEADER.size:
            break                                      # header cut short
        length, crc = HEADER.unpack_from(buf, off)
        start, stop = off + HEADER.size, off + HEADER.size + length
        if 0 < length <= MAX_BODY and stop > n:
            break                                      # body cut short
        body = buf[start:stop]
        if length == 0 or length > MAX_BODY or zlib.crc32(body) != crc:
            if stop >= n or not any(buf[off:]):
                break                                  # the last frame, or zeros to the end
            raise LogDamaged(off, f"bad frame (length {length}, checksum mismatch) with "
                                  f"{n - stop} bytes after it")
        frames.append(_parse(body, off, valid_state))
        off = stop
    return Decoded(frames, off, n - off)


def _parse(body: bytes, off: int, valid_state: Collection[str]) -> list[Change]:
    try:
        items = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise LogDamaged(off, f"frame body is not JSON ({e})") from None
    if not isinstance(items, list) or not items:
        raise LogDamaged(off, "frame body is not a non-empty list of changes")
    out: list[Change] = []
    for it in items:
        if not (isinstance(it, list) and len(it) == 3 and isinstance(it[0], str)
                and type(it[1]) is int and it[1] >= 0 and isinstance(it[2], str)
                and it[2] in valid_state):
            raise LogDamaged(off, f"{it!r} is not [CACHE, PARTITION, STATE]")
        out.append((it[0], it[1], it[2]))
    return out
