"""The partition page file format: layout, and THE one decoder of ``part-<p>.bin``.

Importable with only the standard library and ``crc32c`` (Spark executors import this
module alone), so it imports nothing else from Ferry except, optionally, the error base.
The format is written out in ``docs/formats.md`` ("Partition page files"); in short:

* fixed-size pages (power of two, 1 KiB..64 KiB, fixed per file); page ``i`` lives at
  byte ``i * page_size``; page 0 is the meta page.
* every page starts with a 16-byte header ``crc u32 | index u32 | type u8 | flags u8 |
  count u16 | aux u32``; ``crc`` is CRC32C of bytes ``[4, page_size)`` of the page.
* DATA pages are slotted: ``count`` u16 slot offsets follow the header (0 = empty
  slot), entries are packed from the end of the page down to ``aux`` (heap start).
  Entry: ``flags u8 | key_len u16 | value_len u32 | counter u64 | key | value``, or
  with the OVERFLOW flag ``... | key | first_overflow_page u32`` (value_len = total).
* OVERFLOW pages hold ``count`` bytes of a value after the header; ``aux`` = next page
  of the chain, 0 at the end.  FREE pages are reusable and hold nothing.
"""
from __future__ import annotations

import os
import struct
from array import array
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple

import crc32c

try:  # the error base, when the rest of Ferry is importable (not required)
    from faults.errors import FerryError as _Base
except ImportError:  # pragma: no cover - executors that ship this file alone
    _Base = Exception  # type: ignore[misc,assignment]

from .layout import (ENTRY, F_OVERFLOW, F_TOMBSTONE, FORMAT_VERSION, HDR, HEADER,
                     KNOWN_FLAGS as _KNOWN_FLAGS, MAGIC, MAX_PAGE_SIZE, MAX_VALUE, META,
                     META_END, MIN_PAGE_SIZE, PTR, SLOT, EntryFlag, Meta, PageType,
                     encode_meta, entry_size, page_crc, seal, seal_many, valid_page_size)

_DATA = int(PageType.DATA)


OFF_WORDS = ("0", "off", "no", "false")     # values of an accelerator switch that mean off


def load_accel(module: str, abi: int, env: str = "FERRY_PAGE_ACCEL"):
    """An optional C accelerator ``module`` when it is built, of ABI version ``abi`` and
    not turned off by ``env`` (0/off/no/false, any case); else None (the pure-Python
    path). The one loader of the checkpoint accelerators. Imported by name
    through importlib so that a shipped copy of this file (Spark executors,
    validation/ship.py) does not list them as modules to pack."""
    if os.environ.get(env, "1").strip().lower() in OFF_WORDS:
        return None
    try:
        import importlib
        mod = importlib.import_module(module)
    except ImportError:
        return None
    return mod if getattr(mod, "ABI_VERSION", None) == abi else None


# The accelerator does the common case of a whole read chunk in one call and stops at
# anything unusual (a page failing a check, a chain it cannot follow); the Python code
# below then handles that page as it always has, so items, order, errors and the pages
# marked checked are the same with and without it. Read at each call: tests swap it.
ACCEL_ENV = "FERRY_PAGE_ACCEL"
_ACCEL_ABI = 2                 # 2: scan_keys (the open scan's hashes)


def _load_accel():
    """``checkpoint._pageaccel`` (this file's bulk path) or None."""
    return load_accel("checkpoint._pageaccel", _ACCEL_ABI, ACCEL_ENV)


_accel = _load_accel()


def accelerator() -> str | None:
    """What decodes the bulk path: ``"c+sse4.2"``/``"c"`` or None (pure Python)."""
    if _accel is None:
        return None
    return "c+sse4.2" if _accel.HW_CRC else "c"


class CheckpointError(_Base):
    """Errors of partition files, page memory and the checkpointer."""


class CorruptPageError(CheckpointError):
    """A page of a partition file failed its CRC or structure check."""

    def __init__(self, path: str, page: int, offset: int, reason: str) -> None:
        self.path, self.page, self.offset, self.reason = str(path), page, offset, reason
        super().__init__(
            f"corrupt partition file {self.path}: page {page} (byte offset {offset}): {reason}; "
            "the file cannot be trusted - restore it from another owner or re-run the transfer")


class Entry(NamedTuple):
    """One decoded entry. A NamedTuple, not a dataclass: millions are built per scan
    and a tuple is the cheapest immutable record Python can make."""
    key: bytes
    value: bytes | None
    counter: int
    tombstone: bool


@dataclass(frozen=True)
class PageProblem:
    page: int
    offset: int
    reason: str


def check_page(buf: bytes | bytearray | memoryview, page_index: int, page_size: int) -> str | None:
    """Why page ``page_index`` is bad, or None: CRC, header and in-page structure."""
    if len(buf) != page_size:
        return f"short page: {len(buf)} of {page_size} bytes"
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
        magic, version, _r, _p, psize, pcount, _c = META.unpack_from(buf, HDR)
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
        return _check_data(buf, count, aux, page_size)
    return None


def _check_data(buf, count: int, heap: int, page_size: int) -> str | None:
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
        if flags & ~_KNOWN_FLAGS:
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
    accel, j = _accel, -1
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


def page_entries(buf) -> Iterator[tuple[int, int, bytes, int, int, int]]:
    """(slot, flags, key, counter, value_len, value_off_or_first_overflow) of each entry
    of a checked DATA page; an inline value is ``buf[value_off:value_off+value_len]``."""
    count = HEADER.unpack_from(buf, 0)[4]
    unpack_entry, unpack_slot = ENTRY.unpack_from, SLOT.unpack_from
    for s in range(count):
        (off,) = unpack_slot(buf, HDR + 2 * s)
        if off:
            flags, klen, vlen, counter = unpack_entry(buf, off)
            k0 = off + 15
            key = bytes(buf[k0:k0 + klen])
            if flags & F_OVERFLOW:
                yield s, flags, key, counter, vlen, PTR.unpack_from(buf, k0 + klen)[0]
            else:
                yield s, flags, key, counter, vlen, k0 + klen


def chain_limit(length: int, page_size: int) -> int:
    """The most pages an overflow chain of a ``length``-byte value may have: a writer
    fills every page but the last (``ceil(length / payload)``); a longer chain is
    corrupt. Bounding the walk by it (and by never revisiting a page) is what keeps a
    cyclic or runaway chain from looping forever."""
    payload = page_size - HDR
    return max(1, -(-length // payload))


def chain_link_problem(at: int, page: int, got: int, length: int, visited, page_size: int,
                       page_count: int) -> str | None:
    """Why the link from ``at`` to ``page`` (the next page of a chain that holds ``got``
    of ``length`` bytes over the pages in ``visited``) cannot be followed, or None.
    One place for the chain rules: the decoder and the store's chain walks use it."""
    if page == 0:
        if not visited:
            return f"overflow chain of a {length}-byte value starts at page 0 (the meta page)"
        return f"overflow chain ends after {got} bytes, entry says {length}"
    if page >= page_count:
        return (f"overflow chain points to page {page}, past the end of the file "
                f"(page count {page_count})")
    if page in visited:
        return f"overflow chain loops: page {at} points back to page {page} of the chain"
    limit = chain_limit(length, page_size)
    if len(visited) >= limit:
        return (f"overflow chain longer than its value allows: {length} bytes fill at most "
                f"{limit} pages of {page_size - HDR} bytes, page {at} points on to page {page}")
    return None


def overflow_chain(read_page: Callable[[int], bytes | memoryview], first: int, length: int,
                   page_size: int, page_count: int, origin: int | None = None,
                   checked: bytearray | None = None
                   ) -> tuple[bytes | None, PageProblem | None, list[int]]:
    """Follow an overflow chain; returns (value, problem, pages of the chain).

    ``origin``: the DATA page holding the entry (a bad first link is reported there;
    default: at ``first``). ``checked``: pages known to pass :func:`check_page`
    (index -> nonzero); pages checked here are added, so a bulk reader checks each
    page once. The walk visits at most :func:`chain_limit` pages and never one twice."""
    parts: list = []
    pages: list[int] = []
    visited: set[int] = set()
    got, page = 0, first
    at = first if origin is None else origin
    ncheck = len(checked) if checked is not None else 0
    while got < length:
        bad = chain_link_problem(at, page, got, length, visited, page_size, page_count)
        if bad:
            return None, PageProblem(at, at * page_size, bad), pages
        buf = read_page(page)
        if page < ncheck and checked[page]:           # type: ignore[index]
            reason = None
        else:
            reason = check_page(buf, page, page_size)
            if reason is None and page < ncheck:
                checked[page] = 1                      # type: ignore[index]
        if reason is None and buf[8] != PageType.OVERFLOW:
            reason = f"page of an overflow chain has type {PageType(buf[8]).name}"
        if reason:
            return None, PageProblem(page, page * page_size, reason), pages
        _crc, _i, _t, _f, used, nxt = HEADER.unpack_from(buf, 0)
        parts.append(memoryview(buf)[HDR:HDR + used])
        pages.append(page)
        visited.add(page)
        got += used
        at, page = page, nxt
    if got != length:
        return None, PageProblem(pages[-1], pages[-1] * page_size,
                                 f"overflow chain holds {got} bytes, entry says {length}"), pages
    return b"".join(parts), None, pages


def read_meta(path: str) -> Meta:
    """The meta page of ``path``; CorruptPageError when it is unreadable."""
    with open(path, "rb") as f:
        head = f.read(META_END)
        if len(head) < META_END:
            raise CorruptPageError(path, 0, 0, f"file is {len(head)} bytes, too short for a meta page")
        _magic, _v, _r, _p, page_size, _pc, _c = META.unpack_from(head, HDR)
        if not valid_page_size(page_size):
            raise CorruptPageError(path, 0, 0, f"meta page names invalid page size {page_size} "
                                               "(bad meta page or not a partition file)")
        f.seek(0)
        buf = f.read(page_size)
    reason = check_page(buf, 0, page_size)
    if reason:
        raise CorruptPageError(path, 0, 0, reason)
    _m, version, _r, partition, psize, pcount, counter = META.unpack_from(buf, HDR)
    return Meta(version, partition, psize, pcount, counter)


class _Reader:
    """Sequential reads of whole pages in large chunks, and page reads for overflow
    chains that take the page from a chunk when it is (or will soon be) read anyway.

    Chunks are numbered from the first page read; the sequential pass holds the
    current one and the one before, and a chain may pull chunks up to LOOKAHEAD bytes
    ahead into the same cache, so that the pass later uses them instead of reading
    again. After a checkpoint a chain is usually laid out right after (or just before)
    its DATA page, so a partition of big values is read once, in big reads; a chain
    elsewhere (a reused FREE page, another worker's page range) is read by ``pread``."""

    # Big sequential reads: one syscall per ~500 4 KiB pages, and the chunk stays a
    # ``bytes`` so that slicing it yields keys and values with a single copy.
    CHUNK = 1 << 21
    LOOKAHEAD = 16 << 20           # cache bound for chunks pulled ahead by chains

    def __init__(self, path: str, meta: Meta, start: int = 1, stop: int | None = None) -> None:
        self.path, self.meta = path, meta
        self.fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size
        ps = meta.page_size
        self.start = max(1, start)
        self.stop = meta.page_count if stop is None else min(stop, meta.page_count)
        self.per = max(1, self.CHUNK // ps)
        self.ahead = max(1, self.LOOKAHEAD // (self.per * ps))
        self.cache: dict[int, bytes] = {}
        self.cur = 0
        # pages that passed check_page (bounded by the file, not by a meta page count
        # that may be corrupt): a page is CRC-checked once, by the pass or by a chain
        self.checked = bytearray(min(meta.page_count, self.size // ps + 1))

    def close(self) -> None:
        os.close(self.fd)

    def _chunk(self, c: int) -> bytes:
        got = self.cache.get(c)
        if got is None:
            ps, first = self.meta.page_size, self.start + c * self.per
            n = min(self.per, self.stop - first)
            got = self.cache[c] = os.pread(self.fd, n * ps, first * ps)
        return got

    def chunk_of(self, i: int) -> tuple[int, bytes] | None:
        """(first page, bytes) of the chunk holding page ``i`` when it is in the
        window (the current chunk, the one before, or up to LOOKAHEAD ahead)."""
        if self.start <= i < self.stop:
            c = (i - self.start) // self.per
            if self.cur - 1 <= c <= self.cur + self.ahead:
                return self.start + c * self.per, self._chunk(c)
        return None

    def held(self, i: int) -> tuple[int, bytes]:
        """(first page, bytes) holding page ``i`` for a chain walk: its chunk when in
        the window and long enough, else a ``pread`` of the page alone (short at EOF)."""
        ps = self.meta.page_size
        got = self.chunk_of(i)
        if got is not None and (i - got[0] + 1) * ps <= len(got[1]):
            return got
        return i, os.pread(self.fd, ps, i * ps)

    def page(self, i: int) -> bytes | memoryview:
        ps = self.meta.page_size
        if self.start <= i < self.stop:
            c, j = divmod(i - self.start, self.per)
            if self.cur - 1 <= c <= self.cur + self.ahead:
                chunk = self._chunk(c)
                if (j + 1) * ps <= len(chunk):
                    return memoryview(chunk)[j * ps:(j + 1) * ps]
        return os.pread(self.fd, ps, i * ps)

    def chunks(self) -> Iterator[tuple[int, bytes]]:
        """(index of the first page, bytes of up to CHUNK of pages) for pages
        [start, stop); the last chunk of a truncated file is short (a partial page at
        its end is left to the caller)."""
        ps = self.meta.page_size
        for c, first in enumerate(range(self.start, self.stop, self.per)):
            self.cur = c
            for old in [k for k in self.cache if k < c - 1]:
                del self.cache[old]
            chunk = self._chunk(c)
            yield first, chunk
            if len(chunk) < min(self.per, self.stop - first) * ps:
                return


def _truncation(r: _Reader) -> PageProblem | None:
    ps, count = r.meta.page_size, r.meta.page_count
    if r.size < count * ps:
        have = r.size // ps
        return PageProblem(have, have * ps, f"file truncated: {r.size} bytes, meta page count "
                                            f"{count} needs {count * ps}")
    return None


# -- the fast path -----------------------------------------------------------------
# One pass per DATA page both checks the slot structure (exactly the conditions of
# _check_data) and cuts keys and values out of the read chunk. On any failed check
# the reference functions (check_page/_check_data) are asked for the reason, so the
# errors are those of the page-by-page checker by construction; pages holding
# overflow entries go through the reference per-entry code (page_entries) too.
_SLOW = object()                   # "page is valid but holds overflow entries"
_SLOT_STRUCTS: dict[int, Callable] = {}
_new_tuple = tuple.__new__         # builds an Entry without its Python-level __new__
_unpack_entry = ENTRY.unpack_from
_unpack_header = HEADER.unpack_from
_ENTRY_SIZE = ENTRY.size           # 15
_OVF_SIZE = ENTRY.size + PTR.size  # 19


def _slot_reader(count: int) -> Callable:
    """``unpack_from`` of ``count`` u16 slots at once (counts are few: cached)."""
    f = _SLOT_STRUCTS.get(count)
    if f is None:
        f = _SLOT_STRUCTS[count] = struct.Struct(f"<{count}H").unpack_from
    return f


def _data_page(chunk: bytes, base: int, ps: int, count: int, heap: int,
               tombstones: bool, pairs: bool) -> list | object | None:
    """Items of the DATA page at ``chunk[base:base+ps]`` (CRC already checked): Entry
    tuples, or (key, value) pairs when ``pairs``. None: the page fails _check_data.
    _SLOW: valid, but holds overflow entries."""
    if not HDR + 2 * count <= heap <= ps:
        return None
    out: list = []
    append = out.append
    slow = False
    for off in _slot_reader(count)(chunk, base + HDR):
        if not off:
            continue
        if off < heap or off + _ENTRY_SIZE > ps:
            return None
        flags, klen, vlen, counter = _unpack_entry(chunk, base + off)
        if flags:
            if flags & ~_KNOWN_FLAGS or vlen > MAX_VALUE:
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
             pairs: bool, pages: tuple[int, int] | None = None) -> Iterator[list]:
    """The decoder: lists of items in page order (see iter_entry_batches). Problems
    are reported in the same order relative to the items as entry by entry: what was
    decoded before a bad page is handed out before the problem is raised/reported."""

    def problem(p: PageProblem) -> None:
        if on_error is None:
            raise CorruptPageError(path, p.page, p.offset, p.reason)
        on_error(p)

    try:
        meta = read_meta(path)
    except CorruptPageError as e:
        problem(PageProblem(0, 0, e.reason))
        return
    start, stop = pages if pages is not None else (1, None)
    r = _Reader(path, meta, start, stop)
    ps, pcount = meta.page_size, meta.page_count
    crc = crc32c.crc32c
    checked = r.checked
    ncheck = len(checked)
    accel = _accel
    try:
        trunc = _truncation(r)
        if stop is not None and stop < pcount:
            trunc = None                       # the range ends before the file end
        for first, chunk in r.chunks():
            view = memoryview(chunk)
            acc: list = []
            n, j = len(chunk) // ps, -1
            while True:                        # one page per turn; `continue` = next page
                j += 1
                if accel is not None and j < n:
                    # the C bulk path: pages j.. up to one it leaves to the code below
                    got, j, exc = accel.decode(chunk, first, j, ps, checked, tombstones,
                                               pairs, pcount, r.held, Entry)
                    if got:
                        if acc:
                            acc.extend(got)
                        else:
                            acc = got
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
                    if ptype != _DATA:         # checked already, by a chain that used it
                        continue
                elif ptype != _DATA or idx != index or stored != crc(view[base + 4:base + ps]):
                    reason = check_page(view[base:base + ps], index, ps)
                    if reason:
                        if acc:
                            yield acc
                            acc = []
                        problem(PageProblem(index, index * ps, reason))
                        continue
                    if index < ncheck:
                        checked[index] = 1
                    if ptype != _DATA:
                        continue
                got = _data_page(chunk, base, ps, count, heap, tombstones, pairs)
                if got is None:
                    if acc:
                        yield acc
                        acc = []
                    page = view[base:base + ps]
                    problem(PageProblem(index, index * ps,
                                        _check_data(page, count, heap, ps) or "bad slot directory"))
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


def _overflow_page(r: _Reader, index: int, page: memoryview, tombstones: bool, pairs: bool,
                   problem: Callable[[PageProblem], None]) -> Iterator[list]:
    """A valid DATA page with overflow entries, entry by entry (the reference path);
    chain pages come from the reader's chunks when it has them, each checked once."""
    ps, pcount = r.meta.page_size, r.meta.page_count
    items: list = []
    for _s, flags, key, counter, vlen, where in page_entries(page):
        if flags & F_TOMBSTONE:
            if tombstones:
                items.append((key, None) if pairs else Entry(key, None, counter, True))
            continue
        if flags & F_OVERFLOW:
            value, bad = _chain_value(r, where, vlen, index), None
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


_OVF = int(PageType.OVERFLOW)


def _chain_value(r: _Reader, page: int, length: int, origin: int) -> bytes | None:
    """:func:`_chain_value_py`, by the C walk when the accelerator is on (same rules,
    same pages marked checked, pages from ``r.held``)."""
    if _accel is not None:
        return _accel.chain_value(page, length, r.meta.page_size, r.meta.page_count,
                                  r.checked, r.held)
    return _chain_value_py(r, page, length, origin)


def _chain_value_py(r: _Reader, page: int, length: int, origin: int) -> bytes | None:
    """The value of an intact overflow chain, or None when anything is wrong with it
    (the caller then runs :func:`overflow_chain`, which names the fault). The bulk
    path's chain walk: the same rules, pages taken from the reader's chunks (one
    ``pread`` per page only outside them), each page CRC-checked once (``r.checked``),
    and the value joined from views of the chunks (one copy)."""
    ps, pcount = r.meta.page_size, r.meta.page_count
    checked = r.checked
    ncheck, room, limit = len(checked), ps - HDR, chain_limit(length, ps)
    crc = crc32c.crc32c
    parts: list = []
    visited: set[int] = set()
    got, cfirst, cend = 0, 0, 0
    mv: memoryview = memoryview(b"")
    while got < length:
        if page == 0 or page >= pcount or page in visited or len(visited) >= limit:
            return None
        if cfirst <= page < cend:
            base = (page - cfirst) * ps
        else:
            held = r.chunk_of(page)
            if held is not None and (page - held[0] + 1) * ps <= len(held[1]):
                cfirst, mv = held[0], memoryview(held[1])
                cend = cfirst + len(held[1]) // ps
                base = (page - cfirst) * ps
            else:                              # outside the window: this page alone
                one = os.pread(r.fd, ps, page * ps)
                if len(one) != ps:
                    return None
                cfirst, cend, mv, base = page, page + 1, memoryview(one), 0
        stored, idx, ptype, _f, used, nxt = _unpack_header(mv, base)
        if ptype != _OVF:
            return None
        if not (page < ncheck and checked[page]):
            if idx != page or used > room or stored != crc(mv[base + 4:base + ps]):
                return None
            if page < ncheck:
                checked[page] = 1
        parts.append(mv[base + HDR:base + HDR + used])
        visited.add(page)
        got += used
        page = nxt
    if got != length:
        return None
    return b"".join(parts)


def _data_keys(chunk: bytes, base: int, ps: int, count: int, heap: int
               ) -> tuple[int, list[tuple[int, bytes]]] | None:
    """(bytes in use, [(slot, key)]) of the DATA page at ``chunk[base:base+ps]`` (CRC
    already checked) in one pass that also makes the checks of _check_data; None when
    the page fails them. Values are not touched (overflow chains are not followed)."""
    if not HDR + 2 * count <= heap <= ps:
        return None
    used = HDR + 2 * count
    out: list[tuple[int, bytes]] = []
    for slot, off in enumerate(_slot_reader(count)(chunk, base + HDR)):
        if not off:
            continue
        if off < heap or off + _ENTRY_SIZE > ps:
            return None
        flags, klen, vlen, _counter = _unpack_entry(chunk, base + off)
        stored = 4 if flags & F_OVERFLOW else vlen
        size = _ENTRY_SIZE + klen + stored
        if (flags & ~_KNOWN_FLAGS or off + size > ps or (flags & F_TOMBSTONE and vlen)
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
    if ptype != _DATA or idx != index or stored != crc32c.crc32c(view[base + 4:base + ps]):
        reason = check_page(view[base:base + ps], index, ps)
        if reason:
            raise CorruptPageError(path, index, index * ps, reason)
        return (index, _FREE, 0, []) if ptype == _FREE else None
    got = _data_keys(chunk, base, ps, count, heap)
    if got is None:
        reason = _check_data(view[base:base + ps], count, heap, ps) or "bad slot directory"
        raise CorruptPageError(path, index, index * ps, reason)
    return index, _DATA, got[0], got[1]


_FREE = int(PageType.FREE)


def _key_reader(path: str, chunk_bytes: int | None) -> _Reader:
    """The reader of a keys-only pass; a truncated file raises before any page."""
    meta = read_meta(path)
    r = _Reader(path, meta)
    if chunk_bytes:
        r.per = max(1, chunk_bytes // meta.page_size)
    trunc = _truncation(r)
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
    accel = _accel
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


def key_scan_accel():
    """The C entry point of :func:`scan_key_hashes` (``_pageaccel.scan_keys``), or None:
    no C decoder, or one built without xxhash.h."""
    return getattr(_accel, "scan_keys", None)


def scan_key_hashes(path: str, chunk_bytes: int | None, batch: int, space, quarter: int,
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


def _scan_page_py(item, ps: int, space, quarter: int, roomy: set[int], free_pages: list[int],
                  hash_key: Callable[[bytes], int], hs: list[bytes], ls: list[bytes]) -> int:
    """One iter_page_keys item into scan_key_hashes' facts and columns: its key count."""
    index, ptype, used, keys = item
    if ptype == _FREE:
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
