"""The fast decoder (chunked reads, one pass per page, batches) against the reference:
the page-by-page decoder built from the public per-page functions (check_page,
page_entries, overflow_chain), as iter_entries was before it was made fast. Same
entries, same problems, in the same order, strict and lenient, on intact files and on
hundreds of corrupted ones (re-sealed, so the slot structure checks are reached)."""
from __future__ import annotations

import os
import random
import shutil
import struct

import pytest

from checkpoint import pagefile
from checkpoint.pagefile import (F_OVERFLOW, F_TOMBSTONE, CorruptPageError, Entry, PageProblem,
                                 check_page, iter_entries, iter_entry_batches,
                                 iter_live_batches, overflow_chain, page_entries, read_meta)


def reference_iter(path, *, include_tombstones=True, on_error=None):
    """The reference decoder: one pread and one check_page per page."""
    def problem(p):
        if on_error is None:
            raise CorruptPageError(path, p.page, p.offset, p.reason)
        on_error(p)

    try:
        meta = read_meta(path)
    except CorruptPageError as e:
        problem(PageProblem(0, 0, e.reason))
        return
    ps, count = meta.page_size, meta.page_count
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size

        def page(i):
            return os.pread(fd, ps, i * ps)

        for index in range(1, count):
            buf = page(index)
            if len(buf) < ps:
                break
            reason = check_page(buf, index, ps)
            if reason:
                problem(PageProblem(index, index * ps, reason))
                continue
            if buf[8] != pagefile.PageType.DATA:
                continue
            for _s, flags, key, counter, vlen, where in page_entries(buf):
                if flags & F_TOMBSTONE:
                    if include_tombstones:
                        yield Entry(key, None, counter, True)
                    continue
                if flags & F_OVERFLOW:
                    value, bad, _ = overflow_chain(page, where, vlen, ps, count, index)
                    if bad:
                        problem(bad)
                        continue
                else:
                    value = bytes(buf[where:where + vlen])
                yield Entry(key, value, counter, False)
        if size < count * ps:
            have = size // ps
            problem(PageProblem(have, have * ps, f"file truncated: {size} bytes, meta page "
                                                 f"count {count} needs {count * ps}"))
    finally:
        os.close(fd)


def events(decode, path, strict, **kw):
    """What a consumer sees: entries and problems interleaved, and the final error."""
    out = []
    try:
        if strict:
            for e in decode(path, **kw):
                out.append(("entry", tuple(e)))
        else:
            for e in decode(path, on_error=lambda p: out.append(("problem", p)), **kw):
                out.append(("entry", tuple(e)))
    except CorruptPageError as e:
        out.append(("raised", str(e)))
    return out


def batched_as_entries(path, **kw):
    for batch in iter_entry_batches(path, **kw):
        assert batch, "no empty batches"
        yield from batch


def live_pairs(path, **kw):
    for batch in iter_live_batches(path, **kw):
        assert batch, "no empty batches"
        yield from batch


def build(open_store, page_size):
    s = open_store(page_size=page_size)
    rnd = random.Random(page_size)
    for i in range(300):
        s.put(7, b"key-%04d" % i, bytes([i % 251]) * rnd.choice([0, 5, 90, 700, 3000]))
    s.put(7, b"big", os.urandom(20_000))              # a long overflow chain
    for i in range(0, 300, 7):
        s.remove(7, b"key-%04d" % i)
    s.close()
    return s.partition_path(7)


def same_everywhere(path):
    for strict in (True, False):
        for tombs in (True, False):
            want = events(reference_iter, path, strict, include_tombstones=tombs)
            assert events(iter_entries, path, strict, include_tombstones=tombs) == want
            assert events(batched_as_entries, path, strict, include_tombstones=tombs) == want
        want = events(reference_iter, path, strict, include_tombstones=False)
        got = events(live_pairs, path, strict)
        assert got == [("entry", (e[1][0], e[1][1])) if e[0] == "entry" else e for e in want]
    return want


@pytest.mark.parametrize("page_size", [1024, 4096])
def test_intact_files_decode_like_the_reference(open_store, page_size) -> None:
    path = build(open_store, page_size)
    seen = same_everywhere(path)
    assert sum(1 for kind, _ in seen if kind == "entry") == 300 - 43 + 1
    assert all(kind == "entry" for kind, _ in seen)


def _mutate(path: str, rnd: random.Random, page_size: int, page_count: int) -> None:
    with open(path, "r+b") as f:
        index = rnd.randrange(page_count)
        f.seek(index * page_size)
        buf = bytearray(f.read(page_size))
        for _ in range(rnd.choice([1, 1, 2, 3])):
            if rnd.random() < 0.6:                      # header, slots, first entries
                off = rnd.randrange(4, min(page_size, 96))
            else:
                off = rnd.randrange(4, page_size)
            buf[off] ^= 1 << rnd.randrange(8) if rnd.random() < 0.7 else rnd.randrange(1, 256)
        if rnd.random() < 0.85:
            pagefile.seal(buf)                          # reach the structure checks
        f.seek(index * page_size)
        f.write(buf)


@pytest.mark.parametrize("page_size", [1024, 4096])
def test_corrupted_files_decode_like_the_reference(open_store, tmp_path, page_size) -> None:
    clean = build(open_store, page_size)
    count = read_meta(clean).page_count
    rnd = random.Random(20240 + page_size)
    path = str(tmp_path / "bad.bin")
    kinds = set()
    for _ in range(40):
        shutil.copyfile(clean, path)
        _mutate(path, rnd, page_size, count)
        seen = same_everywhere(path)
        kinds.update(p.reason.split(":")[0].split("(")[0].strip()
                     for k, p in seen if k == "problem")
    # the mutations reached the structure checks, not only the CRC
    assert any("slot" in k for k in kinds) and any("CRC" in k for k in kinds), kinds


def test_chunk_boundaries_and_truncation(open_store, tmp_path, monkeypatch) -> None:
    clean = build(open_store, 1024)
    monkeypatch.setattr(pagefile.PageReader, "CHUNK", 3 * 1024)   # many small chunks
    same_everywhere(clean)
    size = os.path.getsize(clean)
    for cut in (size - 1024, size - 1500, 5 * 1024 + 10, 2048, 1100):
        path = str(tmp_path / f"cut-{cut}.bin")
        shutil.copyfile(clean, path)
        os.truncate(path, cut)
        seen = same_everywhere(path)                 # lenient: truncation comes last
        assert seen[-1][0] == "problem" and "truncated" in seen[-1][1].reason, seen[-1]


def test_bad_chain_in_strict_mode_hands_out_what_came_before(open_store, tmp_path) -> None:
    """A broken overflow chain in the middle of a page: the entries before it on that
    page are handed out, then the error is raised (as entry by entry)."""
    path = build(open_store, 1024)
    meta = read_meta(path)
    with open(path, "r+b") as f:
        for i in range(1, meta.page_count):
            f.seek(i * 1024)
            buf = bytearray(f.read(1024))
            if buf[8] == pagefile.PageType.OVERFLOW:
                struct.pack_into("<I", buf, 12, 0)           # cut the chain short
                struct.pack_into("<H", buf, 10, 3)
                pagefile.seal(buf)
                f.seek(i * 1024)
                f.write(buf)
                break
    same_everywhere(path)
    seen = events(iter_entries, path, True)
    assert seen[-1][0] == "raised" and "overflow chain" in seen[-1][1], seen[-1]
    assert len(seen) > 1


def test_not_a_file_or_bad_meta_raises_like_the_reference(tmp_path) -> None:
    p = tmp_path / "x.bin"
    p.write_bytes(b"hello")
    assert same_everywhere(str(p))[0][0] == "problem"
    assert events(iter_entries, str(p), True)[0][0] == "raised"
    with pytest.raises(FileNotFoundError):
        next(iter_live_batches(str(tmp_path / "missing.bin")))


# -- overflow-heavy files: chains taken from the read chunks, each page checked once --
def build_overflow(open_store, page_size=1024, n=40):
    """Many values of several overflow pages each, some rewritten (so FREE pages are
    reused and some chains are no longer contiguous), plus inline entries."""
    s = open_store(page_size=page_size)
    rnd = random.Random(n)
    for i in range(n):
        s.put(7, b"doc-%04d" % i, os.urandom(rnd.choice([3000, 6000, 9000])))
        if i % 5 == 0:
            s.put(7, b"small-%04d" % i, b"s" * 40)
    s.checkpoint()
    for i in range(0, n, 4):                            # rewrite: freed pages get reused
        s.put(7, b"doc-%04d" % i, os.urandom(rnd.choice([2500, 7000])))
    for i in range(0, n, 9):
        s.remove(7, b"doc-%04d" % i)
    s.close()
    return s.partition_path(7)


def _mutate_chain(path: str, rnd: random.Random, page_size: int, page_count: int) -> None:
    """Re-sealed edits of overflow pages' links and lengths (the chain checks), or a
    flipped byte anywhere (the page checks)."""
    with open(path, "r+b") as f:
        data = f.read()
        ovf = [i for i in range(1, page_count)
               if data[i * page_size + 8] == pagefile.PageType.OVERFLOW]
        index = rnd.choice(ovf) if ovf and rnd.random() < 0.8 else rnd.randrange(page_count)
        buf = bytearray(data[index * page_size:(index + 1) * page_size])
        what = rnd.randrange(5)
        if what == 0:
            struct.pack_into("<I", buf, 12, index)                       # self-loop
        elif what == 1:
            struct.pack_into("<I", buf, 12, rnd.choice(ovf + [0, page_count + 3]))
        elif what == 2:
            struct.pack_into("<H", buf, 10, rnd.randrange(page_size - 16))
        elif what == 3:
            buf[rnd.randrange(4, page_size)] ^= 0x40                    # payload byte
        else:
            buf[8] = pagefile.PageType.FREE if rnd.random() < 0.5 else pagefile.PageType.DATA
        if rnd.random() < 0.9:
            pagefile.seal(buf)
        f.seek(index * page_size)
        f.write(buf)


@pytest.mark.parametrize("chunk,lookahead", [(1 << 21, 16 << 20), (4 * 1024, 8 * 1024),
                                             (16 * 1024, 1024)])
def test_overflow_heavy_files_decode_like_the_reference(open_store, tmp_path, monkeypatch,
                                                        chunk, lookahead) -> None:
    """Chunk/look-ahead sizes: everything in one chunk; small chunks pulled ahead by
    chains; no look-ahead at all (chains ahead of the chunk read by pread)."""
    monkeypatch.setattr(pagefile.PageReader, "CHUNK", chunk)
    monkeypatch.setattr(pagefile.PageReader, "LOOKAHEAD", lookahead)
    clean = build_overflow(open_store)
    count = read_meta(clean).page_count
    seen = same_everywhere(clean)
    assert all(k == "entry" for k, _ in seen)
    rnd = random.Random(chunk + lookahead)
    path = str(tmp_path / "bad.bin")
    reasons = set()
    for _ in range(20):
        shutil.copyfile(clean, path)
        _mutate_chain(path, rnd, 1024, count)
        reasons.update(p.reason.split(":")[0].split(" page")[0]
                       for k, p in same_everywhere(path) if k == "problem")
    assert any("loops" in r for r in reasons), reasons
    assert any("overflow chain" in r for r in reasons), reasons


def test_each_page_checked_once(open_store, monkeypatch) -> None:
    path = build_overflow(open_store)
    calls: list[int] = []
    real = pagefile.check_page

    def counting(buf, index, page_size):
        calls.append(index)
        return real(buf, index, page_size)

    from checkpoint import chain, check, decode   # every module that calls check_page
    for mod in (chain, check, decode):
        monkeypatch.setattr(mod, "check_page", counting)
    reads: list[int] = []
    real_pread = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, off: reads.append(n) or
                        real_pread(fd, n, off))
    n = sum(len(b) for b in iter_live_batches(path))
    assert n > 30
    assert len(calls) == len(set(calls)), "a page was checked twice"
    # the whole small file is one chunk: no per-page reads for the chains
    assert all(r > 1024 for r in reads), reads


def reference_page_keys(path):
    """The store's open-time scan as it was: check_page, then page_entries, per page."""
    meta = read_meta(path)
    ps = meta.page_size
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < meta.page_count * ps:
        raise CorruptPageError(path, len(data) // ps, len(data) // ps * ps, "file truncated")
    out = []
    for i in range(1, meta.page_count):
        buf = data[i * ps:(i + 1) * ps]
        reason = check_page(buf, i, ps)
        if reason:
            raise CorruptPageError(path, i, i * ps, reason)
        if buf[8] == pagefile.PageType.FREE:
            out.append((i, int(pagefile.PageType.FREE), 0, []))
        elif buf[8] == pagefile.PageType.DATA:
            used = 16 + 2 * pagefile.HEADER.unpack_from(buf, 0)[4]
            keys = []
            for slot, flags, key, _c, vlen, _w in page_entries(buf):
                keys.append((slot, key))
                used += 15 + len(key) + (4 if flags & F_OVERFLOW else vlen)
            out.append((i, int(pagefile.PageType.DATA), used, keys))
    return out


def _page_keys(decode, path):
    try:
        return [tuple(x) for x in decode(path)]
    except CorruptPageError as e:
        return ("raised", e.page, e.reason.split(":")[0])


def test_page_keys_like_the_store_scan(open_store, tmp_path) -> None:
    clean = build_overflow(open_store)
    want = _page_keys(reference_page_keys, clean)
    assert want and _page_keys(pagefile.iter_page_keys, clean) == want
    count = read_meta(clean).page_count
    rnd = random.Random(5)
    path = str(tmp_path / "bad.bin")
    for _ in range(30):
        shutil.copyfile(clean, path)
        _mutate(path, rnd, 1024, count)
        got, want = _page_keys(pagefile.iter_page_keys, path), _page_keys(reference_page_keys, path)
        assert got == want or (got[0] == want[0] == "raised" and got[1:] == want[1:])
    os.truncate(path, os.path.getsize(clean) - 1500)
    assert _page_keys(pagefile.iter_page_keys, path)[0] == "raised"
