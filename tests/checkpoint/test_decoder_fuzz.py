"""Random flips in a partition file: a corruption error, never a silently different page.

One file is written by a real store (small and large values, values of zeros, an
overflow chain, tombstones, a page size of 4 KiB); hypothesis then flips one byte in
each of up to three pages anywhere in the file (meta page included) and decodes the
copy with the pure-Python decoder and, when it is built, the C accelerator:

* strict reading (``iter_entries``, ``iter_live_batches``) raises CorruptPageError naming
  a page that was damaged;
* ``check_page`` finds every damaged page bad, ``check_pages`` the first of them;
* lenient reading (``on_error``) reports a damaged page and hands out only entries that
  the undamaged file holds, identical in key, value, counter and tombstone -- what a
  damaged page held is left out, never replaced by something else.

A CRC32C catches every error burst of up to 32 bits, so one flipped byte per page is
always detected; the test holds the decoder to it on every path.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpoint import accel as switch
from checkpoint import PartitionStore
from checkpoint.pagefile import (CorruptPageError, check_page, check_pages, iter_entries,
                                 iter_live_batches, read_meta, verify)

PAGE = 4096
PART = 7


@pytest.fixture(scope="module")
def good_file():
    """(path, page count, every entry, live pairs) of an undamaged partition file."""
    tmp = tempfile.mkdtemp(prefix="pagefuzz-")
    s = PartitionStore.open(os.path.join(tmp, "store"), page_size=PAGE,
                            checkpoint_interval=None, wal_sync="none")
    s.create_partition(PART)
    for i in range(400):
        k = b"key-%04d" % i
        v = bytes(i * 13 % 2500) if i % 4 == 0 else bytes([i % 251]) * (i * 37 % 1500)
        s.put(PART, k, v)
    s.put(PART, b"big", os.urandom(60_000))          # an overflow chain of ~15 pages
    s.put(PART, b"big-zeros", bytes(30_000))         # one of zeros
    for i in range(0, 400, 9):
        s.remove(PART, b"key-%04d" % i)
    path = s.partition_path(PART)
    s.close()
    good = os.path.join(tmp, "good.bin")
    shutil.copyfile(path, good)
    pages = read_meta(good).page_count
    entries = list(iter_entries(good))
    live = [pair for b in iter_live_batches(good) for pair in b]
    yield good, pages, entries, live
    shutil.rmtree(tmp)


def _modes() -> list[object]:
    return [None] + ([switch.page] if switch.page is not None else [])


flips = st.lists(st.tuples(st.integers(0, 2**31), st.integers(0, PAGE - 1), st.integers(1, 255)),
                 min_size=1, max_size=3)


@settings(max_examples=250, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(flips=flips)
def test_a_flipped_byte_is_an_error_never_a_different_page(good_file, tmp_path, flips) -> None:
    good, pages, entries, live = good_file
    data = bytearray(open(good, "rb").read())
    damaged: dict[int, int] = {}
    for page_seed, at, mask in flips:
        page = page_seed % pages
        if page in damaged:
            continue                                  # one flipped byte per page
        damaged[page] = at
        data[page * PAGE + at] ^= mask
    path = str(tmp_path / "damaged.bin")
    with open(path, "wb") as f:
        f.write(data)

    for page, at in damaged.items():
        assert check_page(data[page * PAGE:(page + 1) * PAGE], page, PAGE) is not None, \
            (page, at)
    saved = switch.page
    try:
        for accel in _modes():
            switch.page = accel
            first, reason = check_pages(data, 0, PAGE)
            assert first == min(damaged) and reason, (first, damaged, accel)

            with pytest.raises(CorruptPageError) as ei:
                list(iter_entries(path))
            assert ei.value.page in damaged, (ei.value, damaged)
            with pytest.raises(CorruptPageError) as ei:
                for _ in iter_live_batches(path):
                    pass
            assert ei.value.page in damaged, (ei.value, damaged)

            problems = []
            kept = list(iter_entries(path, on_error=problems.append))
            assert problems and {p.page for p in problems} <= set(damaged), (problems, damaged)
            assert set(kept) <= set(entries), "a damaged file decoded to an entry it never held"
            if 0 not in damaged:
                assert {p.page for p in verify(path)} >= set(damaged)
    finally:
        switch.page = saved
