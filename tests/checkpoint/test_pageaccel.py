"""The C page-decoder accelerator (checkpoint/_pageaccel.c) against the pure-Python path:
identical items, order, errors, problem reasons and pages marked checked, on random
partitions (values 0 B..200 KiB, overflow chains in reused pages and outside the read
chunk, tombstones, overwrites across checkpoints), on corrupted and truncated copies,
and its CRC32C (hardware and table) against the ``crc32c`` package.

Every comparison runs the public decoder twice in the same process, with
``switch.page`` set to the module and to None (the conftest also runs the older
decoder test modules both ways)."""
from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
from array import array

import crc32c
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpoint import accel as switch
from checkpoint import PartitionStore, pagefile
from checkpoint.pagefile import CorruptPageError, check_page, read_meta

ACCEL = switch.load_page_accel() if os.environ.get(pagefile.ACCEL_ENV, "1") != "0" else None
try:
    import importlib
    BUILT = importlib.import_module("checkpoint._pageaccel")
except ImportError:
    BUILT = None
needs_accel = pytest.mark.skipif(BUILT is None, reason="checkpoint._pageaccel is not built "
                                                       "(no C compiler at install time)")


# -- running the decoder both ways ------------------------------------------------------
def _run(fn, mode):
    saved = switch.page
    switch.page = BUILT if mode == "accel" else None
    readers: list = []
    real_init = pagefile.PageReader.__init__

    def init(self, *a, **k):
        real_init(self, *a, **k)
        readers.append(self)

    pagefile.PageReader.__init__ = init
    try:
        return fn(), [bytes(r.checked) for r in readers]
    finally:
        pagefile.PageReader.__init__ = real_init
        switch.page = saved


def events(path, decode: str, strict: bool, **kw):
    """What a consumer sees: items and problems interleaved, and the final error."""
    out: list = []
    fn = {"entries": pagefile.iter_entries, "batches": pagefile.iter_entry_batches,
          "live": pagefile.iter_live_batches, "columns": pagefile.iter_live_columns}[decode]
    on_error = None if strict else (lambda p: out.append(("problem", p)))
    try:
        for x in fn(path, on_error=on_error, **kw):
            if decode == "entries":
                out.append(("item", tuple(x), type(x).__name__))
            else:
                assert x, "no empty batches"
                if isinstance(x, pagefile.LiveColumns):
                    x = x.pairs()
                out.extend(("item", tuple(e), type(e).__name__) for e in x)
    except CorruptPageError as e:
        out.append(("raised", str(e)))
    return out


def page_keys(path):
    out: list = []
    try:
        for t in pagefile.iter_page_keys(path):
            out.append(t)
    except CorruptPageError as e:
        out.append(("raised", str(e)))
    return out


def _space_for(path):
    meta = read_meta(path)
    return array("I", bytes(4 * min(meta.page_count, os.path.getsize(path) // meta.page_size + 1)))


def key_hashes(path, batch: int, chunk_bytes: int | None = None, space_pages: int | None = None):
    """What Partition._scan sees of scan_key_hashes: each batch's (hashes, locations),
    then the space map, roomy set and FREE list, or the error it raised."""
    out: list = []
    try:
        space = _space_for(path) if space_pages is None else array("I", bytes(4 * space_pages))
        roomy: set = set()
        free: list = []
        for h, loc in pagefile.scan_key_hashes(path, chunk_bytes, batch, space, 256, roomy,
                                               free, xxhash.xxh3_64_intdigest):
            assert h and len(h) == len(loc)
            out.append(("batch", array("Q", h).tolist(), array("Q", loc).tolist()))
        out.append(("facts", bytes(space), sorted(roomy), free))
    except (CorruptPageError, OverflowError, IndexError) as e:
        out.append(("raised", type(e).__name__, str(e)))
    return out


def key_hashes_reference(path, batch: int, space_pages: int | None = None):
    """key_hashes from iter_page_keys in pure Python: Partition._scan's per-page loop
    (the batches, the facts) with the reference hash."""
    saved = switch.page
    switch.page = None
    out: list = []
    try:
        space = _space_for(path) if space_pages is None else array("I", bytes(4 * space_pages))
        roomy: set = set()
        free: list = []
        hs: list = []
        ls: list = []
        ps = read_meta(path).page_size
        for i, ptype, used, keys in pagefile.iter_page_keys(path):
            if ptype == int(pagefile.PageType.FREE):
                free.append(i)
                continue
            room = ps - used
            space[i] = room
            if room >= 256:
                roomy.add(i)
            hs += [xxhash.xxh3_64_intdigest(k) for _s, k in keys]
            ls += [i << 16 | s for s, _k in keys]
            if len(hs) >= batch:
                out.append(("batch", hs, ls))
                hs, ls = [], []
        if hs:
            out.append(("batch", hs, ls))
        out.append(("facts", bytes(space), sorted(roomy), free))
    except (CorruptPageError, OverflowError, IndexError) as e:
        out.append(("raised", type(e).__name__, str(e)))
    finally:
        switch.page = saved
    return out


def assert_same(path) -> list:
    """Every decoder entry point, accelerated and pure: the same output and the same
    pages marked checked by each reader. Returns the strict entry events."""
    if BUILT is None:
        pytest.skip("checkpoint._pageaccel is not built")
    cases = [lambda: page_keys(path), lambda: pagefile.verify(path)]
    for decode in ("entries", "batches", "live", "columns"):
        for strict in (True, False):
            for tombs in ((True, False) if decode in ("entries", "batches") else (None,)):
                kw = {} if tombs is None else {"include_tombstones": tombs}
                cases.append(lambda d=decode, s=strict, kw=kw: events(path, d, s, **kw))
    for batch, chunk in ((16384, None), (1, None), (5, 3 << 10), (7, 1 << 10)):
        cases.append(lambda b=batch, c=chunk: key_hashes(path, b, c))
        assert _run(cases[-1], "accel")[0] == key_hashes_reference(path, batch)
    results = []
    for case in cases:
        want, want_checked = _run(case, "pure")
        got, got_checked = _run(case, "accel")
        assert got == want
        assert got_checked == want_checked, "a different set of pages was marked checked"
        results.append(want)
    # the columns give the live pairs, problems and errors exactly
    assert results[12] == results[10] and results[13] == results[11]
    return results[2]                     # iter_entries, strict, with tombstones


# -- random partitions ------------------------------------------------------------------
SIZES = st.one_of(st.integers(0, 64), st.integers(65, 3000), st.integers(3000, 200_000))
OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, 150), SIZES),
    st.tuples(st.just("remove"), st.integers(0, 150), st.just(0)),
    st.tuples(st.just("checkpoint"), st.just(0), st.just(0)),
), min_size=5, max_size=60)


def build(tmp: str, ops, page_size: int, seed: int) -> str:
    """A partition file written by a real store: puts (overwrites free chains, which
    later chains reuse), removes (tombstones), checkpoints in between."""
    d = os.path.join(tmp, "store")
    s = PartitionStore.open(d, wal_sync="none", checkpoint_interval=None, page_size=page_size)
    rnd = random.Random(seed)
    try:
        s.create_partition(3)
        for op, k, size in ops:
            key = b"k%03d" % k + b"x" * (k % 7) * 9
            if op == "put":
                s.put(3, key, rnd.randbytes(size))
            elif op == "remove":
                s.remove(3, key)
            else:
                s.checkpoint()
        s.checkpoint()
        out = os.path.join(tmp, "part.bin")
        shutil.copyfile(s.partition_path(3), out)
    finally:
        s.close()
        shutil.rmtree(d, ignore_errors=True)
    return out


def mutate(path: str, rnd: random.Random, page_size: int, index: int | None = None) -> None:
    """Flip bytes of one page (header, slots, entries, chain links), mostly re-sealed
    so the structure and chain checks are reached, not only the CRC."""
    count = os.path.getsize(path) // page_size
    with open(path, "r+b") as f:
        index = rnd.randrange(count) if index is None else index
        f.seek(index * page_size)
        buf = bytearray(f.read(page_size))
        what = rnd.randrange(4)
        if what == 0:
            struct.pack_into("<I", buf, 12, rnd.choice([0, index, rnd.randrange(count + 3)]))
        elif what == 1:
            struct.pack_into("<H", buf, 10, rnd.randrange(page_size))
        else:
            for _ in range(rnd.choice([1, 2, 3])):
                off = rnd.randrange(4, min(page_size, 128) if rnd.random() < 0.6 else page_size)
                buf[off] ^= 1 << rnd.randrange(8)
        if rnd.random() < 0.85:
            pagefile.seal(buf)
        f.seek(index * page_size)
        f.write(buf)


READER = st.sampled_from([(1 << 21, 16 << 20), (3, 8), (4, 0), (16, 64)])


@needs_accel
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=OPS, fill=st.integers(0, 150), page_size=st.sampled_from([1024, 4096]),
       seed=st.integers(0, 2**16), reader=READER, corruptions=st.integers(0, 4))
def test_random_partitions_decode_identically(ops, fill, page_size, seed, reader,
                                              corruptions) -> None:
    chunk, ahead = reader
    saved = pagefile.PageReader.CHUNK, pagefile.PageReader.LOOKAHEAD
    if chunk < 1024:                      # in pages: chains leave the chunk / the window
        pagefile.PageReader.CHUNK, pagefile.PageReader.LOOKAHEAD = chunk * page_size, ahead * page_size
    else:
        pagefile.PageReader.CHUNK, pagefile.PageReader.LOOKAHEAD = chunk, ahead
    try:
        with tempfile.TemporaryDirectory() as tmp:
            # a base of small entries (many slots per page), then the drawn operations
            rnd = random.Random(seed)
            base = [("put", k, rnd.choice([0, 10, 200, 700])) for k in range(fill)]
            path = build(tmp, base + [("checkpoint", 0, 0)] + ops, page_size, seed)
            seen = assert_same(path)
            assert all(kind == "item" for kind, *_ in seen)
            # an intact file read as verified (no CRCs): the same pairs, both ways
            for mode in ("pure", "accel"):
                got, _checked = _run(lambda: events(path, "columns", True, verified=True), mode)
                assert got == events(path, "live", True)
            bad = os.path.join(tmp, "bad.bin")
            for _ in range(corruptions):
                shutil.copyfile(path, bad)
                for _ in range(rnd.choice([1, 1, 2])):
                    mutate(bad, rnd, page_size)
                assert_same(bad)
            if corruptions:                   # and a truncated copy
                shutil.copyfile(path, bad)
                os.truncate(bad, rnd.randrange(page_size, os.path.getsize(path) + 1))
                assert_same(bad)
    finally:
        pagefile.PageReader.CHUNK, pagefile.PageReader.LOOKAHEAD = saved


def build_chains(tmp_path, page_size: int = 1024) -> str:
    """Fixed file: long chains, some rewritten into reused FREE pages, tombstones."""
    ops = [("put", i, [5000, 40_000, 200_000, 30, 0][i % 5]) for i in range(30)]
    ops += [("checkpoint", 0, 0)] + [("put", i, 12_000) for i in range(0, 30, 3)]
    ops += [("remove", i, 0) for i in range(0, 30, 4)] + [("checkpoint", 0, 0)]
    ops += [("put", i, 70_000) for i in range(1, 30, 5)]
    return build(str(tmp_path), ops, page_size, 1)


@needs_accel
@pytest.mark.parametrize("chunk_pages,ahead_pages", [(2048, 16384), (5, 10), (7, 0)])
def test_many_corruptions_decode_identically(tmp_path, monkeypatch, chunk_pages, ahead_pages) -> None:
    monkeypatch.setattr(pagefile.PageReader, "CHUNK", chunk_pages * 1024)
    monkeypatch.setattr(pagefile.PageReader, "LOOKAHEAD", ahead_pages * 1024)
    clean = build_chains(tmp_path)
    assert_same(clean)
    rnd = random.Random(chunk_pages)
    path = str(tmp_path / "bad.bin")
    reasons = set()
    data_pages = [i for i, t, _u, _k in pagefile.iter_page_keys(clean) if t == pagefile.PageType.DATA]
    for n in range(30):
        shutil.copyfile(clean, path)
        mutate(path, rnd, 1024, rnd.choice(data_pages) if n % 2 else None)
        reasons.update(p.reason.split(":")[0].split(" (")[0] for p in pagefile.verify(path))
        assert_same(path)
    # the mutations reached the chain checks and the page checks
    assert any("overflow chain" in r for r in reasons), reasons
    assert any(not r.startswith("overflow chain") for r in reasons), reasons
    for cut in (os.path.getsize(clean) - 1024, os.path.getsize(clean) - 700, 4096, 1500):
        shutil.copyfile(clean, path)
        os.truncate(path, cut)
        assert_same(path)


@needs_accel
def test_read_error_in_a_chain_surfaces_after_the_same_items(tmp_path, monkeypatch) -> None:
    """A chain page read by pread (outside the window) that fails to read: both paths
    hand out the same items, then raise the same OSError."""
    monkeypatch.setattr(pagefile.PageReader, "CHUNK", 4 * 1024)
    monkeypatch.setattr(pagefile.PageReader, "LOOKAHEAD", 0)
    path = build_chains(tmp_path)
    real = os.pread
    singles = [0]
    fail_at = [0]

    def failing(fd, n, off):
        if n == 1024:                                 # a chain page read alone
            singles[0] += 1
            if singles[0] == fail_at[0]:
                raise OSError(5, "Input/output error")
        return real(fd, n, off)

    monkeypatch.setattr(os, "pread", failing)
    batches = iter(pagefile.iter_live_batches(path))  # probe: the reads of the first batch
    next(batches)
    fail_at[0] = singles[0] + 1                      # fail in the batch after it
    batches.close()

    def items():
        singles[0] = 0
        out = []
        try:
            for batch in pagefile.iter_live_batches(path):
                out.extend(batch)
        except OSError as e:
            out.append(("oserror", e.errno))
        return out

    want, _ = _run(items, "pure")
    got, _ = _run(items, "accel")
    assert want[-1] == ("oserror", 5) and len(want) > 1
    assert got == want


# -- check_pages ------------------------------------------------------------------------
def _reference_check_pages(buf, first, ps):
    for j in range(0, len(buf), ps):
        reason = check_page(buf[j:j + ps], first + j // ps, ps)
        if reason:
            return first + j // ps, reason
    return None, None


@pytest.mark.parametrize("mode", ["pure", "accel"])
def test_check_pages_is_check_page_of_each_page(tmp_path, mode) -> None:
    if mode == "accel" and BUILT is None:
        pytest.skip("checkpoint._pageaccel is not built")
    clean = build_chains(tmp_path)
    data = open(clean, "rb").read()
    rnd = random.Random(9)
    saved = switch.page
    switch.page = BUILT if mode == "accel" else None
    try:
        assert pagefile.check_pages(data, 0, 1024) == (None, None)
        assert pagefile.check_pages(memoryview(data)[5 * 1024:], 5, 1024) == (None, None)
        assert pagefile.check_pages(b"", 7, 1024) == (None, None)
        # a misplaced run (first index off by one) fails at its first page
        assert pagefile.check_pages(data[1024:3072], 2, 1024)[0] == 2
        path = str(tmp_path / "bad.bin")
        for _ in range(60):
            shutil.copyfile(clean, path)
            mutate(path, rnd, 1024)
            bad = open(path, "rb").read()
            start = rnd.randrange(0, len(bad) // 1024)
            cut = rnd.choice([len(bad), len(bad) - 300])
            buf = bytearray(bad[start * 1024:cut])
            assert pagefile.check_pages(buf, start, 1024) == _reference_check_pages(buf, start, 1024)
        short = data[1024:2048 + 100]
        assert pagefile.check_pages(short, 1, 1024) == (2, "short page: 100 of 1024 bytes")
    finally:
        switch.page = saved


# -- CRC32C -----------------------------------------------------------------------------
@needs_accel
@pytest.mark.parametrize("hw", [True, False])
def test_crc_matches_crc32c_package(hw) -> None:
    before = BUILT.use_hw(hw)
    try:
        rnd = random.Random(hw)
        for n in list(range(0, 40)) + [1020, 4092, 65532, 100_001]:
            data = rnd.randbytes(n + 8)
            for off in (0, 1, 3, 7):
                chunk = data[off:off + n]
                for value in (0, 0xFFFFFFFF, rnd.getrandbits(32)):
                    assert BUILT.crc32c(chunk, value) == crc32c.crc32c(chunk, value=value)
            page = bytearray(rnd.randbytes(1024))
            pagefile.seal(page)
            assert BUILT.crc32c(memoryview(page)[4:]) == pagefile.page_crc(page)
    finally:
        BUILT.use_hw(before)


@needs_accel
def test_table_crc_decodes_identically(tmp_path) -> None:
    """The whole decoder with the table CRC (machines without SSE4.2)."""
    before = BUILT.use_hw(False)
    try:
        path = build_chains(tmp_path)
        assert_same(path)
        bad = str(tmp_path / "bad.bin")
        shutil.copyfile(path, bad)
        mutate(bad, random.Random(3), 1024)
        assert_same(bad)
    finally:
        BUILT.use_hw(before)


# -- switching it on and off ------------------------------------------------------------
def _accelerator_in_child(env_value: str | None, py_env) -> str:
    env = dict(py_env)
    env.pop(pagefile.ACCEL_ENV, None)
    if env_value is not None:
        env[pagefile.ACCEL_ENV] = env_value
    r = subprocess.run([sys.executable, "-c", "from checkpoint import pagefile; "
                        "print(pagefile.accelerator())"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@needs_accel
def test_env_turns_it_off(py_env) -> None:
    assert _accelerator_in_child(None, py_env).startswith("c")
    assert _accelerator_in_child("0", py_env) == "None"


def test_a_module_of_another_version_is_not_used(monkeypatch) -> None:
    import importlib
    fake = type(sys)("checkpoint._pageaccel")
    fake.ABI_VERSION = 999
    monkeypatch.setattr(importlib, "import_module", lambda name: fake)
    monkeypatch.delenv(pagefile.ACCEL_ENV, raising=False)
    assert switch.load_page_accel() is None


def test_checks_give_the_reasons_of_check_page_on_a_bad_page(tmp_path) -> None:
    """Whatever decodes, the strict reader's error is check_page's reason for the page."""
    path = build_chains(tmp_path)
    meta = read_meta(path)
    with open(path, "r+b") as f:
        f.seek(3 * 1024 + 500)
        f.write(b"\xff")
    for mode in (["pure", "accel"] if BUILT is not None else ["pure"]):
        def first_error():
            try:
                for _ in pagefile.iter_page_keys(path):
                    pass
            except CorruptPageError as e:
                return e.page, e.reason
        got, _ = _run(first_error, mode)
        with open(path, "rb") as f:
            f.seek(3 * 1024)
            assert got == (3, check_page(f.read(meta.page_size), 3, meta.page_size))


@needs_accel
def test_verified_columns_skip_the_crc_but_not_the_structure(tmp_path) -> None:
    """``verified=True`` (the install scan checked every page): a page whose CRC no
    longer matches is decoded without a CRC check, but a page whose slot directory is
    broken is still refused, with check_data's reason."""
    path = build_chains(tmp_path)
    want = events(path, "live", True)
    ps = read_meta(path).page_size
    data_pages = [i for i, t, _u, keys in pagefile.iter_page_keys(path)
                  if t == pagefile.PageType.DATA and keys]
    bad = str(tmp_path / "crc.bin")
    shutil.copyfile(path, bad)
    with open(bad, "r+b") as f:                # the stored CRC alone is wrong
        f.seek(data_pages[0] * ps)
        f.write(b"\xff\xff\xff\xff")
    assert events(bad, "columns", True)[-1][0] == "raised"
    for mode in ("pure", "accel"):
        got, _checked = _run(lambda: events(bad, "columns", True, verified=True), mode)
        assert got == want
    with open(bad, "r+b") as f:                # slot directory past the page: refused
        f.seek(data_pages[0] * ps + pagefile.HDR)
        f.write(struct.pack("<H", ps - 2))
    for mode in ("pure", "accel"):
        got, _checked = _run(lambda: events(bad, "columns", True, verified=True), mode)
        assert got[-1][0] == "raised" and f"page {data_pages[0]}" in got[-1][1]
