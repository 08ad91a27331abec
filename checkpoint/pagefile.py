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

import enum
import os
import struct
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple

import crc32c

try:  # the error base, when the rest of Ferry is importable (not required)
    from faults.errors import FerryError as _Base
except ImportError:  # pragma: no cover - executors that ship this file alone
    _Base = Exception  # type: ignore[misc,assignment]

FORMAT_VERSION = 1
MAGIC = b"FERRYPG\x00"
MIN_PAGE_SIZE = 1024
MAX_PAGE_SIZE = 65536
MAX_VALUE = 16 * 1024 * 1024      # values up to 16 MiB (overflow chains)

HEADER = struct.Struct("<IIBBHI")  # crc, index, type, flags, count, aux
META = struct.Struct("<8sHHIIIQ")  # magic, version, reserved, partition, page_size, page_count, counter
ENTRY = struct.Struct("<BHIQ")     # flags, key_len, value_len, counter
SLOT = struct.Struct("<H")
PTR = struct.Struct("<I")
HDR = HEADER.size                  # 16
META_END = HDR + META.size


class PageType(enum.IntEnum):
    META = 1
    DATA = 2
    OVERFLOW = 3
    FREE = 4


class EntryFlag(enum.IntFlag):
    TOMBSTONE = 1
    OVERFLOW = 2


# Plain ints for the per-entry hot paths: ``flags & EntryFlag.X`` runs enum's Python
# __and__ and costs microseconds per entry; these are the same values.
F_TOMBSTONE = int(EntryFlag.TOMBSTONE)
F_OVERFLOW = int(EntryFlag.OVERFLOW)
_KNOWN_FLAGS = F_TOMBSTONE | F_OVERFLOW
_DATA = int(PageType.DATA)


class CheckpointError(_Base):
    """Errors of partition files, page memory and the checkpointer."""


class CorruptPageError(CheckpointError):
    """A page of a partition file failed its CRC or structure check."""

    def __init__(self, path: str, page: int, offset: int, reason: str) -> None:
        self.path, self.page, self.offset, self.reason = str(path), page, offset, reason
        super().__init__(
            f"corrupt partition file {self.path}: page {page} (byte offset {offset}): {reason}; "
            "the file cannot be trusted - restore it from another owner or re-run the transfer")


@dataclass(frozen=True)
class Meta:
    version: int
    partition: int
    page_size: int
    page_count: int
    counter: int


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


def valid_page_size(n: int) -> bool:
    return MIN_PAGE_SIZE <= n <= MAX_PAGE_SIZE and n & (n - 1) == 0


def page_crc(buf: bytes | bytearray | memoryview) -> int:
    return crc32c.crc32c(memoryview(buf)[4:])


def seal(buf: bytearray) -> None:
    """Store the CRC of ``buf`` in its header (done when a page is written)."""
    struct.pack_into("<I", buf, 0, page_crc(buf))


def encode_meta(partition: int, page_size: int, page_count: int, counter: int) -> bytearray:
    buf = bytearray(page_size)
    HEADER.pack_into(buf, 0, 0, 0, PageType.META, 0, 0, 0)
    META.pack_into(buf, HDR, MAGIC, FORMAT_VERSION, 0, partition, page_size, page_count, counter)
    seal(buf)
    return buf


def entry_size(key_len: int, stored_value_len: int) -> int:
    return ENTRY.size + key_len + stored_value_len


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


def overflow_chain(read_page: Callable[[int], bytes], first: int, length: int,
                   page_size: int, page_count: int) -> tuple[bytes | None, PageProblem | None, list[int]]:
    """Follow an overflow chain; returns (value, problem, pages of the chain)."""
    parts: list[bytes] = []
    pages: list[int] = []
    got, page = 0, first
    while got < length:
        if not 0 < page < page_count or page in pages:
            at = pages[-1] if pages else first
            return None, PageProblem(at, at * page_size,
                                     f"overflow chain points to page {page} (page count {page_count})"), pages
        buf = read_page(page)
        reason = check_page(buf, page, page_size)
        if reason is None and buf[8] != PageType.OVERFLOW:
            reason = f"page of an overflow chain has type {PageType(buf[8]).name}"
        if reason:
            return None, PageProblem(page, page * page_size, reason), pages
        _crc, _i, _t, _f, used, nxt = HEADER.unpack_from(buf, 0)
        parts.append(bytes(buf[HDR:HDR + used]))
        pages.append(page)
        got += used
        page = nxt
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
    """Sequential reads of whole pages in large chunks, plus random page reads for
    overflow chains."""

    # Big sequential reads: one syscall per ~500 4 KiB pages, and the chunk stays a
    # ``bytes`` so that slicing it yields keys and values with a single copy.
    CHUNK = 1 << 21

    def __init__(self, path: str, meta: Meta) -> None:
        self.path, self.meta = path, meta
        self.fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size

    def close(self) -> None:
        os.close(self.fd)

    def page(self, i: int) -> bytes:
        return os.pread(self.fd, self.meta.page_size, i * self.meta.page_size)

    def chunks(self, start: int = 1, stop: int | None = None) -> Iterator[tuple[int, bytes]]:
        """(index of the first page, bytes of up to CHUNK of pages) for pages
        [start, stop); the last chunk of a truncated file is short (a partial page at
        its end is left to the caller)."""
        ps = self.meta.page_size
        count = self.meta.page_count if stop is None else min(stop, self.meta.page_count)
        per = max(1, self.CHUNK // ps)
        for first in range(max(1, start), count, per):
            n = min(per, count - first)
            chunk = os.pread(self.fd, n * ps, first * ps)
            yield first, chunk
            if len(chunk) < n * ps:
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
    r = _Reader(path, meta)
    ps, pcount = meta.page_size, meta.page_count
    crc = crc32c.crc32c
    try:
        trunc = _truncation(r)
        start, stop = pages if pages is not None else (1, None)
        if stop is not None and stop < pcount:
            trunc = None                       # the range ends before the file end
        for first, chunk in r.chunks(start, stop):
            view = memoryview(chunk)
            acc: list = []
            for j in range(len(chunk) // ps):
                index, base = first + j, j * ps
                stored, idx, ptype, _f, count, heap = _unpack_header(chunk, base)
                if ptype != _DATA or idx != index or stored != crc(view[base + 4:base + ps]):
                    reason = check_page(view[base:base + ps], index, ps)
                    if reason:
                        if acc:
                            yield acc
                            acc = []
                        problem(PageProblem(index, index * ps, reason))
                        continue
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
                    yield from _overflow_page(r, view[base:base + ps], tombstones, pairs, problem)
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


def _overflow_page(r: _Reader, page: memoryview, tombstones: bool, pairs: bool,
                   problem: Callable[[PageProblem], None]) -> Iterator[list]:
    """A valid DATA page with overflow entries, entry by entry (the reference path)."""
    ps, pcount = r.meta.page_size, r.meta.page_count
    items: list = []
    for _s, flags, key, counter, vlen, where in page_entries(page):
        if flags & F_TOMBSTONE:
            if tombstones:
                items.append((key, None) if pairs else Entry(key, None, counter, True))
            continue
        if flags & F_OVERFLOW:
            value, bad, _pages = overflow_chain(r.page, where, vlen, ps, pcount)
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
