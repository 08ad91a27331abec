"""The version-1 frame loop (segments written before format version 2; still read).

Version 1 puts each frame's CRC in front of the bytes it covers, so a run of frames
cannot be checked with one CRC call: this loop makes one call per frame. Same contract
as :func:`decoder.decode_block` (which dispatches here for version-1 segments).
"""
from __future__ import annotations

from struct import error as struct_error
from faults.crc import crc32c

from .blocks import BlockState, RawRecord, Stop
from .format import CRC_FIELD, FRAME

FRAME_SIZE = FRAME.size      # 20: crc + the head fields


def decode_block_v1(buf: bytes, off: int, crc: int, lsn: int, state: BlockState,
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
    cannot be checked against the chain (format version 2 fixes that)."""
    unpack = FRAME.unpack_from
    mv = memoryview(buf)
    n = len(buf)
    c32 = crc32c
    hs = FRAME_SIZE
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
    if off + FRAME_SIZE > n:
        stop = Stop.END if off == n else Stop.SHORT
        frame_end = n + 1 if off < n else n
    else:
        fcrc, length, flsn, _ = unpack(buf, off)
        frame_end = off + FRAME_SIZE + length
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
