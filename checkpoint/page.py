"""Changes to pages held in page memory (bytearrays in the layout of :mod:`.layout`).

Only this module writes page bytes (besides the meta page, encoded in layout): new
pages, slotted insert/delete/compact of DATA pages, overflow pages.  CRCs are not kept
up to date here; the checkpointer seals each page when it writes it.

The byte work of the write path (:func:`chain_pages`, :func:`new_page`, :func:`insert`,
:func:`delete`, :func:`read_entry`, :func:`compact`) has a C twin, ``checkpoint/_writeaccel.c``, used
when it is built and ``FERRY_PAGE_ACCEL`` (the switch of every checkpoint C path, see
accel.py) does not turn it off. The names of this module are bound to one or the
other (:func:`use_accelerator`); the ``*_py`` functions are the reference, and the C
ones make the same bytes (tests/checkpoint/test_writeaccel.py).
"""
from __future__ import annotations


from .accel import ACCEL_ENV, load_accel
from .decode import page_entries
from .layout import (ENTRY, F_OVERFLOW, HDR, PTR, SLOT, PageType, entry_size, header_aux,
                     header_count, pack_header, set_aux, set_count)

_PACK_SLOT = SLOT.pack_into
_UNPACK_SLOT = SLOT.unpack_from


def new_page_py(index: int, page_size: int, ptype: PageType, buf: bytearray | None = None
                ) -> bytearray:
    """A new empty page, built in ``buf`` (a reused buffer of ``page_size`` bytes) when
    given."""
    if buf is None:
        buf = bytearray(page_size)
    else:
        buf[:] = _zeros(page_size)                      # in place: same length
    aux = page_size if ptype == PageType.DATA else 0     # DATA: empty heap starts at the end
    pack_header(buf, index, ptype, 0, aux)
    return buf


def overflow_page(index: int, page_size: int, payload: bytes | memoryview, nxt: int,
                  buf: bytearray | None = None) -> bytearray:
    # Header, payload, zeros after it: every byte written once (no zeroing first).
    if buf is None:
        buf = bytearray(page_size)
    end = HDR + len(payload)
    pack_header(buf, index, PageType.OVERFLOW, len(payload), nxt)
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


def chain_pages_py(value: bytes | memoryview, page_size: int, indexes: list[int],
                   spare: list[bytearray]) -> list[bytearray]:
    """The OVERFLOW pages holding ``value`` on pages ``indexes`` (each links to the next,
    the last to 0), built in buffers popped from ``spare`` (page memory's pool of
    evicted buffers) while it has any, else new ones."""
    room = page_size - HDR
    count = max(1, -(-len(value) // room))
    if len(indexes) != count:
        raise ValueError(f"chain_pages: a {len(value)}-byte value takes {count} pages of "
                         f"{page_size}, {len(indexes)} page indexes given")
    view = memoryview(value)
    out = []
    for n in range(count):
        buf = spare.pop() if spare else bytearray(page_size)
        nxt = indexes[n + 1] if n + 1 < count else 0
        out.append(overflow_page(indexes[n], page_size, view[n * room:(n + 1) * room], nxt, buf))
    return out


def overflow_next(buf: bytearray) -> int:
    return header_aux(buf)


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
    count = header_count(buf)
    used = HDR + SLOT.size * count
    for _s, flags, key, _c, vlen, _w in page_entries(buf):
        used += entry_size(len(key), PTR.size if flags & F_OVERFLOW else vlen)
    return page_size - used


def read_entry_py(buf: bytearray, slot: int) -> tuple[int, int, int, int, int]:
    """(flags, counter, value_len, value_offset_or_first_overflow, entry_size)."""
    (off,) = _UNPACK_SLOT(buf, HDR + 2 * slot)
    flags, klen, vlen, counter = ENTRY.unpack_from(buf, off)
    at = off + ENTRY.size + klen
    if flags & F_OVERFLOW:
        return flags, counter, vlen, PTR.unpack_from(buf, at)[0], ENTRY.size + klen + PTR.size
    return flags, counter, vlen, at, ENTRY.size + klen + vlen


def delete_py(buf: bytearray, slot: int, size: int) -> int:
    """Empty ``slot`` (its entry of ``size`` bytes becomes garbage until compaction);
    returns the bytes that became reusable."""
    _PACK_SLOT(buf, HDR + 2 * slot, 0)
    count = header_count(buf)
    freed = size
    if slot == count - 1:               # trim trailing empty slots so the directory shrinks
        while count and _UNPACK_SLOT(buf, HDR + 2 * (count - 1))[0] == 0:
            count -= 1
            freed += SLOT.size
        set_count(buf, count)
    return freed


def insert_py(buf: bytearray, free: int, flags: int, key: bytes, counter: int, vlen: int,
           stored: bytes | memoryview) -> tuple[int, int] | None:
    """Add an entry; returns (slot, bytes used), or None when the page lacks room.
    ``free`` is the page's :func:`free_bytes` (kept by the caller so no scan is needed)."""
    size = ENTRY.size + len(key) + len(stored)
    count = header_count(buf)
    slot = _empty_slot(buf, count)
    need = size + (SLOT.size if slot is None else 0)
    if need > free:
        return None
    heap = header_aux(buf)
    dir_end = HDR + SLOT.size * (count + (slot is None))
    if heap - dir_end < size:
        heap = compact_py(buf)
    off = heap - size
    ENTRY.pack_into(buf, off, flags, len(key), vlen, counter)
    k0 = off + ENTRY.size
    buf[k0:k0 + len(key)] = key
    buf[k0 + len(key):off + size] = stored
    if slot is None:
        slot = count
        set_count(buf, count + 1)
    _PACK_SLOT(buf, HDR + 2 * slot, off)
    set_aux(buf, off)                                   # aux = heap start
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


def compact_py(buf: bytearray) -> int:
    """Pack live entries at the end of the page (slots keep their numbers, so the key
    index stays valid); zero the gap; return the new heap start."""
    page_size = len(buf)
    count = header_count(buf)
    live: list[tuple[int, bytes]] = []
    for s in range(count):
        (off,) = _UNPACK_SLOT(buf, HDR + 2 * s)
        if off:
            _f, _c, _v, _w, size = read_entry_py(buf, s)
            live.append((s, bytes(buf[off:off + size])))
    heap = page_size
    for s, data in live:
        heap -= len(data)
        buf[heap:heap + len(data)] = data
        _PACK_SLOT(buf, HDR + 2 * s, heap)
    dir_end = HDR + SLOT.size * count
    buf[dir_end:heap] = bytes(heap - dir_end)
    set_aux(buf, heap)
    return heap


# -- the C twin ----------------------------------------------------------------------
_ACCEL_ABI = 1
# checkpoint._writeaccel when built, of this version and not turned off by
# FERRY_PAGE_ACCEL=0 (read at import, like accel.page); else None
_accel = load_accel("checkpoint._writeaccel", _ACCEL_ABI, ACCEL_ENV)
_NAMES = ("chain_pages", "insert", "delete", "read_entry", "compact", "new_page")


def use_accelerator(on: bool) -> bool:
    """Bind this module's write functions to the C twins (``on`` and built) or to the
    pure-Python ones; returns whether C is now used. Callers look the functions up
    through the module (``pg.insert``), so the switch takes effect at once (tests and
    the write bench compare both in one process)."""
    g = globals()
    use = bool(on) and _accel is not None
    for name in _NAMES:
        g[name] = getattr(_accel, name) if use else g[name + "_py"]
    return use


def accelerator() -> str | None:
    """What runs the write path's byte work: ``"c"`` or None (pure Python)."""
    return "c" if insert is not insert_py else None


chain_pages = chain_pages_py
insert = insert_py
delete = delete_py
read_entry = read_entry_py
compact = compact_py
new_page = new_page_py
use_accelerator(True)
