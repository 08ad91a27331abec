"""THE decoder of ``part-<p>.bin``: every entry of a partition file, in page order.

Every page is checked (CRC and structure, :mod:`.check`) once, by the sequential pass
or by an overflow chain that used it first; a problem raises CorruptPageError or is
reported to ``on_error`` and skipped. The bulk of a file is decoded by the page
accelerator (``accel.page.decode``) when it is on, and any page it leaves is decoded
here by the reference code, so items, order and errors are the same with and without.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, NamedTuple

from faults.crc import crc32c

from . import accel as _switch
from .chain import chain_value, overflow_chain
from .check import PageProblem, check_data, check_page
from .errors import CorruptPageError
from .layout import (CRC_FROM, ENTRY, F_OVERFLOW, F_TOMBSTONE, HDR, HEADER, KNOWN_FLAGS,
                     MAX_VALUE, OVF_ENTRY, PTR, SLOT, T_DATA, header_count, slot_reader)
from .layout import Meta
from .reader import PageReader, RangeReader, read_meta, truncation

_ENTRY_SIZE = ENTRY.size           # 15


class Entry(NamedTuple):
    """One decoded entry. A NamedTuple, not a dataclass: millions are built per scan
    and a tuple is the cheapest immutable record Python can make."""
    key: bytes
    value: bytes | None
    counter: int
    tombstone: bool


class LiveColumns:
    """The live (key, value) pairs of a run of pages without a Python object per pair:
    ``cols`` holds a record of four native int64 per pair (key offset in ``data``,
    key length, value offset, value length; a value offset < 0 is ``~offset`` in
    ``spill``, where overflow chains' values are joined), ``data`` is the read chunk
    the pages came from. What the page accelerator's ``decode_live`` hands the index
    feed (``indexes/_ixaccel.c`` reads keys and values straight from the buffers);
    :meth:`pairs` gives the same pairs as :func:`iter_live_batches`, in order."""
    __slots__ = ("data", "spill", "cols")
    RECORD = 32                    # bytes of one pair's record

    def __init__(self, data: bytes, spill: bytes, cols: bytes) -> None:
        self.data, self.spill, self.cols = data, spill, cols

    def __len__(self) -> int:
        return len(self.cols) // self.RECORD

    def pairs(self) -> list[tuple[bytes, bytes]]:
        """The pairs as (key, value) tuples (the path without the C feed)."""
        rec = memoryview(self.cols).cast("q")
        data, spill = self.data, self.spill
        out = []
        for i in range(0, len(rec), 4):
            k0, kn, v0, vn = rec[i], rec[i + 1], rec[i + 2], rec[i + 3]
            if v0 < 0:
                v0 = ~v0
                value = spill[v0:v0 + vn]
            else:
                value = data[v0:v0 + vn]
            out.append((data[k0:k0 + kn], value))
        return out


def page_entries(buf: bytes | bytearray | memoryview) -> Iterator[tuple[int, int, bytes, int, int, int]]:
    """(slot, flags, key, counter, value_len, value_off_or_first_overflow) of each entry
    of a checked DATA page; an inline value is ``buf[value_off:value_off+value_len]``."""
    count = header_count(buf)
    unpack_entry, unpack_slot = ENTRY.unpack_from, SLOT.unpack_from
    for s in range(count):
        (off,) = unpack_slot(buf, HDR + 2 * s)
        if off:
            flags, klen, vlen, counter = unpack_entry(buf, off)
            k0 = off + _ENTRY_SIZE
            key = bytes(buf[k0:k0 + klen])
            if flags & F_OVERFLOW:
                yield s, flags, key, counter, vlen, PTR.unpack_from(buf, k0 + klen)[0]
            else:
                yield s, flags, key, counter, vlen, k0 + klen



# -- the fast path -----------------------------------------------------------------
# One pass per DATA page both checks the slot structure (exactly the conditions of
# check_data) and cuts keys and values out of the read chunk. On any failed check
# the reference functions (check_page/check_data) are asked for the reason, so the
# errors are those of the page-by-page checker by construction; pages holding
# overflow entries go through the reference per-entry code (page_entries) too.
_SLOW = object()                   # "page is valid but holds overflow entries"
_new_tuple = tuple.__new__         # builds an Entry without its Python-level __new__
_unpack_entry = ENTRY.unpack_from
_unpack_header = HEADER.unpack_from
_ENTRY_SIZE = ENTRY.size           # 15
_OVF_SIZE = OVF_ENTRY              # 19


def _data_page(chunk: bytes, base: int, ps: int, count: int, heap: int,
               tombstones: bool, pairs: bool) -> list[Any] | object | None:
    """Items of the DATA page at ``chunk[base:base+ps]`` (CRC already checked): Entry
    tuples, or (key, value) pairs when ``pairs``. None: the page fails check_data.
    _SLOW: valid, but holds overflow entries."""
    if not HDR + 2 * count <= heap <= ps:
        return None
    out: list[Any] = []               # Entry tuples, or (key, value) pairs
    append = out.append
    slow = False
    for off in slot_reader(count)(chunk, base + HDR):
        if not off:
            continue
        if off < heap or off + _ENTRY_SIZE > ps:
            return None
        flags, klen, vlen, counter = _unpack_entry(chunk, base + off)
        if flags:
            if flags & ~KNOWN_FLAGS or vlen > MAX_VALUE:
                return None
            if flags & F_OVERFLOW:
                if off + _OVF_SIZE + klen > ps or (flags & F_TOMBSTONE and vlen):
                    return None
                slow = True
                continue
            if vlen or off + _ENTRY_SIZE + klen > ps:   # tombstone with a value / past end
                return None
            if tombstones:
                k0 = base + off + _ENTRY_SIZE
                key = chunk[k0:k0 + klen]
                append((key, None) if pairs else _new_tuple(Entry, (key, None, counter, True)))
            continue
        end = off + _ENTRY_SIZE + klen + vlen
        if end > ps or vlen > MAX_VALUE:
            return None
        k0 = base + off + _ENTRY_SIZE
        v0 = k0 + klen
        if pairs:
            append((chunk[k0:v0], chunk[v0:base + end]))
        else:
            append(_new_tuple(Entry, (chunk[k0:v0], chunk[v0:base + end], counter, False)))
    return _SLOW if slow else out


def _batches(path: str, tombstones: bool, on_error: Callable[[PageProblem], None] | None,
             pairs: bool, pages: tuple[int, int] | None = None,
             reader: PageReader | None = None, columns: bool = False,
             verified: bool = False) -> Iterator[Any]:
    """The decoder: lists of items in page order (see iter_entry_batches). Problems
    are reported in the same order relative to the items as entry by entry: what was
    decoded before a bad page is handed out before the problem is raised/reported.
    The items are Entry tuples, or (key, value) pairs when ``pairs``: the public
    functions below give the lists their item type. ``columns`` (live pairs only):
    what the accelerator decodes comes as :class:`LiveColumns` between the lists.
    ``verified``: every page of the file passed check_page since it was last written
    (an install scan): pages are marked checked from the start, so no CRC is computed
    again; each DATA page's structure is still checked before it is cut."""

    def problem(p: PageProblem) -> None:
        if on_error is None:
            raise CorruptPageError(path, p.page, p.offset, p.reason)
        on_error(p)

    if reader is not None:
        r, meta = reader, reader.meta
    else:
        try:
            meta = read_meta(path)
        except CorruptPageError as e:
            problem(PageProblem(0, 0, e.reason))
            return
        start, stop = pages if pages is not None else (1, None)
        r = PageReader(path, meta, start, stop)
    ps, pcount = meta.page_size, meta.page_count
    crc = crc32c
    checked = r.checked
    if verified:
        checked[:] = b"\x01" * len(checked)
    live = columns and not tombstones and pairs
    ncheck = len(checked)
    accel = _switch.page
    try:
        trunc = truncation(r)
        if r.stop < pcount:
            trunc = None                       # the range ends before the file end
        for first, chunk in r.chunks():
            view = memoryview(chunk)
            acc: list[Any] = []
            n, j = len(chunk) // ps, -1
            while True:                        # one page per turn; `continue` = next page
                j += 1
                if accel is not None and j < n and live:
                    # the C bulk path as columns: no Python object per pair
                    cols, spill, j, exc = accel.decode_live(chunk, first, j, ps, checked,
                                                            pcount, r.held)
                    if cols:
                        if acc:
                            yield acc
                            acc = []
                        yield LiveColumns(chunk, spill, cols)
                    if exc is not None:        # a chain page's read failed on page j
                        raise exc
                elif accel is not None and j < n:
                    # the C bulk path: pages j.. up to one it leaves to the code below
                    bulk, j, exc = accel.decode(chunk, first, j, ps, checked, tombstones,
                                                pairs, pcount, r.held, Entry)
                    if bulk:
                        if acc:
                            acc.extend(bulk)
                        else:
                            acc = bulk
                    if exc is not None:        # a chain page's read failed on page j:
                        if acc:                # what came before it first, as below
                            yield acc
                            acc = []
                        raise exc
                if j >= n:
                    break
                index, base = first + j, j * ps
                stored, idx, ptype, _f, count, heap = _unpack_header(chunk, base)
                if index < ncheck and checked[index]:
                    if ptype != T_DATA:         # checked already, by a chain that used it
                        continue
                elif ptype != T_DATA or idx != index or stored != crc(view[base + CRC_FROM:base + ps]):
                    reason = check_page(view[base:base + ps], index, ps)
                    if reason:
                        if acc:
                            yield acc
                            acc = []
                        problem(PageProblem(index, index * ps, reason))
                        continue
                    if index < ncheck:
                        checked[index] = 1
                    if ptype != T_DATA:
                        continue
                got = _data_page(chunk, base, ps, count, heap, tombstones, pairs)
                if got is None:
                    if acc:
                        yield acc
                        acc = []
                    page = view[base:base + ps]
                    problem(PageProblem(index, index * ps,
                                        check_data(page, count, heap, ps) or "bad slot directory"))
                elif got is _SLOW:
                    if acc:
                        yield acc
                        acc = []
                    yield from _overflow_page(r, index, view[base:base + ps], tombstones, pairs,
                                              problem)
                elif acc:
                    acc.extend(got)            # type: ignore[arg-type]
                else:
                    acc = got                  # type: ignore[assignment]
            if acc:
                yield acc
        if trunc:
            problem(trunc)
    finally:
        r.close()


def _overflow_page(r: PageReader, index: int, page: memoryview, tombstones: bool, pairs: bool,
                   problem: Callable[[PageProblem], None]) -> Iterator[list[Any]]:
    """A valid DATA page with overflow entries, entry by entry (the reference path);
    chain pages come from the reader's chunks when it has them, each checked once."""
    ps, pcount = r.meta.page_size, r.meta.page_count
    items: list[Any] = []
    for _s, flags, key, counter, vlen, where in page_entries(page):
        if flags & F_TOMBSTONE:
            if tombstones:
                items.append((key, None) if pairs else Entry(key, None, counter, True))
            continue
        if flags & F_OVERFLOW:
            value, bad = chain_value(r, where, vlen, index), None
            if value is None:                  # a fault somewhere: the reference says which
                value, bad, _pages = overflow_chain(r.page, where, vlen, ps, pcount, index,
                                                    r.checked)
            if bad:
                if items:
                    yield items                # what came before the bad entry, first
                    items = []
                problem(bad)
                continue
        else:
            value = bytes(page[where:where + vlen])
        items.append((key, value) if pairs else Entry(key, value, counter, False))
    if items:
        yield items


def iter_entry_batches(path: str, *, include_tombstones: bool = True,
                       on_error: Callable[[PageProblem], None] | None = None
                       ) -> Iterator[list[Entry]]:
    """The entries of :func:`iter_entries`, in the same order, as lists (one per read
    chunk of ~2 MiB, shorter around a problem) - for bulk consumers."""
    return _batches(path, include_tombstones, on_error, False)


def iter_live_batches(path: str, *, on_error: Callable[[PageProblem], None] | None = None,
                      pages: tuple[int, int] | None = None
                      ) -> Iterator[list[tuple[bytes, bytes]]]:
    """The live (key, value) pairs of ``path`` (no tombstones, no counters) in page
    order, as lists: the cheapest way to read a whole partition (index rebuilds).
    Same checks and errors as :func:`iter_entries`. ``pages=(start, stop)`` reads only
    the pages ``start <= i < stop`` (so that several processes can share a file);
    truncation is reported by the range that reaches the end of the file."""
    return _batches(path, False, on_error, True, pages)


def iter_live_columns(path: str, *, on_error: Callable[[PageProblem], None] | None = None,
                      pages: tuple[int, int] | None = None, verified: bool = False
                      ) -> Iterator[LiveColumns | list[tuple[bytes, bytes]]]:
    """The pairs of :func:`iter_live_batches` (same order, checks and errors) for the
    index feed: what the page accelerator decodes comes as :class:`LiveColumns` (no
    Python object per pair), any page left to the Python code as a list of pairs.
    ``verified=True`` says every page of the file was checked (CRC and structure)
    since it was last written, by the install scan that read it: the CRCs are not
    computed again (see _batches). A caller that cannot vouch for that passes False."""
    return _batches(path, False, on_error, True, pages, columns=True, verified=verified)


def iter_live_range(path: str, meta: Meta, start: int, stop: int, body: bytes,
                    seen: Callable[[int, bytes], None],
                    on_error: Callable[[PageProblem], None], columns: bool = False
                    ) -> Iterator[Any]:
    """The live pairs of pages ``start <= i < stop`` of a file that may still be
    written (a transfer's temp file), decoded from ``body`` (those pages' bytes as the
    caller read them) with ``meta`` given (page 0 may not be there yet). Every page
    read outside the range (overflow chains) goes to ``seen(page, bytes)``; problems
    go to ``on_error``. Same checks and items as :func:`iter_live_batches` over the
    same bytes, in lists of pairs; with ``columns``, what the page accelerator decodes
    comes as :class:`LiveColumns` (as :func:`iter_live_columns`). The truncation check
    is left out (the file is not complete)."""
    r = RangeReader(path, meta, start, stop, body, seen)
    r.size = max(r.size, meta.page_count * meta.page_size)     # no truncation report
    return _batches(path, False, on_error, True, reader=r, columns=columns)


def iter_entries(path: str, *, include_tombstones: bool = True,
                 on_error: Callable[[PageProblem], None] | None = None) -> Iterator[Entry]:
    """Every entry of ``path`` in page order.  ``on_error=None``: raise CorruptPageError
    at the first bad page; otherwise report each problem to ``on_error`` and skip it."""
    for batch in _batches(path, include_tombstones, on_error, False):
        yield from batch


def verify(path: str) -> list[PageProblem]:
    """Every problem of ``path``: page CRCs and structure, overflow chains, truncation."""
    problems: list[PageProblem] = []
    for _ in iter_entries(path, on_error=problems.append):
        pass
    return sorted(set(problems), key=lambda p: (p.page, p.reason))
