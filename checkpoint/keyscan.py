"""The keys-only scan of a partition file, for the key index built at open/install.

Every page is checked exactly as by the decoder (:mod:`.check`) and values are never
read (overflow chains are not followed). :func:`scan_key_hashes` hands the index
columns of hashes and locations without a Python object per key when the page
accelerator has ``scan_keys``.
"""
from __future__ import annotations

from array import array
from typing import Callable, Iterator

from faults.crc import crc32c

from . import accel as _switch
from .accel import key_scan_accel
from .check import check_data, check_page
from .errors import CorruptPageError
from .layout import (CRC_FROM, ENTRY, F_OVERFLOW, F_TOMBSTONE, HDR, HEADER, KNOWN_FLAGS,
                     MAX_VALUE, PTR, T_DATA, T_FREE, slot_reader)
from .reader import PageReader, read_meta, truncation

_unpack_entry = ENTRY.unpack_from
_unpack_header = HEADER.unpack_from
_ENTRY_SIZE = ENTRY.size           # 15


def _data_keys(chunk: bytes, base: int, ps: int, count: int, heap: int
               ) -> tuple[int, list[tuple[int, bytes]]] | None:
    """(bytes in use, [(slot, key)]) of the DATA page at ``chunk[base:base+ps]`` (CRC
    already checked) in one pass that also makes the checks of check_data; None when
    the page fails them. Values are not touched (overflow chains are not followed)."""
    if not HDR + 2 * count <= heap <= ps:
        return None
    used = HDR + 2 * count
    out: list[tuple[int, bytes]] = []
    for slot, off in enumerate(slot_reader(count)(chunk, base + HDR)):
        if not off:
            continue
        if off < heap or off + _ENTRY_SIZE > ps:
            return None
        flags, klen, vlen, _counter = _unpack_entry(chunk, base + off)
        stored = PTR.size if flags & F_OVERFLOW else vlen
        size = _ENTRY_SIZE + klen + stored
        if (flags & ~KNOWN_FLAGS or off + size > ps or (flags & F_TOMBSTONE and vlen)
                or vlen > MAX_VALUE):
            return None
        k0 = base + off + _ENTRY_SIZE
        out.append((slot, chunk[k0:k0 + klen]))
        used += size
    return used, out


def _page_keys_at(path: str, chunk: bytes, view: memoryview, first: int, j: int, ps: int
                  ) -> tuple[int, int, int, list[tuple[int, bytes]]] | None:
    """The pure-Python step of :func:`iter_page_keys` for page ``j`` of a read chunk:
    its ``(page, type, used, [(slot, key)])`` item, None for a page not reported (a
    checked OVERFLOW page), or CorruptPageError."""
    index, base = first + j, j * ps
    stored, idx, ptype, _f, count, heap = _unpack_header(chunk, base)
    if ptype != T_DATA or idx != index or stored != crc32c(view[base + CRC_FROM:base + ps]):
        reason = check_page(view[base:base + ps], index, ps)
        if reason:
            raise CorruptPageError(path, index, index * ps, reason)
        return (index, T_FREE, 0, []) if ptype == T_FREE else None
    got = _data_keys(chunk, base, ps, count, heap)
    if got is None:
        reason = check_data(view[base:base + ps], count, heap, ps) or "bad slot directory"
        raise CorruptPageError(path, index, index * ps, reason)
    return index, T_DATA, got[0], got[1]


def _key_reader(path: str, chunk_bytes: int | None) -> PageReader:
    """The reader of a keys-only pass; a truncated file raises before any page."""
    meta = read_meta(path)
    r = PageReader(path, meta)
    if chunk_bytes:
        r.per = max(1, chunk_bytes // meta.page_size)
    trunc = truncation(r)
    if trunc:
        r.close()
        raise CorruptPageError(path, trunc.page, trunc.offset, trunc.reason)
    return r


def iter_page_keys(path: str, chunk_bytes: int | None = None
                   ) -> Iterator[tuple[int, int, int, list[tuple[int, bytes]]]]:
    """For a key index built at open/install: ``(page, type, bytes in use, [(slot,
    key)])`` of every FREE and DATA page in page order (OVERFLOW pages are checked but
    not reported; values are never read). Every page is checked (CRC and structure)
    once; the first problem raises CorruptPageError (a truncated file before any page).
    ``chunk_bytes``: size of the sequential reads."""
    r = _key_reader(path, chunk_bytes)
    ps = r.meta.page_size
    accel = _switch.page
    try:
        for first, chunk in r.chunks():
            view = memoryview(chunk)
            n, j = len(chunk) // ps, -1
            while True:                        # one page per turn
                j += 1
                if accel is not None and j < n:
                    got, j = accel.page_keys(chunk, first, j, ps)   # up to a page left to us
                    yield from got
                if j >= n:
                    break
                item = _page_keys_at(path, chunk, view, first, j, ps)
                if item is not None:
                    yield item
    finally:
        r.close()


def scan_key_hashes(path: str, chunk_bytes: int | None, batch: int, space: array[int], quarter: int,
                    roomy: set[int], free_pages: list[int], hash_key: Callable[[bytes], int]
                    ) -> Iterator[tuple[bytes, bytes]]:
    """The open scan of :func:`iter_page_keys` without a Python object per key: yields
    ``(hashes, locations)``, columns of native u64 (``hash_key(key)``, ``page << 16 |
    slot``) in page and slot order, cut at the first page end where a batch holds
    ``batch`` keys or more (the batches the per-page loop makes). On the way, a FREE
    page is appended to ``free_pages``; a DATA page sets ``space[page] = page_size -
    used`` (an ``array('I')``) and joins ``roomy`` when that is >= ``quarter``. Pages
    are checked exactly as by iter_page_keys and the first problem raises the same
    CorruptPageError. The C decoder (``scan_keys``, hash = xxh3-64: ``hash_key`` must
    be that hash) does the common case; each page it leaves is done here by
    iter_page_keys' own Python step, so errors are the reference's by construction."""
    r = _key_reader(path, chunk_bytes)
    ps = r.meta.page_size
    scan = key_scan_accel()
    hs: list[bytes] = []
    ls: list[bytes] = []
    have = 0                                   # keys in the batch being made
    try:
        for first, chunk in r.chunks():
            view = memoryview(chunk)
            n, j = len(chunk) // ps, 0
            while j < n:
                if scan is not None:
                    h, loc, j = scan(chunk, first, j, ps, batch - have, space, quarter,
                                     roomy, free_pages)
                    if h:
                        hs.append(h)
                        ls.append(loc)
                        have += len(h) >> 3
                if have < batch and j < n:     # a page the C code left to us (or no C)
                    item = _page_keys_at(path, chunk, view, first, j, ps)
                    j += 1
                    if item is not None:
                        have += _scan_page_py(item, ps, space, quarter, roomy, free_pages,
                                              hash_key, hs, ls)
                if have >= batch:
                    yield b"".join(hs), b"".join(ls)
                    hs, ls, have = [], [], 0
        if hs:
            yield b"".join(hs), b"".join(ls)
    finally:
        r.close()


def _scan_page_py(item: tuple[int, int, int, list[tuple[int, bytes]]], ps: int,
                  space: array[int], quarter: int, roomy: set[int], free_pages: list[int],
                  hash_key: Callable[[bytes], int], hs: list[bytes], ls: list[bytes]) -> int:
    """One iter_page_keys item into scan_key_hashes' facts and columns: its key count."""
    index, ptype, used, keys = item
    if ptype == T_FREE:
        free_pages.append(index)
        return 0
    free = ps - used
    space[index] = free
    if free >= quarter:
        roomy.add(index)
    if keys:
        hs.append(array("Q", [hash_key(k) for _s, k in keys]).tobytes())
        ls.append(array("Q", [index << 16 | s for s, _k in keys]).tobytes())
    return len(keys)
