"""Changes to pages held in page memory (bytearrays in the layout of :mod:`.pagefile`).

Only this module writes page bytes (besides the meta page, encoded in pagefile): new
pages, slotted insert/delete/compact of DATA pages, overflow pages.  CRCs are not kept
up to date here; the checkpointer seals each page when it writes it.
"""
from __future__ import annotations

from .pagefile import (ENTRY, F_OVERFLOW, F_TOMBSTONE, HDR, HEADER, PTR, SLOT, EntryFlag,
                       PageType, entry_size, page_entries)

# Header byte ranges changed in place: count [10:12], aux [12:16] (see pagefile.HEADER).
_PACK_SLOT = SLOT.pack_into
_UNPACK_SLOT = SLOT.unpack_from


def new_page(index: int, page_size: int, ptype: PageType, buf: bytearray | None = None) -> bytearray:
    """A new empty page, built in ``buf`` (a reused buffer) when given."""
    if buf is None:
        buf = bytearray(page_size)
    else:
        buf[:] = _zeros(page_size)                      # in place: same length
    aux = page_size if ptype == PageType.DATA else 0     # DATA: empty heap starts at the end
    HEADER.pack_into(buf, 0, 0, index, ptype, 0, 0, aux)
    return buf


def overflow_page(index: int, page_size: int, payload: bytes | memoryview, nxt: int,
                  buf: bytearray | None = None) -> bytearray:
    # Header, payload, zeros after it: every byte written once (no zeroing first).
    if buf is None:
        buf = bytearray(page_size)
    end = HDR + len(payload)
    HEADER.pack_into(buf, 0, 0, index, PageType.OVERFLOW, 0, len(payload), nxt)
    buf[HDR:end] = payload
    if end < page_size:
        buf[end:] = _zeros(page_size - end)
    return buf


_ZEROS: dict[int, bytes] = {}


def _zeros(n: int) -> bytes:
    z = _ZEROS.get(n)
    if z is None:
        z = _ZEROS[n] = bytes(n)
    return z


def overflow_next(buf: bytearray) -> int:
    return HEADER.unpack_from(buf, 0)[5]


def inline_limit(page_size: int) -> int:
    """Largest entry (header+key+value) stored inline; bigger values go to overflow pages.
    Half a page keeps at least two entries per page (so replacing one in place usually
    fits) while values up to ~2 KiB of a 4 KiB page do not waste a whole overflow page."""
    return (page_size - HDR) // 2 - SLOT.size


def max_key(page_size: int) -> int:
    return inline_limit(page_size) - ENTRY.size - PTR.size


def free_bytes(buf: bytearray) -> int:
    """Bytes an insert may use after compaction (empty slots count as reusable)."""
    page_size = len(buf)
    count = HEADER.unpack_from(buf, 0)[4]
    used = HDR + SLOT.size * count
    for _s, flags, key, _c, vlen, _w in page_entries(buf):
        used += entry_size(len(key), PTR.size if flags & F_OVERFLOW else vlen)
    return page_size - used


def read_entry(buf: bytearray, slot: int) -> tuple[int, int, int, int, int]:
    """(flags, counter, value_len, value_offset_or_first_overflow, entry_size)."""
    (off,) = _UNPACK_SLOT(buf, HDR + 2 * slot)
    flags, klen, vlen, counter = ENTRY.unpack_from(buf, off)
    at = off + ENTRY.size + klen
    if flags & F_OVERFLOW:
        return flags, counter, vlen, PTR.unpack_from(buf, at)[0], ENTRY.size + klen + PTR.size
    return flags, counter, vlen, at, ENTRY.size + klen + vlen


def delete(buf: bytearray, slot: int, size: int) -> int:
    """Empty ``slot`` (its entry of ``size`` bytes becomes garbage until compaction);
    returns the bytes that became reusable."""
    _PACK_SLOT(buf, HDR + 2 * slot, 0)
    count = HEADER.unpack_from(buf, 0)[4]
    freed = size
    if slot == count - 1:               # trim trailing empty slots so the directory shrinks
        while count and _UNPACK_SLOT(buf, HDR + 2 * (count - 1))[0] == 0:
            count -= 1
            freed += SLOT.size
        buf[10:12] = count.to_bytes(2, "little")
    return freed


def insert(buf: bytearray, free: int, flags: int, key: bytes, counter: int, vlen: int,
           stored: bytes | memoryview) -> tuple[int, int] | None:
    """Add an entry; returns (slot, bytes used), or None when the page lacks room.
    ``free`` is the page's :func:`free_bytes` (kept by the caller so no scan is needed)."""
    size = ENTRY.size + len(key) + len(stored)
    count = HEADER.unpack_from(buf, 0)[4]
    slot = _empty_slot(buf, count)
    need = size + (SLOT.size if slot is None else 0)
    if need > free:
        return None
    heap = int.from_bytes(buf[12:16], "little")
    dir_end = HDR + SLOT.size * (count + (slot is None))
    if heap - dir_end < size:
        heap = compact(buf)
    off = heap - size
    ENTRY.pack_into(buf, off, flags, len(key), vlen, counter)
    k0 = off + ENTRY.size
    buf[k0:k0 + len(key)] = key
    buf[k0 + len(key):off + size] = stored
    if slot is None:
        slot = count
        buf[10:12] = (count + 1).to_bytes(2, "little")
    _PACK_SLOT(buf, HDR + 2 * slot, off)
    buf[12:16] = off.to_bytes(4, "little")              # aux = heap start
    return slot, need


def _empty_slot(buf: bytearray, count: int) -> int | None:
    """The first slot whose offset is 0 (its entry was deleted), by a byte search of
    the slot directory instead of one unpack per slot: a page of small entries (e.g.
    overflow pointers) has a hundred slots or more. A match at an odd position is the
    high byte of one offset (< 256) next to the low byte of the next: skipped."""
    end = HDR + 2 * count
    i = buf.find(b"\0\0", HDR, end)
    while i >= 0:
        if not (i - HDR) & 1:
            return (i - HDR) >> 1
        i = buf.find(b"\0\0", i + 1, end)
    return None


def compact(buf: bytearray) -> int:
    """Pack live entries at the end of the page (slots keep their numbers, so the key
    index stays valid); zero the gap; return the new heap start."""
    page_size = len(buf)
    count = HEADER.unpack_from(buf, 0)[4]
    live: list[tuple[int, bytes]] = []
    for s in range(count):
        (off,) = _UNPACK_SLOT(buf, HDR + 2 * s)
        if off:
            _f, _c, _v, _w, size = read_entry(buf, s)
            live.append((s, bytes(buf[off:off + size])))
    heap = page_size
    for s, data in live:
        heap -= len(data)
        buf[heap:heap + len(data)] = data
        _PACK_SLOT(buf, HDR + 2 * s, heap)
    dir_end = HDR + SLOT.size * count
    buf[dir_end:heap] = bytes(heap - dir_end)
    buf[12:16] = heap.to_bytes(4, "little")
    return heap
