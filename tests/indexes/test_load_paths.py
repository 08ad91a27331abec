"""The rebuild's two load paths give the same LMDB contents and results: all keys in
memory (one sort, putmulti straight from the buffer) and the external sort (tiny
memory budget: runs spilled, k-way merge). Also cancel and a full disk on each."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
from typing import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from indexes import (IndexDefinition, IndexStore, MemorySource, OutOfDiskError,
                     RebuildCancelled, keycodec)

from idx_helpers import dump

DEFS = [IndexDefinition("age", "age", type="int"),
        IndexDefinition("city", "city"),
        IndexDefinition("email", "email", unique=True),
        IndexDefinition("tag", "tag", unique=True, type="str"),
        IndexDefinition("flag", "flag")]


@contextlib.contextmanager
def _dir() -> Iterator[str]:
    """tmpfs when there is one: these tests open several stores per example."""
    d = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None,
                         prefix="idx-load-")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


class Listed:
    """A source that may give a key twice (the loader keeps it once, counted)."""

    def __init__(self, items: list[tuple[bytes, bytes]]) -> None:
        self.items = items

    def scan(self, p: int) -> Iterator[tuple[bytes, bytes]]:
        return iter(self.items)


def _expected(store: IndexStore, items: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The reference: every entry the indexer gives, deduplicated, in key order."""
    out: dict[bytes, bytes] = {}
    for pk, v in items:
        for e in store.indexer.entries(pk, v)[0]:
            out[e.key] = e.data
    return sorted(out.items())


def _conflicts(store: IndexStore, entries: list[tuple[bytes, bytes]]) -> int:
    """Values of unique indexes held by n keys count n - 1."""
    uniq = {keycodec.index_prefix(store.schema.ids[d.name]) for d in DEFS if d.unique}
    heads: dict[bytes, int] = {}
    for k, _ in entries:
        if k[:2] in uniq:
            _, enc, _pk = keycodec.split_key(k)
            heads[k[:2] + enc] = heads.get(k[:2] + enc, 0) + 1
    return sum(n - 1 for n in heads.values())


pks = st.one_of(st.binary(min_size=1, max_size=12),
                st.binary(min_size=300, max_size=520))      # long: hashed pk, data
values = st.one_of(st.integers(-5, 5), st.sampled_from(["a", "b", "", "a\x00"]),
                   st.text(max_size=6), st.text(min_size=210, max_size=260),  # long value
                   st.booleans(), st.none(), st.floats(allow_nan=False))
docs = st.fixed_dictionaries({}, optional={"age": values, "city": values, "email": values,
                                           "tag": values, "flag": values})


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(st.tuples(pks, docs), max_size=120), st.integers(0, 15),
       st.integers(1, 64), st.sampled_from([300, 2_000, 30_000]))
def test_in_memory_and_external_loads_store_the_same(rows, repeat, batch, tiny) -> None:
    items = [(pk, json.dumps(d).encode()) for pk, d in rows]
    items += items[:repeat]                                   # given twice
    with _dir() as d:
        got = {}
        for name, mem in (("mem", None), ("ext", tiny)):
            with IndexStore.open(os.path.join(d, name), DEFS) as s:
                res = s.rebuild(0, Listed(items), memory_limit=mem, batch=batch)
                got[name] = (dump(s, 0), res)
                assert s.ready(0)
                want = _expected(s, items)
                assert got[name][0] == want
                assert res.unique_conflicts == _conflicts(s, want)
                assert res.entries == len(want)
        (a, ra), (b, rb) = got["mem"], got["ext"]
        assert ra.runs == 0
        assert a == b
        for f in ("scanned", "entries", "bad", "bad_samples", "duplicates",
                  "unique_conflicts", "unique_samples"):
            assert getattr(ra, f) == getattr(rb, f), f


def _data(n: int) -> dict[bytes, bytes]:
    return {b"k%06d" % i: json.dumps({"age": i % 90, "city": f"c{i % 37}",
                                      "email": f"e{i // 2}", "tag": "x" * (i % 3)}).encode()
            for i in range(n)}


def test_external_path_spills_runs_and_matches_in_memory() -> None:
    data = _data(5_000)
    with _dir() as d, IndexStore.open(os.path.join(d, "a"), DEFS) as a, \
            IndexStore.open(os.path.join(d, "b"), DEFS) as b:
        ra = a.rebuild(1, MemorySource({1: data}))
        rb = b.rebuild(1, MemorySource({1: data}), memory_limit=10_000, batch=777)
        assert ra.runs == 0 and rb.runs >= 5
        assert dump(a, 1) == dump(b, 1) and ra.to_dict() | {"runs": 0, "seconds": 0} == \
            rb.to_dict() | {"runs": 0, "seconds": 0}
        assert ra.unique_conflicts == 2_500 + (5_000 - 3)   # email pairs; 3 tags


@pytest.mark.parametrize("memory", [None, 10_000])
def test_cancel_mid_load_leaves_not_ready_on_both_paths(memory) -> None:
    data = _data(4_000)
    stop = threading.Event()
    loads = []

    def on(p) -> None:
        if p.stage == "load":
            loads.append(p.done)
            if p.done > 0:                  # after the first commit
                stop.set()
    with _dir() as d, IndexStore.open(d, DEFS) as s:
        with pytest.raises(RebuildCancelled):
            # A progress report at most every 0.2 s: batch=1 gives many commits.
            s.rebuild(2, MemorySource({2: data}), memory_limit=memory, batch=1,
                      progress=on, cancel=lambda: stop.is_set() or len(dump(s, 2)) > 50)
        assert not s.ready(2) and s.lookup("city", "c1") == []
        assert 0 < len(dump(s, 2)) < 4 * 4_000
        s.rebuild(2, MemorySource({2: data}), memory_limit=memory)
        assert s.ready(2) and s.verify(2, MemorySource({2: data})).ok


def _can_mount() -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    d = tempfile.mkdtemp()
    try:
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", d],
                            capture_output=True).returncode == 0
        if ok:
            subprocess.run(["umount", d], check=True)
        return ok
    finally:
        os.rmdir(d)


@contextlib.contextmanager
def _small_fs(size: str) -> Iterator[str]:
    d = tempfile.mkdtemp()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", d], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", d], check=False)
        os.rmdir(d)


@pytest.mark.skipif(not _can_mount(), reason="needs root and a tmpfs mount for a full disk")
@pytest.mark.parametrize("memory", [None, 20_000])
def test_full_disk_raises_out_of_disk_and_leaves_not_ready(memory) -> None:
    """A full disk under the run files (external path) or under LMDB (both paths) is
    OutOfDiskError naming a file; the partition is not ready; with room again the
    rebuild succeeds and equals one on a roomy disk."""
    data = _data(20_000)
    with _small_fs("12m") as fs, _dir() as ref:
        s = IndexStore.open(os.path.join(fs, "idx"), DEFS)
        with s:
            free = shutil.disk_usage(fs).free
            filler = os.path.join(fs, "filler")
            with open(filler, "wb") as f:
                f.write(b"\0" * max(0, free - (256 << 10)))
            with pytest.raises(OutOfDiskError) as e:
                s.rebuild(3, MemorySource({3: data}), memory_limit=memory)
            assert fs in str(e.value)
            assert not s.ready(3)
            scratch = os.path.join(fs, "idx", "scratch")
            assert not os.path.exists(scratch) or not os.listdir(scratch)   # runs removed
            os.unlink(filler)
            s.rebuild(3, MemorySource({3: data}), memory_limit=memory)
            assert s.ready(3)
            with IndexStore.open(ref, DEFS) as r:
                r.rebuild(3, MemorySource({3: data}))
                assert dump(s, 3) == dump(r, 3)


def _keys_of(rows: list[tuple[bytes, object]]) -> list[bytes]:
    from indexes.indexer import Indexer
    ix = Indexer([IndexDefinition("u", "u", unique=True)], {"u": 3}, "json", 511)
    keys = []
    for pk, v in rows:
        for e in ix.entries(pk, json.dumps({"u": v}).encode())[0]:
            keys.append(e.key)
    return sorted(keys)


@pytest.mark.skipif(getattr(__import__("indexes.accel").accel.module, "unique_conflicts", None)
                    is None, reason="the C accelerator (indexes/_ixaccel.c) is not built or is off")
@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([b"a", b"b", b"a\x00", b"\x00\xff"]) | pks, values),
                max_size=60), st.data())
def test_c_unique_scan_equals_the_python_reference(rows, data) -> None:
    from indexes import accel
    from indexes.uniqueness import conflicts_py
    keys = _keys_of(rows)
    keys += keys[:2]                                       # repeats: not conflicts
    keys.sort()
    lo = data.draw(st.integers(0, len(keys)))
    hi = data.draw(st.integers(lo, len(keys)))
    last = data.draw(st.sampled_from([b""] + keys[:lo]))
    assert accel.module.unique_conflicts(keys, lo, hi, last) == conflicts_py(keys, lo, hi, last)
    with pytest.raises(ValueError):
        accel.module.unique_conflicts([b"\x00\x03\x77"], 0, 1, b"")
