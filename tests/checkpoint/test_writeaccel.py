"""The C page writer (checkpoint/_writeaccel.c) against the pure-Python path: the same
bytes from each function on random pages and values, the same partition state (every
page in page memory, LRU order, dirty set, space maps, key index, files after a
checkpoint) after random puts/overwrites/deletes of values from 0 B to several pages,
and clear errors (nothing changed) for bad input.

Both paths run in one process: ``page.use_accelerator`` binds ``page.insert`` and the
others to the C or the Python functions (the whole module also runs with
``FERRY_PAGE_ACCEL=0``, where only the pure-Python path exists)."""
from __future__ import annotations

import importlib
import os
import random
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpoint import PartitionStore
from checkpoint import page as pg
from checkpoint.pagefile import (HDR, CorruptPageError, EntryFlag, PageType, check_page,
                                 iter_entries, seal)

try:
    BUILT = importlib.import_module("checkpoint._writeaccel")
    if getattr(BUILT, "ABI_VERSION", None) != pg._ACCEL_ABI:
        BUILT = None
except ImportError:
    BUILT = None
needs_c = pytest.mark.skipif(BUILT is None, reason="checkpoint._writeaccel is not built "
                                                   "(no C compiler at install time)")
C = BUILT
PY = {"insert": pg.insert_py, "delete": pg.delete_py, "read_entry": pg.read_entry_py,
      "compact": pg.compact_py, "chain_pages": pg.chain_pages_py}


@contextmanager
def accel(on: bool):
    """Run the block with the write path in C (``on``) or pure Python."""
    was = pg.accelerator() is not None
    pg.use_accelerator(on)
    try:
        yield
    finally:
        pg.use_accelerator(was)


def test_switch_and_env() -> None:
    with accel(False):
        assert pg.accelerator() is None and pg.insert is pg.insert_py
    with accel(True):
        assert pg.accelerator() == ("c" if pg._accel is not None else None)
    if os.environ.get("FERRY_PAGE_ACCEL", "1").strip().lower() in ("0", "off", "no", "false"):
        assert pg._accel is None and pg.accelerator() is None


@pytest.mark.parametrize("value, want", [("0", "None"), ("off", "None"), ("1", "c")])
def test_env_switch_in_a_fresh_process(py_env, python, value, want) -> None:
    """FERRY_PAGE_ACCEL (one switch for every checkpoint C path) is read at import."""
    import subprocess
    env = dict(py_env, FERRY_PAGE_ACCEL=value)
    out = subprocess.run([python, "-c", "from checkpoint import page; print(page.accelerator())"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == (want if BUILT is not None else "None")


NO_BUILD = """
import sys, types, tempfile
if {fake_abi} is None:
    sys.modules["checkpoint._writeaccel"] = None          # import fails: not built
else:
    fake = types.ModuleType("checkpoint._writeaccel")
    fake.ABI_VERSION = {fake_abi}                          # a build of another version
    sys.modules["checkpoint._writeaccel"] = fake
from checkpoint import PartitionStore, page
assert page.accelerator() is None and page.insert is page.insert_py
s = PartitionStore.open(tempfile.mkdtemp(), page_size=1024, wal_sync="none")
s.apply_many(0, [(b"k%d" % i, b"v" * (i * 97), i + 1) for i in range(60)], logged=False)
assert all(s.get(0, b"k%d" % i) == b"v" * (i * 97) for i in range(60))
s.close()
print("pure")
"""


@pytest.mark.parametrize("fake_abi", [None, 99])
def test_without_the_extension_the_pure_path_runs(py_env, python, fake_abi) -> None:
    """No compiler at install (the import fails) or a stale build (another ABI_VERSION):
    the pure-Python writer runs, and the store works."""
    import subprocess
    out = subprocess.run([python, "-c", NO_BUILD.format(fake_abi=fake_abi)], env=py_env,
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "pure"


# -- page functions, C against Python ---------------------------------------------------
def data_page(page_size: int, index: int = 5) -> bytearray:
    return pg.new_page(index, page_size, PageType.DATA)


PAGE_OPS = st.lists(st.tuples(st.sampled_from(["ins", "ins", "ins", "del"]),
                              st.integers(0, 10**6), st.integers(0, 700),
                              st.integers(0, 40)), max_size=60)


@needs_c
@settings(max_examples=150, deadline=None)
@given(ops=PAGE_OPS, page_size=st.sampled_from([1024, 4096]))
def test_slotted_page_ops_same_bytes(ops, page_size) -> None:
    """insert/delete/read_entry/compact: same results and bytes after every step,
    including full pages (None), slot reuse, directory trimming and compaction."""
    a, b = data_page(page_size), data_page(page_size)
    free = page_size - HDR
    live: list[tuple[int, int]] = []          # (slot, size)
    for kind, n, vlen, klen in ops:
        if kind == "del" and live:
            slot, size = live.pop(n % len(live))
            ea, eb = C.read_entry(a, slot), pg.read_entry_py(b, slot)
            assert ea == eb and ea[4] == size
            fa, fb = C.delete(a, slot, size), pg.delete_py(b, slot, size)
            assert fa == fb
            free += fa
        else:
            key = n.to_bytes(8, "little")[: klen % 9] + b"k" * (klen // 9)
            ovf = n % 3 == 0
            flags = int(EntryFlag.OVERFLOW) if ovf else (int(EntryFlag.TOMBSTONE) if n % 7 == 0 else 0)
            stored = (n % 4099).to_bytes(4, "little") if ovf else (b"" if flags else bytes([n % 251]) * vlen)
            value_len = vlen if ovf else len(stored)
            ra = C.insert(a, free, flags, key, n * 977, value_len, stored)
            rb = pg.insert_py(b, free, flags, key, n * 977, value_len, stored)
            assert ra == rb
            if ra is not None:
                slot, used = ra
                live.append((slot, 15 + len(key) + len(stored)))
                free -= used
        assert a == b
        assert free == pg.free_bytes(a)
    assert C.compact(a) == pg.compact_py(b) and a == b
    seal(a)
    assert check_page(a, 5, page_size) is None


@needs_c
@settings(max_examples=100, deadline=None)
@given(length=st.integers(0, 5 * 4080 + 7), page_size=st.sampled_from([1024, 4096]),
       spare=st.integers(0, 6), seed=st.integers(0, 2**32 - 1))
def test_chain_pages_same_bytes(length, page_size, spare, seed) -> None:
    rnd = random.Random(seed)
    value = rnd.randbytes(length)
    room = page_size - HDR
    count = max(1, -(-length // room))
    indexes = rnd.sample(range(1, 10 * count + 10), count)
    # spare buffers hold old page bytes: every byte of a built page must be written
    pool_a = [bytearray(rnd.randbytes(page_size)) for _ in range(spare)]
    pool_b = [bytearray(x) for x in pool_a]
    got_a = C.chain_pages(value, page_size, indexes, pool_a)
    got_b = pg.chain_pages_py(value, page_size, indexes, pool_b)
    assert got_a == got_b and pool_a == pool_b
    assert all(type(x) is bytearray and len(x) == page_size for x in got_a)
    taken = min(spare, count)
    assert len(pool_a) == spare - taken
    joined = b""
    for i, buf in enumerate(got_a):
        seal(buf)
        assert check_page(buf, indexes[i], page_size) is None
        assert buf[8] == PageType.OVERFLOW and pg.overflow_next(buf) == (indexes[i + 1] if i + 1 < count else 0)
        joined += bytes(buf[HDR:HDR + int.from_bytes(buf[10:12], "little")])
    assert joined == value


@needs_c
@pytest.mark.parametrize("ptype", list(PageType))
@pytest.mark.parametrize("page_size", [1024, 4096, 65536])
def test_new_page_same_bytes(ptype, page_size) -> None:
    assert C.new_page(7, page_size, ptype) == pg.new_page_py(7, page_size, ptype)
    old = bytearray(os.urandom(page_size))      # a reused buffer: every byte rewritten
    got = C.new_page(2**32 - 1, page_size, ptype, old)
    assert got is old and old == pg.new_page_py(2**32 - 1, page_size, ptype)


# -- whole partitions, C against Python -------------------------------------------------
KEYS = [b"k%d" % i for i in range(30)] + [b"long-key-" + b"x" * 40, b""[:0] + b"z"]
SIZES = st.one_of(st.integers(0, 40), st.integers(300, 700), st.integers(900, 3200))
STORE_OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), st.sampled_from(KEYS), SIZES),
    st.tuples(st.just("del"), st.sampled_from(KEYS), st.just(0)),
    st.tuples(st.just("ckpt"), st.just(b""), st.just(0)),
), min_size=1, max_size=120)


def state(store: PartitionStore, p: int) -> dict:
    """Everything the write path leaves in memory (key index last: its lookups touch
    the LRU order, the same way on both stores)."""
    mem, part = store.mem, store.parts[p]
    out = {"pages": [(k, bytes(b)) for k, b in mem.pages.items()],
           "dirty": sorted(mem.dirty), "spare": [bytes(b) for b in mem.spare],
           "evictions": mem.evictions, "page_count": part.page_count,
           "space": part.space.tobytes(), "roomy": sorted(part.roomy),
           "free_pages": list(part.free_pages), "fill": part.fill, "counter": part.counter,
           "undo": {k: ([(i, bytes(b)) for i, b in imgs], list(f))
                    for k, (imgs, f) in store.undo.pending.items()}}
    out["index"] = {k: part.index.get(k) for k in KEYS}
    return out


def run_ops(stores, ops, rnd: random.Random) -> None:
    """Apply ``ops`` to stores[0] with C and stores[1] in pure Python, comparing the
    state after each; and to a model, compared by reads at the end."""
    model: dict[bytes, bytes] = {}
    counter = 0
    limit = stores[0].mem.capacity * 0.35
    for kind, key, size in ops:
        if stores[0].mem.pressure >= limit:
            # the background checkpoint is off (it would run at different moments in
            # the two stores); one here keeps writers' admission from waiting for it
            for s in stores:
                s.checkpoint()
        if kind == "ckpt":
            for s in stores:
                s.checkpoint()
        else:
            counter += 1
            value = None if kind == "del" else rnd.randbytes(size)
            for s, on in zip(stores, (True, False)):
                with accel(on):
                    s.apply_many(0, [(key, value, counter)], logged=False)
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
        assert state(stores[0], 0) == state(stores[1], 0)
    for s in stores:
        for key in KEYS:
            assert s.get(0, key) == model.get(key)


@needs_c
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=STORE_OPS, seed=st.integers(0, 2**32 - 1), budget=st.sampled_from([32, 48, 4096]))
def test_random_workload_same_partition(tmp_path_factory, ops, seed, budget) -> None:
    """puts / overwrites / deletes of values 0 B..3 KiB on 1 KiB pages (inline, 1-4
    overflow pages, growing and shrinking, full pages, freed and reused pages),
    checkpoints in between; budgets of 32/48 pages evict and reuse spare buffers."""
    base = tmp_path_factory.mktemp("w")
    stores = [PartitionStore.open(str(base / name), page_size=1024, memory_budget=budget * 1024,
                                  wal_sync="none", checkpoint_interval=None)
              for name in ("c", "py")]
    wakes = [s._wake for s in stores]
    try:
        for s in stores:
            s.create_partition(0)
            s._wake = _Never()    # no background checkpoint: run_ops makes them
        run_ops(stores, ops, random.Random(seed))
        for s in stores:
            s.checkpoint()
        files = [open(s.partition_path(0), "rb").read() for s in stores]
        assert files[0] == files[1]
        assert [tuple(e) for e in iter_entries(stores[0].partition_path(0))] == \
               [tuple(e) for e in iter_entries(stores[1].partition_path(0))]
    finally:
        for s, wake in zip(stores, wakes):
            s._wake = wake
            s.close(checkpoint=False)


class _Never:
    """Stands in for the store's checkpoint wake-up event in the workload test."""

    def set(self) -> None:
        pass

    def wait(self, timeout=None) -> bool:
        return False

    def clear(self) -> None:
        pass


@needs_c
def test_many_records_same_file(open_store, tmp_path) -> None:
    """A longer run (thousands of records, evictions and a checkpoint mid-way) through
    the replay's apply_many(logged=False) both ways: identical files."""
    rnd = random.Random(7)
    ups = []
    for i in range(3000):
        key = b"key-%05d" % rnd.randrange(800)
        size = rnd.choice([0, 100, 1000, 3000, 9000])
        ups.append((key, None if rnd.random() < 0.1 else rnd.randbytes(size), i + 1))
    paths = []
    for on, name in ((True, "c"), (False, "py")):
        # background checkpoints run when they run: the file after the last one is a
        # function of the updates alone
        s = PartitionStore.open(str(tmp_path / name), page_size=4096, memory_budget=1 << 20,
                                wal_sync="none", checkpoint_interval=None)
        with accel(on):
            for lo in range(0, len(ups), 250):
                s.apply_many(0, ups[lo:lo + 250], logged=False)
                if lo == 1500:
                    s.checkpoint()
            s.close()
        paths.append(os.path.join(str(tmp_path / name), "part-0.bin"))
    a, b = (open(p, "rb").read() for p in paths)
    assert a == b


# -- bad input ------------------------------------------------------------------------------
@needs_c
@pytest.mark.parametrize("call, exc, match", [
    (lambda b: C.insert(bytes(b), 900, 0, b"k", 1, 1, b"v"), TypeError, "writable buffer"),
    (lambda b: C.insert(bytearray(10), 900, 0, b"k", 1, 1, b"v"), ValueError, "page of 10 bytes"),
    (lambda b: C.insert(bytearray(1 << 17), 900, 0, b"k", 1, 1, b"v"), ValueError, "page of"),
    (lambda b: C.insert(b, 900, 256, b"k", 1, 1, b"v"), ValueError, "flags"),
    (lambda b: C.insert(b, 900, -1, b"k", 1, 1, b"v"), ValueError, "flags"),
    (lambda b: C.insert(b, 900, 0, b"k", -1, 1, b"v"), ValueError, "counter"),
    (lambda b: C.insert(b, 900, 0, b"k", 1 << 64, 1, b"v"), ValueError, "counter"),
    (lambda b: C.insert(b, 900, 0, b"k", 1, 1 << 32, b"v"), ValueError, "value_len"),
    (lambda b: C.insert(b, 900, 0, b"k", "1", 1, b"v"), TypeError, "counter must be an int"),
    (lambda b: C.insert(b, 10**6, 0, b"k" * 70000, 1, 1, b"v"), ValueError, "key of 70000"),
    (lambda b: C.insert(b, 10**6, 0, b"k", 1, 1, b"v" * 1100), ValueError, "cannot fit"),
    (lambda b: C.insert(b, 900, 0, b"k", 1), TypeError, "7 arguments"),
    (lambda b: C.insert(b, 900, 0, 12, 1, 1, b"v"), TypeError, "bytes-like"),
    (lambda b: C.delete(b, 7, 20), IndexError, "slot 7 of a page with 2 slots"),
    (lambda b: C.delete(b, -1, 20), ValueError, "slot"),
    (lambda b: C.read_entry(b, 2), IndexError, "slot 2"),
    (lambda b: C.read_entry(bytearray(1024), 0), ValueError, "not DATA"),
    (lambda b: C.compact(b"x" * 1024), TypeError, "writable"),
    (lambda b: C.chain_pages(b"v" * 2000, 1024, [3], []), ValueError, "takes 2 pages"),
    (lambda b: C.chain_pages(b"v", 1024, [0], []), ValueError, "page 0"),
    (lambda b: C.chain_pages(b"v", 1024, [-3], []), ValueError, "page index"),
    (lambda b: C.chain_pages(b"v", 1024, [1 << 32], []), ValueError, "page index"),
    (lambda b: C.chain_pages(b"v", 1024, (3,), []), TypeError, "lists"),
    (lambda b: C.chain_pages(b"v", 1024, [3], [bytearray(512)]), ValueError, "spare buffer"),
    (lambda b: C.chain_pages(b"v", 1024, [3], [b"x" * 1024]), ValueError, "spare buffer"),
    (lambda b: C.chain_pages(b"v", 16, [3], []), ValueError, "page size"),
    (lambda b: C.chain_pages(b"v", 1 << 17, [3], []), ValueError, "page_size"),
    (lambda b: C.new_page(3, 1024, 2, bytearray(512)), ValueError, "bytearray of 1024"),
    (lambda b: C.new_page(3, 1024, 2, b"x" * 1024), ValueError, "bytearray of 1024"),
    (lambda b: C.new_page(3, 1024, 9), ValueError, "types 1..4"),
    (lambda b: C.new_page(3, 16, 2), ValueError, "page size 16"),
    (lambda b: C.new_page(-3, 1024, 2), ValueError, "page index"),
    (lambda b: C.new_page(3, 1024), TypeError, "3 or 4 arguments"),
])
def test_bad_input_raises_and_changes_nothing(call, exc, match) -> None:
    buf = data_page(1024)
    pg.insert_py(buf, 1008, 0, b"a", 1, 3, b"aaa")
    pg.insert_py(buf, 1008 - 21, 0, b"b", 2, 3, b"bbb")
    before = bytes(buf)
    with pytest.raises(exc, match=match):
        call(buf)
    assert bytes(buf) == before


@needs_c
@pytest.mark.parametrize("corrupt, match", [
    (lambda b: b.__setitem__(slice(10, 12), (600).to_bytes(2, "little")), "does not fit"),
    (lambda b: b.__setitem__(slice(12, 16), (5000).to_bytes(4, "little")), "does not fit"),
    (lambda b: b.__setitem__(slice(16, 18), (1020).to_bytes(2, "little")), "outside the page"),
    (lambda b: b.__setitem__(slice(16, 18), (17).to_bytes(2, "little")), "outside the page"),
])
def test_inconsistent_page_is_refused_before_any_change(corrupt, match) -> None:
    """A page whose header or slots do not fit it (never the case for a page that
    passed check_page) raises ValueError, and the C code writes nothing."""
    buf = data_page(1024)
    for i in range(3):
        pg.insert_py(buf, pg.free_bytes(buf), 0, b"k%d" % i, i, 300, b"v" * 300)
    pg.delete_py(buf, 1, 15 + 2 + 300)
    corrupt(buf)
    before = bytes(buf)
    with pytest.raises(ValueError, match=match):
        C.compact(buf)
        C.insert(buf, 1000, 0, b"n", 9, 400, b"w" * 400)   # needs a compaction
    assert bytes(buf) == before


@needs_c
def test_overstated_free_space_is_an_error_not_an_overwrite() -> None:
    """Told of more free bytes than the page has, C raises after compacting (the page
    stays valid: same entries and slots); the Python twin would write over the slot
    directory."""
    buf = data_page(1024)
    for i in range(3):
        pg.insert_py(buf, pg.free_bytes(buf), 0, b"k%d" % i, i, 300, b"v" * 300)
    with pytest.raises(ValueError, match="free-space map is wrong"):
        C.insert(buf, 1000, 0, b"n", 9, 400, b"w" * 400)
    seal(buf)
    assert check_page(buf, 5, 1024) is None
    assert [C.read_entry(buf, s)[:3] for s in range(3)] == [(0, i, 300) for i in range(3)]


@needs_c
def test_entry_too_big_for_the_stated_room_is_none_both_ways() -> None:
    """An entry larger than ``free`` (even larger than a page) is "no room" (None),
    as in page.insert_py, and nothing changes."""
    for fn in (C.insert, pg.insert_py):
        buf = data_page(1024)
        assert fn(buf, 1008, 0, b"k" * 70000, 1, 1, b"v") is None
        assert fn(buf, 1008, 0, b"k", 1, 2000, b"v" * 2000) is None
        assert buf == data_page(1024)


def test_store_errors_are_the_same_both_ways(open_store) -> None:
    """Oversized keys/values are refused by the store before the page code, both ways."""
    from checkpoint import CheckpointError
    s = open_store(page_size=1024)
    for on in (True, False):
        with accel(on):
            with pytest.raises(CheckpointError, match="key of"):
                s.apply_many(0, [(b"x" * 2000, b"v", 1)], logged=False)
            assert s.apply_many(0, [(b"k", b"v" * 5000, 2 - on)], logged=False) == [True]
            assert s.get(0, b"k") == b"v" * 5000


def test_corrupt_chain_on_overwrite_raises_both_ways(open_store) -> None:
    """An overwrite whose old chain is corrupt raises CorruptPageError (the Python
    chain walk, the same with the C writer)."""
    for on in (True, False):
        s = open_store(page_size=1024)
        with accel(on):
            s.apply_many(1, [(b"k", b"v" * 3000, 1)], logged=False)
            part = s.parts[1]
            loc = part.index.get(b"k")
            _f, _c, _v, first, _s = pg.read_entry(part.page(loc >> 16), loc & 0xFFFF)
            part.writable(first)[12:16] = (first).to_bytes(4, "little")   # a loop
            with pytest.raises(CorruptPageError, match="loops"):
                s.apply_many(1, [(b"k", b"w" * 3000, 2)], logged=False)
        s.close(checkpoint=False)
        import shutil
        shutil.rmtree(s.dir)
