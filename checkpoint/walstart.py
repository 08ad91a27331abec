"""Where a store's recovery starts reading its node WAL (the file ``wal.start``).

The WAL keeps whole segments (64 MiB by default) until a later checkpoint reclaims
them, so after a crash a segment may hold tens of MiB of records that the last
complete checkpoint already covers. Recovery needs only the records after that
checkpoint's cut: its marker, the undo images above its ``images_from`` and the
updates above its mark. Without a hint it reads the kept segments from their start,
once per pass.

Each checkpoint notes the WAL's end at its cut (:meth:`wal.Wal.position`: segment,
byte offset, CRC chain value and LSN of the next frame; at or before ``min(mark,
images_from) + 1``). Once its marker is durable, the next checkpoint run writes that
position here, and recovery enters the segment there (``Wal.read_from(lsn, at=...)``).

Why that is enough (docs/formats.md, "wal.start"):

- the marker of the hinted checkpoint is after the position, so the last complete
  marker is too: a later one can only be later;
- INSTALL/DROP barriers before the position change nothing recovery does: it rolls
  back images and replays updates above the marker's cut only, and every install and
  drop holds the checkpoint lock until its file is renamed or deleted, so a barrier
  before a checkpoint's cut has its file operation done.

A hint is never required. It is written without fsync (a lost one costs a longer
read), carries a CRC32C, and recovery reads from the segments' start instead when it
is absent, malformed, names a segment the WAL no longer holds, does not continue the
frame at its offset (``wal.PositionMismatch``), or when no marker at or after its
checkpoint is found behind it.
"""
from __future__ import annotations

import os
import struct

from faults import fileio
from faults.crc import crc32c
from wal import Position

NAME = "wal.start"
MAGIC = b"FWS1"
_BODY = struct.Struct("<4sQQQIQ")        # magic, seq, first_lsn, offset, prev_crc, lsn
_CHECK = struct.Struct("<I")


def encode(pos: Position) -> bytes:
    body = _BODY.pack(MAGIC, pos.seq, pos.first_lsn, pos.offset, pos.prev_crc, pos.lsn)
    return body + _CHECK.pack(crc32c(body))


def decode(data: bytes) -> Position | None:
    """The position in ``data``; None when it is not a whole, intact hint."""
    if len(data) != _BODY.size + _CHECK.size:
        return None
    body = data[:_BODY.size]
    if _CHECK.unpack_from(data, _BODY.size)[0] != crc32c(body):
        return None
    magic, seq, first_lsn, offset, prev_crc, lsn = _BODY.unpack(body)
    if magic != MAGIC or lsn < first_lsn:
        return None
    return Position(seq, first_lsn, offset, prev_crc, lsn)


def read(directory: str) -> Position | None:
    """The hint of the store in ``directory``, None when there is no usable one."""
    try:
        fd = os.open(os.path.join(directory, NAME), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return decode(os.read(fd, _BODY.size + _CHECK.size + 1))
    except OSError:
        return None
    finally:
        os.close(fd)


def write(directory: str, pos: Position) -> None:
    """Replace the hint (``fileio.atomic_write``: a reader sees the old or the new one
    whole). Not fsynced: see the module doc."""
    fileio.atomic_write(os.path.join(directory, NAME), encode(pos), durable=False)
