"""Corrupt overflow chains: cycles, links to page 0 or past the end, chains longer than
their value allows. Every reader that follows chains (the decoder, the bulk decoder,
``ferry partition verify|dump``, the store's get/put/scan) must stop with a clear
CorruptPageError naming the file, the page and the fault - never loop (each case runs
under a timeout)."""
from __future__ import annotations

import os
import struct

import pytest
from click.testing import CliRunner

from checkpoint import pagefile
from checkpoint.cli import partition as cli
from checkpoint.pagefile import (HDR, CorruptPageError, iter_entries, iter_entry_batches,
                                 iter_live_batches, page_entries, read_meta, verify)

PS = 4096
SMALL, LARGE = 20_000, 200_000        # 5 and 50 overflow pages of 4080 bytes


def _chains(path: str) -> dict[bytes, tuple[int, list[int]]]:
    """key -> (DATA page of the entry, pages of its chain), read from the intact file."""
    out = {}
    with open(path, "rb") as f:
        data = f.read()
    count = read_meta(path).page_count
    for i in range(1, count):
        buf = data[i * PS:(i + 1) * PS]
        if buf[8] != pagefile.PageType.DATA:
            continue
        for _s, flags, key, _c, vlen, where in page_entries(buf):
            if flags & pagefile.F_OVERFLOW:
                pages, page, got = [], where, 0
                while got < vlen:
                    pages.append(page)
                    hdr = pagefile.HEADER.unpack_from(data, page * PS)
                    got += hdr[4]
                    page = hdr[5]
                out[key] = (i, pages)
    return out


def _edit(path: str, page: int, *, nxt: int | None = None, used: int | None = None) -> None:
    with open(path, "r+b") as f:
        f.seek(page * PS)
        buf = bytearray(f.read(PS))
        if nxt is not None:
            struct.pack_into("<I", buf, 12, nxt)
        if used is not None:
            struct.pack_into("<H", buf, 10, used)
        pagefile.seal(buf)                     # a valid page: only the chain is wrong
        f.seek(page * PS)
        f.write(buf)


def _first_link_to_zero(path: str, data_page: int, key: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(data_page * PS)
        buf = bytearray(f.read(PS))
        for s, flags, k, _c, _v, _w in page_entries(buf):
            if k == key:
                (off,) = pagefile.SLOT.unpack_from(buf, HDR + 2 * s)
                struct.pack_into("<I", buf, off + pagefile.ENTRY.size + len(k), 0)
        pagefile.seal(buf)
        f.seek(data_page * PS)
        f.write(buf)


# name -> corrupt(path, chains) returning (page named by the problem, reason fragment)
def _self_loop(path, ch):
    _d, pages = ch[b"small"]
    _edit(path, pages[1], nxt=pages[1])
    return pages[1], "loops"


def _two_cycle(path, ch):
    _d, pages = ch[b"small"]
    _edit(path, pages[2], nxt=pages[1])
    return pages[2], "loops"


def _zero_payload_self_loop(path, ch):
    _d, pages = ch[b"small"]                   # a page adding no bytes, pointing at itself
    _edit(path, pages[1], nxt=pages[1], used=0)
    return pages[1], "loops"


def _mid_chain_to_page_zero(path, ch):
    _d, pages = ch[b"small"]
    _edit(path, pages[2], nxt=0)
    return pages[2], "ends after"


def _first_link_to_page_zero(path, ch):
    data_page, _pages = ch[b"small"]
    _first_link_to_zero(path, data_page, b"small")
    return data_page, "starts at page 0"


def _past_the_end(path, ch):
    _d, pages = ch[b"small"]
    _edit(path, pages[1], nxt=read_meta(path).page_count + 5)
    return pages[1], "past the end"


def _longer_than_length(path, ch):
    # the small value's pages hold less than declared, and its last page runs on into
    # the large value's (valid) chain: more pages than 20,000 bytes can need
    _d, pages = ch[b"small"]
    _edit(path, pages[0], used=100)
    _edit(path, pages[-1], nxt=ch[b"large"][1][0])
    return pages[-1], "longer than its value allows"


CASES = [("self-loop", _self_loop), ("2-cycle", _two_cycle),
         ("self-loop of an empty page", _zero_payload_self_loop),
         ("chain ends at page 0", _mid_chain_to_page_zero),
         ("entry points at page 0", _first_link_to_page_zero),
         ("chain points past the end", _past_the_end),
         ("chain longer than the length", _longer_than_length)]


@pytest.fixture
def chained(open_store):
    s = open_store(page_size=PS)
    for i in range(20):
        s.put(7, b"k%02d" % i, b"v" * 50)
    s.put(7, b"small", os.urandom(SMALL))
    s.put(7, b"large", os.urandom(LARGE))
    s.put(7, b"tail", b"t" * 50)
    s.close()
    path = s.partition_path(7)
    return open_store, path, _chains(path)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("name,corrupt", CASES, ids=[c[0] for c in CASES])
def test_corrupt_chain_gives_clear_error(chained, name, corrupt) -> None:
    open_store, path, chains = chained
    assert len(chains[b"small"][1]) == 5 and len(chains[b"large"][1]) == 50
    page, reason = corrupt(path, chains)
    before = open(path, "rb").read()

    problems = verify(path)
    assert problems and problems[0].page == page and reason in problems[0].reason, problems
    for decode in (iter_entries, lambda p: (e for b in iter_entry_batches(p) for e in b),
                   lambda p: (e for b in iter_live_batches(p) for e in b)):
        with pytest.raises(CorruptPageError) as ei:
            list(decode(path))
        msg = str(ei.value)
        assert path in msg and f"page {page} " in msg and reason in msg, msg
    # lenient decoding reports the bad entry and still hands out every other one
    seen: list = []
    keys = {e.key for e in iter_entries(path, include_tombstones=False, on_error=seen.append)}
    assert seen and b"small" not in keys and b"tail" in keys and b"k05" in keys

    r = CliRunner().invoke(cli, ["verify", path])
    assert r.exit_code == 1 and f"page {page} " in r.output and reason in r.output, r.output
    r = CliRunner().invoke(cli, ["dump", path])
    assert r.exit_code == 1 and f"page {page} " in r.output, r.output

    # the store: reads and overwrites of the value raise, other keys still work, and the
    # file is not changed
    s = open_store(page_size=PS)
    assert s.get(7, b"k03") == b"v" * 50
    with pytest.raises(CorruptPageError, match=f"page {page} "):
        s.get(7, b"small")
    with pytest.raises(CorruptPageError, match=f"page {page} "):
        list(s.scan(7))
    with pytest.raises(CorruptPageError, match=f"page {page} "):
        s.put(7, b"small", b"x" * 10)
    s.close(checkpoint=False)
    assert open(path, "rb").read() == before


def test_chain_limit() -> None:
    payload = PS - HDR
    assert pagefile.chain_limit(1, PS) == 1
    assert pagefile.chain_limit(payload, PS) == 1
    assert pagefile.chain_limit(payload + 1, PS) == 2
    assert pagefile.chain_limit(SMALL, PS) == 5
