"""Decoding frames from a buffer, and telling a torn tail from corruption.

:func:`decode_block` is the readers' hot loop (one ``unpack_from``, one payload slice and
one tuple per record, and for format version 2 one CRC call per run of frames rather
than per frame; no syscalls: callers hand it big blocks, it returns a list). It
stops at the first frame it cannot accept and says why in a :class:`BlockState`; the
caller decides whether that means "read more", "torn tail" or "corrupt"
(:func:`tail.classify_tail`), because only the caller knows whether the segment is the
last one and whether the file is still growing.
"""
from __future__ import annotations

import functools
from array import array
from itertools import accumulate, repeat
from operator import itemgetter
from struct import error as struct_error

from faults.crc import crc32c

from .blocks import BlockState as BlockState, RawRecord as RawRecord, Stop as Stop  # re-exported
from .decoder_v1 import decode_block_v1
from .format import (CHECK, CHECK_SIZE, FLAG_BATCH, HEAD3, HEAD_SIZE, VERSION,
                     batch_lengths, mix)


class Record(tuple[int, int, bytes]):
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


# A Record from a plain tuple in one C call (no Python frame): replay maps it over
# decoded batches.
as_record = functools.partial(tuple.__new__, Record)


def decode_block(buf: bytes, off: int, crc: int, lsn: int, state: BlockState,
                 min_lsn: int = 0, version: int = VERSION) -> list[RawRecord]:
    """The valid records of ``buf`` from ``off`` on whose LSN is >= ``min_lsn``, as a
    list of plain ``(lsn, type, payload)`` tuples (earlier ones are checked, not kept).
    ``crc`` is the chain value the frame at ``off`` continues from; ``state`` then holds
    where and why the scan stopped, and the chain value there. ``version`` is the
    segment's frame format (its header says which)."""
    if version >= 2:
        return _decode_v2(buf, off, crc, lsn, state, min_lsn, version >= 3)
    return decode_block_v1(buf, off, crc, lsn, state, min_lsn)


def _decode_v2(buf: bytes, off: int, chain: int, lsn: int, state: BlockState,
               min_lsn: int, batches: bool) -> list[RawRecord]:
    """Versions 2 and 3: walk the frames without checking them (one ``unpack_from``,
    one payload slice and one tuple per record), then check the whole run with ONE
    CRC32C call against the last frame's check. Only when that fails is the run decoded
    again frame by frame (:func:`_decode_v2_each`), to stop at exactly the bad frame.
    A batch frame (version 3, ``batches``) is expanded into its records with C-level
    calls only (:func:`_expand`); in version 2 any flags are a bad frame.

    The walk still compares each LSN with the next expected one (cheap, and it keeps
    the result identical to the frame-by-frame loop even for a file whose chain is
    intact but whose LSNs are not, i.e. a writer bug). The end of the buffer is found by
    ``unpack_from`` raising (free in 3.11 unless it raises); the ``min_lsn`` test lives
    in a loop of its own for the skipped prefix (see version 1 for the measurements).
    That loop leaves a batch frame that reaches ``min_lsn`` to the main loop, which
    drops the batch's records below it; whatever else stops the first loop stops the
    second at the same frame."""
    unpack = HEAD3.unpack_from
    hs = HEAD_SIZE
    limit = len(buf) - CHECK_SIZE        # a payload must end by here: its check follows
    start, lsn0 = off, lsn
    out: list[RawRecord] = []
    keep = out.append
    while lsn < min_lsn:
        try:
            length, flsn, typ, flags = unpack(buf, off)
        except struct_error:        # fewer than a head's bytes left
            break
        end = off + hs + length
        if end > limit or flsn != lsn:
            break
        if flags:
            lens = _lengths(buf, off + hs, end, flags, batches)
            if lens is None or lsn + len(lens) > min_lsn:
                break
            lsn += len(lens)
        else:
            lsn += 1
        off = end + 4
    while True:
        try:
            length, flsn, typ, flags = unpack(buf, off)
        except struct_error:
            break
        p = off + hs
        end = p + length
        if end > limit or flsn != lsn:
            break
        if flags:
            lens = _lengths(buf, p, end, flags, batches)
            if lens is None:
                break
            recs = _expand(buf, p + 4 + 4 * len(lens), lens, flsn, typ)
            out += recs[min_lsn - flsn:] if flsn < min_lsn else recs
            lsn += len(lens)
        else:
            keep((flsn, typ, buf[p:end]))
            lsn += 1
        off = end + 4
    if off > start:
        mv = memoryview(buf)
        v = crc32c(mv[start:off - 4], chain)
        if _mix(v) != _check_at(buf, off - 4)[0]:
            return _decode_v2_each(buf, start, chain, lsn0, state, min_lsn, batches)
        chain = crc32c(mv[off - 4:off], v)
    _stop_v2(buf, off, chain, lsn, state, batches)
    return out


def _lengths(buf: bytes, p: int, end: int, flags: int, batches: bool) -> array[int] | None:
    """The record lengths of a frame with ``flags``, or None when it is not a valid
    batch frame (unknown flags, flags in a version-2 segment, a malformed body)."""
    if flags != FLAG_BATCH or not batches:
        return None
    return batch_lengths(buf, p, end)


def _expand(buf: bytes, q: int, lens: array[int], lsn: int, typ: int) -> list[RawRecord]:
    """The records of a batch frame whose payloads start at ``q``: ``(lsn, type,
    payload)`` tuples built by ``map``/``zip`` over C iterators (no Python-level loop)."""
    ends = list(accumulate(lens, initial=q))
    return list(zip(range(lsn, lsn + len(lens)), repeat(typ),
                    map(buf.__getitem__, map(slice, ends, ends[1:]))))


def _decode_v2_each(buf: bytes, off: int, chain: int, lsn: int, state: BlockState,
                    min_lsn: int, batches: bool) -> list[RawRecord]:
    """Versions 2 and 3 frame by frame: the plain reading of the format, used to find
    the first bad frame of a run whose one-call check failed."""
    unpack = HEAD3.unpack_from
    mv = memoryview(buf)
    limit = len(buf) - CHECK_SIZE
    out: list[RawRecord] = []
    while off + HEAD_SIZE <= len(buf):
        length, flsn, typ, flags = unpack(buf, off)
        p = off + HEAD_SIZE
        end = p + length
        if end > limit:
            break
        v = crc32c(mv[off:end], chain)
        if _mix(v) != _check_at(buf, end)[0] or flsn != lsn:
            break
        if flags:
            lens = _lengths(buf, p, end, flags, batches)
            if lens is None:
                break
            out += [r for r in _expand(buf, p + 4 + 4 * len(lens), lens, flsn, typ)
                    if r[0] >= min_lsn]
            n = len(lens)
        else:
            if flsn >= min_lsn:
                out.append((flsn, typ, buf[p:end]))
            n = 1
        chain = crc32c(mv[end:end + 4], v)
        off = end + 4
        lsn += n
    _stop_v2(buf, off, chain, lsn, state, batches)
    return out


def _stop_v2(buf: bytes, off: int, chain: int, lsn: int, state: BlockState,
             batches: bool) -> None:
    """Fill ``state`` for a version-2/3 scan that stopped at ``off`` (every frame before
    it checked out): why the frame there is not accepted."""
    n = len(buf)
    if off + HEAD_SIZE > n:
        stop = Stop.END if off == n else Stop.SHORT
        frame_end = n + 1 if off < n else n
    else:
        length, flsn, _, flags = HEAD3.unpack_from(buf, off)
        end = off + HEAD_SIZE + length
        frame_end = end + CHECK_SIZE
        if frame_end > n:
            stop = Stop.SHORT
        elif _mix(crc32c(memoryview(buf)[off:end], chain)) != _check_at(buf, end)[0]:
            stop = Stop.BAD_CRC
        elif flsn != lsn:
            stop = Stop.BAD_LSN
        elif flags and _lengths(buf, off + HEAD_SIZE, end, flags, batches) is None:
            stop = Stop.BAD_BODY
        else:
            raise AssertionError("decode_block stopped at a valid frame")
    state.off, state.crc, state.lsn, state.stop, state.frame_end = off, chain, lsn, stop, frame_end


_check_at = CHECK.unpack_from
_mix = mix


def scan(buf: bytes, off: int, crc: int, lsn: int, version: int = VERSION) -> BlockState:
    """Check every frame of ``buf`` from ``off`` without keeping records."""
    state = BlockState()
    decode_block(buf, off, crc, lsn, state, 1 << 64, version)
    return state
