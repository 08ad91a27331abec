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
                    value, bad, _ = overflow_chain(page, where, vlen, ps, count)
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
    monkeypatch.setattr(pagefile._Reader, "CHUNK", 3 * 1024)   # many small chunks
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
