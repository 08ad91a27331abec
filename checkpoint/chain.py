"""Overflow chains: the rules of a value's chain of OVERFLOW pages, and the walks.

:func:`chain_link_problem` is the one statement of the rules (the decoder, the
store's chain walks and the C walk of ``_pageaccel.chain_value`` keep them): a chain
ends exactly at its value's length, never visits page 0 or a page past the end, never
loops and has at most :func:`chain_limit` pages.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable

from faults.crc import crc32c

from . import accel as _switch
from .check import PageProblem, check_page
from .layout import CRC_FROM, HDR, HEADER, OFF_TYPE, T_OVERFLOW, PageType, read_header

if TYPE_CHECKING:
    from .reader import PageReader

_unpack_header = HEADER.unpack_from


def chain_limit(length: int, page_size: int) -> int:
    """The most pages an overflow chain of a ``length``-byte value may have: a writer
    fills every page but the last (``ceil(length / payload)``); a longer chain is
    corrupt. Bounding the walk by it (and by never revisiting a page) is what keeps a
    cyclic or runaway chain from looping forever."""
    payload = page_size - HDR
    return max(1, -(-length // payload))


def chain_link_problem(at: int, page: int, got: int, length: int, visited: set[int], page_size: int,
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
    parts: list[memoryview] = []
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
        if reason is None and buf[OFF_TYPE] != PageType.OVERFLOW:
            reason = f"page of an overflow chain has type {PageType(buf[OFF_TYPE]).name}"
        if reason:
            return None, PageProblem(page, page * page_size, reason), pages
        head = read_header(buf)
        used, nxt = head.count, head.aux
        parts.append(memoryview(buf)[HDR:HDR + used])
        pages.append(page)
        visited.add(page)
        got += used
        at, page = page, nxt
    if got != length:
        return None, PageProblem(pages[-1], pages[-1] * page_size,
                                 f"overflow chain holds {got} bytes, entry says {length}"), pages
    return b"".join(parts), None, pages


def chain_value(r: PageReader, page: int, length: int, origin: int) -> bytes | None:
    """:func:`chain_value_py`, by the C walk when the accelerator is on (same rules,
    same pages marked checked, pages from ``r.held``)."""
    accel = _switch.page
    if accel is not None:
        return accel.chain_value(page, length, r.meta.page_size, r.meta.page_count,
                                 r.checked, r.held)
    return chain_value_py(r, page, length, origin)


def chain_value_py(r: PageReader, page: int, length: int, origin: int) -> bytes | None:
    """The value of an intact overflow chain, or None when anything is wrong with it
    (the caller then runs :func:`overflow_chain`, which names the fault). The bulk
    path's chain walk: the same rules, pages taken from the reader's chunks (one
    ``pread`` per page only outside them), each page CRC-checked once (``r.checked``),
    and the value joined from views of the chunks (one copy)."""
    ps, pcount = r.meta.page_size, r.meta.page_count
    checked = r.checked
    ncheck, room, limit = len(checked), ps - HDR, chain_limit(length, ps)
    crc = crc32c
    parts: list[memoryview] = []
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
        if ptype != T_OVERFLOW:
            return None
        if not (page < ncheck and checked[page]):
            if idx != page or used > room or stored != crc(mv[base + CRC_FROM:base + ps]):
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
