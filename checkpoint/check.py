"""Page checks: why a page of a partition file is bad, or None.

The one checker: the decoder, the key scan, the store's page loads and the transfer's
receiver ask these functions, so every caller names the same fault for the same
bytes. :func:`check_pages` runs the common case of a run of pages in C when the page
accelerator is on (``accel.page``), the GIL released meanwhile.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import accel as _switch
from .layout import (ENTRY, F_OVERFLOW, F_TOMBSTONE, FORMAT_VERSION, HDR, HEADER, KNOWN_FLAGS,
                     MAGIC, MAX_VALUE, PTR, SLOT, PageType, decode_meta, entry_size, page_crc)


@dataclass(frozen=True)
class PageProblem:
    page: int
    offset: int
    reason: str


def check_page(buf: bytes | bytearray | memoryview, page_index: int, page_size: int) -> str | None:
    """Why page ``page_index`` is bad, or None: CRC, header and in-page structure."""
    if len(buf) != page_size:
        return f"short page: {len(buf)} of {page_size} bytes"
    # every field by name, unpacked at once (a NamedTuple costs per page on the pure path)
    crc, index, ptype, _flags, count, aux = HEADER.unpack_from(buf, 0)
    if crc != page_crc(buf):
        if not any(buf):
            return "page is all zeros (never written, or torn)"
        return f"CRC mismatch (stored {crc:#010x}, computed {page_crc(buf):#010x})"
    if index != page_index:
        return f"page header names index {index} (misplaced page)"
    if ptype not in PageType._value2member_map_:
        return f"unknown page type {ptype}"
    if (page_index == 0) != (ptype == PageType.META):
        return "meta page must be page 0 and only page 0"
    if ptype == PageType.META:
        meta = decode_meta(buf)
        magic, version, psize, pcount = meta.magic, meta.version, meta.page_size, meta.page_count
        if magic != MAGIC:
            return "bad magic (not a Ferry partition file)"
        if version != FORMAT_VERSION:
            return f"unsupported format version {version} (this decoder reads {FORMAT_VERSION})"
        if psize != page_size:
            return f"meta names page size {psize}, file read with {page_size}"
        if pcount < 1:
            return "meta page count < 1"
    elif ptype == PageType.OVERFLOW:
        if count > page_size - HDR:
            return f"overflow payload length {count} exceeds page"
    elif ptype == PageType.DATA:
        return check_data(buf, count, aux, page_size)
    return None


def check_data(buf: bytes | bytearray | memoryview, count: int, heap: int, page_size: int) -> str | None:
    if not HDR + 2 * count <= heap <= page_size:
        return f"slot directory ({count} slots) overlaps heap start {heap}"
    for s in range(count):
        (off,) = SLOT.unpack_from(buf, HDR + 2 * s)
        if off == 0:
            continue
        if off < heap or off + ENTRY.size > page_size:
            return f"slot {s} points outside the heap (offset {off})"
        flags, klen, vlen, _c = ENTRY.unpack_from(buf, off)
        stored = PTR.size if flags & F_OVERFLOW else vlen
        if flags & ~KNOWN_FLAGS:
            return f"slot {s}: unknown entry flags {flags:#x}"
        if off + entry_size(klen, stored) > page_size:
            return f"slot {s}: entry runs past the page end"
        if flags & F_TOMBSTONE and vlen:
            return f"slot {s}: tombstone with a value"
        if vlen > MAX_VALUE:
            return f"slot {s}: value length {vlen} exceeds {MAX_VALUE}"
    return None


def check_pages(buf: bytes | bytearray | memoryview, first_index: int, page_size: int
                ) -> tuple[int | None, str | None]:
    """:func:`check_page` of each page of ``buf`` (consecutive pages, the first being
    page ``first_index``; a partial page at the end is a "short page"): ``(index of the
    first bad page, its reason)``, or ``(None, None)`` when all pass. In one C call per
    run of good pages when the accelerator is on (the GIL is released meanwhile)."""
    view = memoryview(buf)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    n = len(view) // page_size
    accel, j = _switch.page, -1
    while True:
        j += 1
        if accel is not None and j < n:
            j = accel.check_pages(view, first_index, page_size, j)
        if j >= n:
            break
        reason = check_page(view[j * page_size:(j + 1) * page_size], first_index + j, page_size)
        if reason:
            return first_index + j, reason
    if len(view) % page_size:
        index = first_index + n
        return index, check_page(view[n * page_size:], index, page_size)
    return None, None
