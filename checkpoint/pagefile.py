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
    """Sequential page reads in large chunks plus random reads for overflow chains."""

    CHUNK = 1 << 20

    def __init__(self, path: str, meta: Meta) -> None:
        self.path, self.meta = path, meta
        self.fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size

    def close(self) -> None:
        os.close(self.fd)

    def page(self, i: int) -> bytes:
        return os.pread(self.fd, self.meta.page_size, i * self.meta.page_size)

    def pages(self) -> Iterator[tuple[int, memoryview]]:
        ps, count = self.meta.page_size, self.meta.page_count
        per = max(1, self.CHUNK // ps)
        for first in range(1, count, per):
            n = min(per, count - first)
            chunk = memoryview(os.pread(self.fd, n * ps, first * ps))
            for j in range(n):
                yield first + j, chunk[j * ps:(j + 1) * ps]


def _truncation(r: _Reader) -> PageProblem | None:
    ps, count = r.meta.page_size, r.meta.page_count
    if r.size < count * ps:
        have = r.size // ps
        return PageProblem(have, have * ps, f"file truncated: {r.size} bytes, meta page count "
                                            f"{count} needs {count * ps}")
    return None


def iter_entries(path: str, *, include_tombstones: bool = True,
                 on_error: Callable[[PageProblem], None] | None = None) -> Iterator[Entry]:
    """Every entry of ``path`` in page order.  ``on_error=None``: raise CorruptPageError
    at the first bad page; otherwise report each problem to ``on_error`` and skip it."""

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
    try:
        trunc = _truncation(r)
        for index, buf in r.pages():
            if len(buf) < meta.page_size:
                break                          # reported by trunc below
            reason = check_page(buf, index, meta.page_size)
            if reason:
                problem(PageProblem(index, index * meta.page_size, reason))
                continue
            if buf[8] != _DATA:
                continue
            for _s, flags, key, counter, vlen, where in page_entries(buf):
                if flags & F_TOMBSTONE:
                    if include_tombstones:
                        yield Entry(key, None, counter, True)
                    continue
                if flags & F_OVERFLOW:
                    value, bad, _pages = overflow_chain(r.page, where, vlen, meta.page_size,
                                                        meta.page_count)
                    if bad:
                        problem(bad)
                        continue
                else:
                    value = bytes(buf[where:where + vlen])
                yield Entry(key, value, counter, False)
        if trunc:
            problem(trunc)
    finally:
        r.close()


def verify(path: str) -> list[PageProblem]:
    """Every problem of ``path``: page CRCs and structure, overflow chains, truncation."""
    problems: list[PageProblem] = []
    for _ in iter_entries(path, on_error=problems.append):
        pass
    return sorted(set(problems), key=lambda p: (p.page, p.reason))
