"""Telling a torn tail from corruption: :func:`classify_tail`.

A frame that does not check out is a *torn tail* -- an append a crash interrupted,
safe to cut because it was never acknowledged -- only when BOTH hold:

1. it looks like what an interrupted append leaves (a frame head of zeros, a frame
   running past the end of the file, zeros from inside the frame to the end, a bad
   check on the very last frame, a zeroed 512-byte sector inside the frame: a sector
   the disk never wrote, etcd's rule), and
2. nothing that checks out follows it in the segment (:func:`valid_frame_after`).

(The caller adds the third condition: it is the last segment; a segment gets a
successor only after it was fsynced whole.)

Why 2: appends are sequential and an acknowledgement waits for an fsync that covers
every byte written before it. A frame that checks out *after* the damage was written
after the damaged bytes, so if it was ever acknowledged, so were they -- then the
damage is not a write that never reached the disk but bytes changed after they were
written, and cutting there would drop acknowledged records silently. Shape alone
cannot tell: a value of 2000 zero bytes with one byte flipped holds whole zeroed
sectors, exactly like a torn write. So anything else is corruption, to be
looked at (``ferry wal verify``) and cut on purpose (``ferry wal repair``).

"Checks out" here means a frame whose own check holds over its own bytes, seeded by
the chain value its predecessor's stored check stands for; whether the chain from
the start of the segment still reaches it does not matter (it cannot: the damage is
in between). For version 1, whose CRC does not cover the previous check, a frame is
proven by its predecessor's CRC field seeding it. Candidates are found by their LSN
field (a value the rest of the file can hold, found by its top bytes with C-level
searches that skip zero runs whole), then checked with one CRC32C call each.
"""
from __future__ import annotations

import heapq
import re
import struct
from typing import Iterator

from faults.crc import crc32c

from .blocks import BlockState, Stop
from .decoder_v1 import FRAME_SIZE as FRAME_V1_SIZE
from .format import (CHECK, CHECK_SIZE, FLAG_BATCH, FRAME, FRAME_OVERHEAD,
                     HEAD3, HEAD_SIZE, VERSION, mix, unmix)

_SECTOR = 512                  # the smallest unit a disk writes whole (etcd's minSectorSize)
_MIN_RECORD = 4                # bytes a record costs at least (a batch's length field)


def classify_tail(data: bytes, file_offset: int, state: BlockState,
                  version: int = VERSION) -> str | None:
    """For a scan of a segment's bytes ``data`` *up to the end of the file* (where
    ``data[0]`` is at ``file_offset``) that stopped at ``state.off``: None when what
    follows is a torn tail, else the reason it is corruption."""
    if state.stop is Stop.END:
        return None
    shape, why = _shape(data, file_offset, state, version)
    if why is not None:
        return why
    later = valid_frame_after(data, state, version)
    if later is None:
        return None
    q, lsn = later
    if state.stop is Stop.SHORT and shape == _RUNS_PAST_END:
        return (f"frame length runs past the end of the file but valid frames follow "
                f"(LSN {lsn} at offset {file_offset + q}): damaged length field")
    return (f"{shape}, but a valid frame (LSN {lsn}) follows at offset {file_offset + q}: "
            "the bytes were damaged after they were written, not torn by a crash (records "
            "after them were written later and may have been acknowledged)")


_RUNS_PAST_END = "frame runs past the end of the file"


def _shape(data: bytes, file_offset: int, state: BlockState,
           version: int) -> tuple[str, str | None]:
    """(what the bad frame looks like, None) when it looks like an interrupted append;
    (_, reason) when it is corruption whatever follows."""
    off = state.off
    head = HEAD_SIZE if version >= 2 else FRAME_V1_SIZE
    if not any(data[off:off + head]):
        # A frame head of zeros: a write that never reached the disk (a hole the file
        # system left, or preallocated space).
        return "frame head of zeros", None
    if state.stop is Stop.BAD_LSN:
        return "", f"frame holds LSN out of order (expected {state.lsn})"
    if state.stop is Stop.BAD_BODY:
        return "", ("frame has unknown flags, or a batch frame whose record lengths do not "
                    "add up to its size (written that way: not a torn write)")
    if state.stop is Stop.SHORT:
        return _RUNS_PAST_END, None
    if state.frame_end >= len(data):
        return "CRC mismatch in the last frame of the file", None
    if len(data.rstrip(b"\0")) < state.frame_end:
        # Zeros from inside this frame to the end of the file: the tail of the file was
        # allocated but never written.
        return "CRC mismatch, zeros from inside the frame to the end of the file", None
    # Sector-aligned (in file terms) zero chunks inside the bad frame: a sector the
    # disk never wrote -- or a run of zeros in a payload with a byte flipped elsewhere.
    start = off + (-(file_offset + off)) % _SECTOR
    zero = bytes(_SECTOR)
    for s in range(start, min(state.frame_end, len(data)) - _SECTOR + 1, _SECTOR):
        if data[s:s + _SECTOR] == zero:
            return f"CRC mismatch in a frame holding a zeroed sector (offset {file_offset + s})", None
    return "", "CRC mismatch (record damaged after it was written)"


def valid_frame_after(data: bytes, state: BlockState,
                      version: int = VERSION) -> tuple[int, int] | None:
    """``(offset in data, LSN)`` of a frame after the bad frame at ``state.off`` that
    checks out on its own (see the module doc; the first one the search meets), or
    None."""
    if version >= 2:
        return _after_v2(data, state, version >= 3)
    return _after_v1(data, state)


def _after_v2(data: bytes, state: BlockState, batches: bool) -> tuple[int, int] | None:
    off, n = state.off, len(data)
    mv = memoryview(data)
    # The frame right after the bad one, where its length field says. It continues
    # from the bad frame's check as stored (the damage is before the check) or as it
    # should be (the damage is in the check: the head and payload still give v).
    if off + HEAD_SIZE <= n:
        end = off + HEAD_SIZE + HEAD3.unpack_from(data, off)[0]
        q = end + CHECK_SIZE
        if q + FRAME_OVERHEAD <= n:
            v = crc32c(mv[off:end], state.crc)
            seeds = (crc32c(mv[end:q], unmix(CHECK.unpack_from(data, end)[0])),
                     crc32c(CHECK.pack(mix(v)), v))
            for seed in seeds:
                if _frame_ok_v2(data, mv, q, seed, batches):
                    return q, HEAD3.unpack_from(data, q)[1]
    # Anywhere after its start (its length field may be what was damaged): a frame
    # seeded by the check stored just before it.
    for q in _candidates(data, off + 1, state.lsn, 4):
        if q >= CHECK_SIZE:
            seed = crc32c(mv[q - CHECK_SIZE:q], unmix(CHECK.unpack_from(data, q - CHECK_SIZE)[0]))
            if _frame_ok_v2(data, mv, q, seed, batches):
                return q, HEAD3.unpack_from(data, q)[1]
    return None


def _frame_ok_v2(data: bytes, mv: memoryview, q: int, seed: int, batches: bool) -> bool:
    if q + FRAME_OVERHEAD > len(data):
        return False
    length, _, _, flags = HEAD3.unpack_from(data, q)
    if flags and (flags != FLAG_BATCH or not batches):
        return False             # never written by a writer of this version
    end = q + HEAD_SIZE + length
    if end + CHECK_SIZE > len(data):
        return False
    check: int = CHECK.unpack_from(data, end)[0]
    return mix(crc32c(mv[q:end], seed)) == check


def _after_v1(data: bytes, state: BlockState) -> tuple[int, int] | None:
    off, n = state.off, len(data)
    mv = memoryview(data)
    if off + FRAME_V1_SIZE <= n:
        fcrc, length, _, _ = FRAME.unpack_from(data, off)
        q = off + FRAME_V1_SIZE + length
        if q <= n:
            for seed in (fcrc, crc32c(mv[off + 4:q], state.crc)):
                if _frame_ok_v1(data, mv, q, seed):
                    return q, FRAME.unpack_from(data, q)[2]
    # A v1 frame's CRC is seeded by its predecessor's CRC field, which sits at the
    # predecessor's start: a frame is proven by a candidate frame that ends where it
    # begins.
    for p in _candidates(data, off + 1, state.lsn, 8):
        fcrc, length, _, _ = FRAME.unpack_from(data, p)
        q = p + FRAME_V1_SIZE + length
        if _frame_ok_v1(data, mv, q, fcrc):
            return q, FRAME.unpack_from(data, q)[2]
    return None


def _frame_ok_v1(data: bytes, mv: memoryview, q: int, seed: int) -> bool:
    if q + FRAME_V1_SIZE > len(data):
        return False
    fcrc: int
    length: int
    fcrc, length, _, _ = FRAME.unpack_from(data, q)
    end = q + FRAME_V1_SIZE + length
    return end <= len(data) and crc32c(mv[q + 4:end], seed) == fcrc


def _candidates(data: bytes, start: int, lsn: int, lsn_at: int) -> Iterator[int]:
    """Offsets ``q >= start``, in order, of every place whose LSN field (at ``q +
    lsn_at``) holds an LSN the rest of the file could hold: ``lsn`` up to one record
    per ``_MIN_RECORD`` bytes after it."""
    lo = lsn
    hi = min(lsn + (len(data) - start) // _MIN_RECORD + 1, (1 << 64) - 1)
    limit = len(data) - FRAME_V1_SIZE        # the smallest frame must fit after q
    streams = [_lsn_fields(data, start + lsn_at, high, lo, hi)
               for high in range(lo >> 24, (hi >> 24) + 1)]
    for p in (heapq.merge(*streams) if len(streams) > 1 else streams[0]):
        if p - lsn_at > limit:
            return
        yield p - lsn_at


_ZERO_RUN = re.compile(b"\x00\x00\x00\x00\x00+")     # literal prefix: a fast search
_LSN = struct.Struct("<Q")


def _lsn_fields(data: bytes, start: int, high: int, lo: int, hi: int) -> Iterator[int]:
    """Offsets ``p >= start``, in order, of the u64 fields in ``lo .. hi`` whose top
    five bytes hold ``high`` (the value >> 24). Found by those five bytes with C-level
    searches, so a megabyte of payload costs microseconds: ``high`` > 0 is a literal
    needle; ``high`` == 0 means five zero bytes, found as maximal runs of zeros (one
    match per run, however long), the field starting 1 to 3 bytes before its run."""
    unpack = _LSN.unpack_from
    if high:
        needle = high.to_bytes(5, "little")
        at = data.find(needle, start + 3)
        while at >= 0:
            if lo <= unpack(data, at - 3)[0] <= hi:
                yield at - 3
            at = data.find(needle, at + 1)
        return
    for m in _ZERO_RUN.finditer(data, start):
        a, b = m.span()
        for p in (a - 3, a - 2, a - 1):
            if p >= start and p + 8 <= b and lo <= unpack(data, p)[0] <= hi:
                yield p


__all__ = ["classify_tail", "valid_frame_after"]
