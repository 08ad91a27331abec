"""The C key-index path (checkpoint/_keyaccel.c) against the pure-Python one: identical
tables (hashes, locations, segment layout, fill counts) and lookups for random key sets
(growth past the split, duplicates, skewed and colliding custom hashes, many keys), the
open-time scan of real partition files (index, space map, roomy and FREE pages), errors
that change nothing, the hash against ``xxhash``, and the FERRY_PAGE_ACCEL=0 switch.

Each comparison builds the same index twice in one process, with ``keyindex._accel``
set to the module and to None."""
from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
from array import array

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import checkpoint
from checkpoint import accel as switch
from checkpoint import PartitionStore, keyindex, pagefile
from checkpoint.keyindex import KeyIndex
from checkpoint.pagefile import CorruptPageError

try:
    import importlib
    BUILT = importlib.import_module("checkpoint._keyaccel")
    if getattr(BUILT, "ABI_VERSION", None) is None:
        BUILT = None
except ImportError:
    BUILT = None
try:
    PAGE_BUILT = importlib.import_module("checkpoint._pageaccel")
except ImportError:
    PAGE_BUILT = None
pytestmark = pytest.mark.skipif(BUILT is None, reason="checkpoint._keyaccel is not built "
                                                      "(no C compiler or xxhash.h at install)")
TOP = 1 << 62


def state(idx: KeyIndex) -> tuple:
    """Everything that defines an index's tables, for equality."""
    return (idx._shift, len(idx), list(idx._masks), list(idx._used),
            [bytes(h) for h in idx._hashes], [bytes(loc) for loc in idx._locs])


def both(build, *args) -> tuple:
    """``build(*args)`` with the C path, then with pure Python: the two results."""
    saved = keyindex._accel
    try:
        out = []
        for acc in (BUILT, None):
            keyindex._accel = acc
            out.append(build(*args))
        return tuple(out)
    finally:
        keyindex._accel = saved


def _keys(seed: int, n: int, dup: int) -> list[bytes]:
    rnd = random.Random(seed)
    keys = [rnd.randbytes(rnd.randrange(0, 24)) for _ in range(n)]
    return keys + [keys[rnd.randrange(n)] for _ in range(dup)] if n else keys


def _bulk(keys: list[bytes], cuts: list[int], hash_fn=None, pages: bool = False) -> KeyIndex:
    """An index built the way the scan does it: add_many / add_page_keys in batches."""
    idx = KeyIndex(lambda loc: keys[(loc >> 16) * 8 + (loc & 0xffff) - 8], hash_fn)
    bounds = sorted({0, len(keys), *(min(c, len(keys)) for c in cuts)})
    for lo, hi in zip(bounds, bounds[1:]):
        if pages:        # iter_page_keys items: 8 slots per page from page 1
            batch: dict[int, list] = {}
            for i in range(lo, hi):
                batch.setdefault(i // 8 + 1, []).append((i % 8, keys[i]))
            idx.add_page_keys([(p, 2, 0, ks) for p, ks in batch.items()])
        else:
            idx.add_many([(keys[i], (i // 8 + 1) << 16 | i % 8) for i in range(lo, hi)])
    return idx


def _check_lookups(idx: KeyIndex, keys: list[bytes]) -> None:
    last = {k: (i // 8 + 1) << 16 | i % 8 for i, k in enumerate(keys)}
    for k in list(last)[::max(1, len(last) // 300)]:
        assert idx.get(k) is not None
    assert idx.get(b"\xff" * 30) is None
    assert len(idx) == len(keys)


# -- the hash ---------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=600))
def test_hash_is_xxh3_64(data: bytes) -> None:
    want = xxhash.xxh3_64_intdigest(data)
    assert BUILT.hash(data) == want == BUILT.hash(bytearray(data)) == BUILT.hash(memoryview(data))


def test_hash_refuses_a_non_buffer() -> None:
    with pytest.raises(TypeError):
        BUILT.hash("text")


# -- identical tables -------------------------------------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 1 << 30), n=st.sampled_from([0, 1, 5, 100, 3000, 3073, 12000]),
       dup=st.integers(0, 20), cuts=st.lists(st.integers(0, 12000), max_size=5),
       pages=st.booleans())
def test_c_and_python_build_identical_tables(seed, n, dup, cuts, pages) -> None:
    """Random keys (duplicates included: both get slots, as in Python) in batches of any
    size, across the split (3072 keys fill 4096 slots) and the segments' growth."""
    keys = _keys(seed, n, dup)
    c, py = both(_bulk, keys, cuts, None, pages)
    assert state(c) == state(py)
    _check_lookups(c, keys)


@pytest.mark.parametrize("name, hash_fn", [
    ("constant", lambda k: 5),
    ("tiny", lambda k: sum(k) % 3),
    ("tiny-segments", lambda k: (len(k) % 2) * TOP | sum(k) % 2),
    ("skewed", lambda k: int.from_bytes(k[:3].ljust(3, b"\0"), "big") * 2654435761 % (1 << 20)),
])
def test_custom_hash_never_runs_the_c_hash(monkeypatch, name, hash_fn) -> None:
    """A custom hash (forced collisions) hashes in Python; only the probing, which
    takes the hashes as given, may run in C - and gives the same tables."""
    class Guard:                           # the module, minus its hashing entry points
        ABI_VERSION, place = BUILT.ABI_VERSION, staticmethod(BUILT.place)

        def __getattr__(self, attr):
            raise AssertionError(f"C {attr} used with a custom hash")

    n = 300 if name in ("constant", "tiny", "tiny-segments") else 9000
    keys = [i.to_bytes(3, "big") for i in range(n)]
    saved, guard = keyindex._accel, Guard()
    try:
        out = []
        for acc in (guard, None):
            keyindex._accel = acc
            out.append(_bulk(keys, [n // 3], hash_fn, pages=n % 2 == 0))
            assert out[-1].scan_accel() is None
    finally:
        keyindex._accel = saved
    assert state(out[0]) == state(out[1])
    for k in keys[::7]:
        assert out[0].get(k) == out[1].get(k) is not None


def test_single_adds_and_growth_identical() -> None:
    """add() one key at a time: _grow and _split run in C when it is there."""
    keys = [b"key-%d" % i for i in range(20000)]

    def build():
        idx = KeyIndex(lambda loc: keys[loc - 1])
        for i, k in enumerate(keys):
            idx.add(k, i + 1)
        return idx

    c, py = both(build)
    assert state(c) == state(py) and len(c._masks) == keyindex.SEGMENTS
    assert all(c.get(keys[i]) == i + 1 for i in range(0, len(keys), 101))


def test_many_keys_identical() -> None:
    """Many keys in the scan's batches, through the C path's GIL-free placing."""
    n = 300_000
    keys = [b"user:%010d" % i for i in range(n)]
    c, py = both(_bulk, keys, list(range(0, n, 16384)), None, True)
    assert state(c) == state(py)
    for i in range(0, n, 9973):
        assert c.get(keys[i]) == (i // 8 + 1) << 16 | i % 8


# -- bad input: a clear error, nothing changed ------------------------------------------
def test_location_zero_and_bad_keys_change_nothing() -> None:
    keys = _keys(3, 500, 0)
    idx = KeyIndex(lambda loc: b"")
    saved = keyindex._accel
    keyindex._accel = BUILT
    try:
        idx.add_many([(k, i + 1) for i, k in enumerate(keys)])
        before = state(idx)
        for bad, err in [([(b"a", 1), (b"b", 0)], ValueError), ([(b"a", -3)], ValueError),
                         ([(b"a", 1), ("text", 2)], TypeError), ([(b"a", "x")], TypeError),
                         ([(b"a",)], TypeError)]:
            with pytest.raises(err):
                idx.add_many(bad)
            assert state(idx) == before
        other = KeyIndex({5: b"x", 6: b"y"}.__getitem__)
        other.add_many([[b"x", 5], (b"y", 6)])        # any pairs, as the Python path
        assert other.get(b"y") == 6 and len(other) == 2
        with pytest.raises(ValueError, match="empty-slot"):
            idx.add_page_keys([(0, 2, 0, [(0, b"k")])])
        with pytest.raises(ValueError, match="16 bits"):
            idx.add_page_keys([(1, 2, 0, [(1 << 16, b"k")])])
        assert state(idx) == before
    finally:
        keyindex._accel = saved


def test_place_refuses_tables_that_do_not_fit() -> None:
    z = array("Q", bytes(64))
    ok = (b"", b"", 0, 64, [z], [array("Q", bytes(64))], [7], [0])
    assert BUILT.place(*ok) is None
    for args, err in [
        ((b"", b"", 0, 64, [z], [array("Q", bytes(64))], [15], [0]), ValueError),   # size
        ((b"", b"", 0, 64, [z], [array("I", bytes(64))], [7], [0]), ValueError),    # type
        ((b"", b"", 0, 64, [z], [array("Q", bytes(64))], [6], [0]), ValueError),    # mask
        ((b"", b"", 0, 58, [z], [array("Q", bytes(64))], [7], [0]), ValueError),    # shift
        ((b"x" * 8, b"", 0, 64, [z], [array("Q", bytes(64))], [7], [0]), ValueError),
        ((b"", b"", 0, 64, [bytes(64)], [array("Q", bytes(64))], [7], [0]), (TypeError, BufferError)),
    ]:
        with pytest.raises(err):
            BUILT.place(*args)
    # `used` understating a full table: an error, not an endless probe
    full = array("Q", [1] * 8)
    with pytest.raises(RuntimeError, match="full"):
        BUILT.place(array("Q", [3]), array("Q", [9]), 0, 64, [array("Q", bytes(64))], [full],
                    [7], [0])


# -- the open-time scan of real files ---------------------------------------------------
def _fill(d: str) -> dict[bytes, bytes]:
    """A store with inline and overflow values, removes (FREE pages), two partitions."""
    s = PartitionStore.open(d, page_size=1024, checkpoint_interval=None, wal_sync="none",
                            memory_budget=1 << 20)
    rnd = random.Random(5)
    model: dict[bytes, bytes] = {}
    s.create_partition(0)
    s.create_partition(1)
    for i in range(9000):
        key = b"k%07d" % rnd.randrange(6000)
        value = rnd.randbytes(rnd.choice([0, 10, 300, 2500]))
        s.put(i % 2, key, value)
        model[b"%d/" % (i % 2) + key] = value
        if i % 7 == 0:
            s.remove(i % 2, key)
            model.pop(b"%d/" % (i % 2) + key)
    for i in range(40):                    # overflow chains freed last: FREE pages stay
        s.put(1, b"big%d" % i, rnd.randbytes(5000))
    s.checkpoint()
    for i in range(40):
        s.remove(1, b"big%d" % i)
    s.close()
    return model


def _open_state(d: str) -> tuple:
    s = PartitionStore.open(d, page_size=1024, checkpoint_interval=None, wal_sync="none")
    try:
        parts = []
        for p in (0, 1):
            part = s.parts[p]
            parts.append((state(part.index), bytes(part.space), sorted(part.roomy),
                          sorted(part.free_pages)))
        got = {b"%d/" % p + k: v for p in (0, 1) for k, v in s.scan(p)}
        return parts, got
    finally:
        s.close(checkpoint=False)


def _counting(mod, calls: list):
    class Counting:                        # the module, counting the scan's C calls
        def __getattr__(self, attr):
            calls.append(attr)
            return getattr(mod, attr)
    return Counting()


@pytest.mark.parametrize("route", ["scan_keys", "scan_pages"])
def test_reopen_with_and_without_the_accelerator(tmp_path, route) -> None:
    """scan_keys: the decoder hashes straight from the chunk (_pageaccel.scan_keys);
    scan_pages: the C decoder off, the pages' tuples hashed by _keyaccel.scan_pages;
    both give the pure-Python open's index, space map, roomy set and FREE list."""
    d = str(tmp_path / "store")
    model = _fill(d)
    calls: list = []
    page_calls: list = []
    saved, saved_page = keyindex._accel, switch.page
    keyindex._accel = _counting(BUILT, calls)
    if route == "scan_keys":
        if getattr(PAGE_BUILT, "scan_keys", None) is None:
            pytest.skip("checkpoint._pageaccel is not built (or built without xxhash.h)")
        switch.page = _counting(PAGE_BUILT, page_calls)
    else:
        switch.page = None
    try:
        c_parts, c_got = _open_state(d)
    finally:
        keyindex._accel, switch.page = saved, saved_page
    assert "hash_items" not in calls and "page_hashes" not in calls
    if route == "scan_keys":
        assert page_calls.count("scan_keys") >= 2 and "scan_pages" not in calls
        assert "page_keys" not in page_calls          # no per-key objects on the way
    else:
        assert calls.count("scan_pages") >= 2         # one per partition
    keyindex._accel, switch.page = None, None
    try:
        py_parts, py_got = _open_state(d)
    finally:
        keyindex._accel, switch.page = saved, saved_page
    assert c_parts == py_parts
    assert c_got == py_got == model
    assert any(fp for _s, _sp, _r, fp in c_parts), "no FREE page: the test lost its point"
    assert any(r for _s, _sp, r, _fp in c_parts), "no roomy page: the test lost its point"


def test_scan_of_a_corrupt_file_raises_both_ways(tmp_path) -> None:
    d = str(tmp_path / "store")
    _fill(d)
    path = tmp_path / "store" / "part-1.bin"
    data = bytearray(path.read_bytes())
    data[5 * 1024 + 100] ^= 0xFF
    path.write_bytes(bytes(data))

    def open_it():
        with pytest.raises(CorruptPageError) as e:
            PartitionStore.open(d, page_size=1024, checkpoint_interval=None, wal_sync="none")
        return e.value.page

    c, py = both(open_it)
    assert c == py == 5


def test_scan_pages_takes_batches_at_page_ends() -> None:
    pages = [(1, 2, 100, [(0, b"a"), (1, b"b")]), (2, 4, 0, []), (3, 2, 1000, [(0, b"c")]),
             (4, 2, 16, [])]
    space, roomy, free = array("I", bytes(4 * 5)), set(), []
    it = iter(pages)
    h, loc, more = BUILT.scan_pages(it, 2, 1024, 256, space, roomy, free)
    assert more and len(h) == len(loc) == 16
    assert array("Q", loc).tolist() == [1 << 16, 1 << 16 | 1]
    assert array("Q", h).tolist() == [xxhash.xxh3_64_intdigest(b"a"), xxhash.xxh3_64_intdigest(b"b")]
    h, loc, more = BUILT.scan_pages(it, 2, 1024, 256, space, roomy, free)
    assert not more and array("Q", loc).tolist() == [3 << 16]
    assert free == [2] and roomy == {1, 4} and list(space) == [0, 924, 0, 24, 1008]
    with pytest.raises(IndexError):
        BUILT.scan_pages(iter([(5, 2, 0, [])]), 2, 1024, 256, space, roomy, free)


# -- the switch and the ABI check -------------------------------------------------------
def test_switch_and_abi(monkeypatch, py_env, python) -> None:
    code = "from checkpoint import keyindex; print(keyindex.accelerator())"
    for value, want in [("0", "None"), ("off", "None"), ("1", "c")]:
        env = dict(py_env, FERRY_PAGE_ACCEL=value)
        out = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True,
                             check=True).stdout.strip()
        assert out == want, value

    class Old:
        ABI_VERSION, MAX_LOAD_NUM, MAX_LOAD_DEN = 0, 3, 4

    monkeypatch.setitem(sys.modules, "checkpoint._keyaccel", Old)
    monkeypatch.setattr(checkpoint, "_keyaccel", Old, raising=False)
    assert keyindex._load_accel() is None


# -- the decoder's hashed scan (pagefile.scan_key_hashes / _pageaccel.scan_keys) --------
needs_scan_keys = pytest.mark.skipif(getattr(PAGE_BUILT, "scan_keys", None) is None,
                                     reason="checkpoint._pageaccel not built with xxhash.h")


def _scan_outcome(path: str, accel, space_pages: int, batch: int = 16384):
    """scan_key_hashes with switch.page = accel: batches and facts, or the error."""
    saved = switch.page
    switch.page = accel
    space, roomy, free, out = array("I", bytes(4 * space_pages)), set(), [], []
    try:
        for h, loc in pagefile.scan_key_hashes(path, 4096, batch, space, 256, roomy, free,
                                               xxhash.xxh3_64_intdigest):
            out.append((h, loc))
        return out, bytes(space), sorted(roomy), free
    except Exception as e:  # noqa: BLE001 - the comparison is of the error itself
        return type(e).__name__, str(e)
    finally:
        switch.page = saved


def _small_store(d: str) -> str:
    s = PartitionStore.open(d, page_size=1024, checkpoint_interval=None, wal_sync="none")
    s.create_partition(0)
    for i in range(300):
        s.put(0, b"k%05d" % i, bytes(i % 97))
    s.put(0, b"big", bytes(5000))              # an overflow chain between DATA pages
    s.checkpoint()
    s.close()
    return d + "/part-0.bin"


@needs_scan_keys
def test_scan_keys_hands_odd_pages_back_to_python(tmp_path) -> None:
    """Pages the C scan must not decide: entries overlapping (more bytes "in use" than
    the page has: Python's space map refuses it) and a page beyond the space map. The
    errors are those of the pure path, as are the results when the page is fine."""
    path = _small_store(str(tmp_path / "s"))
    pages = os.path.getsize(path) // 1024
    clean = _scan_outcome(path, PAGE_BUILT, pages)
    assert isinstance(clean[0], list) and clean == _scan_outcome(path, None, pages)
    # a page beyond the space map: IndexError from the space map, both ways
    short = _scan_outcome(path, PAGE_BUILT, 3)
    assert short[0] == "IndexError" and short == _scan_outcome(path, None, 3)
    # two slots on one 618-byte entry of a DATA page: structurally valid, used > page
    data = bytearray(open(path, "rb").read())
    p = 2
    buf = bytearray(1024)
    struct.pack_into("<IIBBHI", buf, 0, 0, p, 2, 0, 2, 400)
    struct.pack_into("<HH", buf, 16, 400, 400)
    struct.pack_into("<BHIQ", buf, 400, 0, 3, 600, 7)
    buf[415:418] = b"abc"
    pagefile.seal(buf)
    assert pagefile.check_page(buf, p, 1024) is None
    data[p * 1024:(p + 1) * 1024] = buf
    bad = str(tmp_path / "overlap.bin")
    open(bad, "wb").write(bytes(data))
    got = _scan_outcome(bad, PAGE_BUILT, pages)
    assert got[0] == "OverflowError" and got == _scan_outcome(bad, None, pages)


@needs_scan_keys
def test_scan_keys_stops_at_batch_ends_and_odd_pages(tmp_path) -> None:
    path = _small_store(str(tmp_path / "s"))
    chunk = open(path, "rb").read()[1024:]
    pages = len(chunk) // 1024
    space, roomy, free = array("I", bytes(4 * (pages + 1))), set(), []
    h, loc, j = PAGE_BUILT.scan_keys(chunk, 1, 0, 1024, 1, space, 256, roomy, free)
    assert j >= 1 and len(h) == len(loc) and array("Q", loc)[0] >> 16 == j
    n_first = len(h) // 8                      # the first DATA page's keys: one batch
    ref = [(i, k) for i, t, _u, keys in pagefile.iter_page_keys(path) for _s, k in keys]
    assert array("Q", h).tolist() == [xxhash.xxh3_64_intdigest(k) for _i, k in ref[:n_first]]
    h2, loc2, j2 = PAGE_BUILT.scan_keys(chunk, 1, j, 1024, 1 << 30, space, 256, roomy, free)
    assert j2 == pages and len(ref) == n_first + len(h2) // 8
    # a corrupt page: scan_keys stops before it and has touched nothing of it
    bad = bytearray(chunk)
    bad[3 * 1024 + 200] ^= 1
    space2 = array("I", bytes(4 * (pages + 1)))
    h3, _l3, j3 = PAGE_BUILT.scan_keys(bytes(bad), 1, 0, 1024, 1 << 30, space2, 256, set(), [])
    assert j3 == 3 and space2[4] == 0 and all(loc >> 16 < 4 for loc in array("Q", _l3))
    with pytest.raises(TypeError):
        PAGE_BUILT.scan_keys(chunk, 1, 0, 1024, 1, array("Q", bytes(8 * pages)), 256, set(), [])


def test_env_off_means_no_hashed_scan(py_env, python) -> None:
    code = "from checkpoint import pagefile; print(pagefile.key_scan_accel())"
    out = subprocess.run([python, "-c", code], env=dict(py_env, FERRY_PAGE_ACCEL="0"),
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "None"
