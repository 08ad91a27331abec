"""Decoding frames from a buffer, and telling a torn tail from corruption.

:func:`decode_block` is the readers' hot loop (one ``unpack_from``, one CRC call and one
tuple per record, no syscalls: callers hand it big blocks, it returns a list). It
stops at the first frame it cannot accept and says why in a :class:`BlockState`; the
caller decides whether that means "read more", "torn tail" or "corrupt"
(:func:`classify_tail`), because only the caller knows whether the segment is the last
one and whether the file is still growing.
"""
from __future__ import annotations

import functools
from enum import Enum
from operator import itemgetter

from crc32c import crc32c

import struct
from struct import error as struct_error

from .format import CRC_FIELD, FRAME, FRAME_HEADER_SIZE


class Record(tuple):
    """One log record: ``.lsn``, ``.type``, ``.payload`` (bytes). A tuple underneath
    (``lsn, type, payload``) because building a tuple is the cheapest object Python
    makes, and replay builds a million of them per second."""

    __slots__ = ()
    lsn: int = property(itemgetter(0))          # type: ignore[assignment]
    type: int = property(itemgetter(1))         # type: ignore[assignment]
    payload: bytes = property(itemgetter(2))    # type: ignore[assignment]

    def __new__(cls, lsn: int, type: int, payload: bytes) -> Record:
        return tuple.__new__(cls, (lsn, type, payload))

    def __repr__(self) -> str:
        p = self[2]
        shown = repr(p[:32]) + ("..." if len(p) > 32 else "")
        return f"Record(lsn={self[0]}, type={self[1]}, payload={shown} ({len(p)} B))"


RawRecord = tuple[int, int, bytes]       # (lsn, type, payload): what batches hand out

# A Record from a plain tuple in one C call (no Python frame): replay maps it over
# decoded batches.
as_record = functools.partial(tuple.__new__, Record)


class Stop(Enum):
    END = "end"          # stopped exactly at the end of the buffer
    SHORT = "short"      # a frame header or payload runs past the end of the buffer
    BAD_CRC = "bad_crc"  # a complete frame whose CRC does not match the chain
    BAD_LSN = "bad_lsn"  # a frame with a valid CRC but not the next LSN


class BlockState:
    """Where :func:`iter_block` stopped: offset, chain CRC and next LSN there, and why."""

    __slots__ = ("off", "crc", "lsn", "stop", "frame_end")

    def __init__(self) -> None:
        self.off = 0
        self.crc = 0
        self.lsn = 0
        self.stop = Stop.END
        self.frame_end = 0   # declared end of the frame that stopped the scan


def decode_block(buf: bytes, off: int, crc: int, lsn: int, state: BlockState,
                 min_lsn: int = 0) -> list[RawRecord]:
    """The valid records of ``buf`` from ``off`` on whose LSN is >= ``min_lsn``, as a
    list of plain ``(lsn, type, payload)`` tuples (earlier ones are checked, not kept).
    ``state`` then holds where and why the scan stopped.

    This is the replay hot loop, so it is a flat ``while`` over locals: one
    ``unpack_from``, one CRC32C call, one payload slice and one plain tuple per record
    (building a :class:`Record` here cost a third more: ``as_record`` does it later, in
    C, for callers that want them), and a list instead of a generator (a ``yield`` per
    record through nested generators cost about a third of replay time). Per record it
    pays for nothing else either (together ~7% of decode time): the end of the buffer is
    found by ``unpack_from`` raising (free in 3.11 when nothing raises) instead of a
    comparison, the stop reasons share one condition and are told apart once, after the
    loop, and the ``min_lsn`` test lives in a loop of its own for the skipped prefix.

    The CRC is checked frame by frame: a frame's CRC covers its own bytes *without* the
    CRC fields of the frames before it, so one call over a contiguous run of frames
    cannot be checked against the chain."""
    unpack = FRAME.unpack_from
    mv = memoryview(buf)
    n = len(buf)
    c32 = crc32c
    hs = FRAME_HEADER_SIZE
    cs = CRC_FIELD.size                   # the CRC covers the frame after its own field
    out: list[RawRecord] = []
    keep = out.append
    # Records below min_lsn are checked, not kept: a separate loop, so the keeping loop
    # below tests nothing it does not have to.
    while lsn < min_lsn:
        try:
            fcrc, length, flsn, typ = unpack(buf, off)
        except struct_error:        # fewer than a frame header's bytes left
            break
        end = off + hs + length
        if end > n or c32(mv[off + cs:end], crc) != fcrc or flsn != lsn:
            break
        off = end
        crc = fcrc
        lsn += 1
    else:
        # One test per stop reason would cost a branch each per record; a record
        # that fails any of them is classified once, after the loop.
        while True:
            try:
                fcrc, length, flsn, typ = unpack(buf, off)
            except struct_error:
                break
            p = off + hs
            end = p + length
            if end > n or c32(mv[off + cs:end], crc) != fcrc or flsn != lsn:
                break
            keep((flsn, typ, buf[p:end]))
            off = end
            crc = fcrc
            lsn += 1
    if off + FRAME_HEADER_SIZE > n:
        stop = Stop.END if off == n else Stop.SHORT
        frame_end = n + 1 if off < n else n
    else:
        fcrc, length, flsn, _ = unpack(buf, off)
        frame_end = off + FRAME_HEADER_SIZE + length
        if frame_end > n:
            stop = Stop.SHORT
        elif c32(mv[off + cs:frame_end], crc) != fcrc:
            stop = Stop.BAD_CRC
        elif flsn != lsn:
            stop = Stop.BAD_LSN
        else:       # only min_lsn stopped the first loop: cannot happen (else branch)
            raise AssertionError("decode_block stopped at a valid frame")
    state.off, state.crc, state.lsn, state.stop, state.frame_end = off, crc, lsn, stop, frame_end
    return out


def scan(buf: bytes, off: int, crc: int, lsn: int) -> BlockState:
    """Check every frame of ``buf`` from ``off`` without keeping records."""
    state = BlockState()
    decode_block(buf, off, crc, lsn, state, min_lsn=1 << 64)
    return state


_SECTOR = 512
_LSN = struct.Struct("<Q")


def classify_tail(data: bytes, file_offset: int, state: BlockState) -> str | None:
    """For a scan of a segment's bytes up to its end that stopped at ``state.off``:
    None when what follows is a torn tail (safe to truncate: never fsynced, never
    acknowledged), else the reason it is corruption.

    Torn means what an interrupted append leaves: a short frame (unless valid frames
    provably follow it: then its length field was damaged), a frame header of zeros,
    zeros from inside the bad frame to the end (the file system extended the file but
    never wrote the data), a bad CRC on the very last frame, or a bad frame holding a
    whole zeroed sector (etcd's rule: a sector the disk never wrote). A complete frame
    with a bad CRC and more data after it, or a valid frame out of LSN order, is
    corruption.
    """
    off = state.off
    if state.stop is Stop.END:
        return None
    if not any(data[off:off + FRAME_HEADER_SIZE]):
        # A frame header of zeros: a write that never reached the disk (a hole the file
        # system left, or preallocated space). Appends are sequential and an fsync
        # covers a prefix, so nothing after it was ever acknowledged.
        return None
    if state.stop is Stop.BAD_LSN:
        return f"frame holds LSN out of order (expected {state.lsn})"
    if state.stop is Stop.SHORT:
        # A frame running past the end is what an interrupted append leaves, unless its
        # length field was damaged: then the frames after it are still there.
        later = _chained_frames_after(data, off + FRAME_HEADER_SIZE, state.lsn + 1)
        if later is not None:
            return (f"frame length runs past the end of the file but valid frames follow "
                    f"(LSN {state.lsn + 1} at offset {file_offset + later}): damaged length field")
        return None
    if state.frame_end >= len(data):
        return None
    if len(data.rstrip(b"\0")) < state.frame_end:
        # Zeros from inside this frame to the end of the file: the tail of the file was
        # allocated but never written.
        return None
    # Sector-aligned (in file terms) zero chunks inside the bad frame: a sector the
    # disk never wrote.
    start = off + (-(file_offset + off)) % _SECTOR
    zero = bytes(_SECTOR)
    for s in range(start, min(state.frame_end, len(data)) - _SECTOR + 1, _SECTOR):
        if data[s:s + _SECTOR] == zero:
            return None
    return "CRC mismatch (record damaged after it was written)"


def _chained_frames_after(data: bytes, start: int, lsn: int) -> int | None:
    """Offset of a frame with LSN ``lsn`` after ``start`` that is proven real by the
    frame after it (whose CRC is seeded by this one's), or None. A bare LSN match could
    be payload bytes; a verified chain link cannot, short of a 2**-32 accident."""
    needle = _LSN.pack(lsn)
    at = data.find(needle, start + 8)
    tries = 0
    while at >= 0 and tries < 256:
        q = at - 8
        fcrc, length, _, _ = FRAME.unpack_from(data, q)
        q2 = q + FRAME_HEADER_SIZE + length
        if q2 + FRAME_HEADER_SIZE <= len(data):
            crc2, length2, lsn2, _ = FRAME.unpack_from(data, q2)
            end2 = q2 + FRAME_HEADER_SIZE + length2
            if lsn2 == lsn + 1 and end2 <= len(data) and \
                    crc32c(data[q2 + 4:end2], fcrc) == crc2:
                return q
        at = data.find(needle, at + 1)
        tries += 1
    return None
