"""The LMDB layout: every partition's entries in one duplicate-sorted database keyed by
partition (entries with data in a second one, keyed by partition | entry key).

No limit on the number of partitions (one named database each ran into LMDB's
``max_dbs``: DbsFullError at the 4,096th); a partition's clear, drop and rebuild touch
its own entries only, a rebuild between filled partitions stores what one alone
stores; a store of the older layout is replaced by an empty one that keeps its
definitions (every partition rebuilt from its data), a newer one is refused."""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from typing import Iterator

import lmdb
import pytest

from indexes import (EMPTY, IndexDefinition, IndexStore, IndexStoreError, MemorySource)
from indexes import entrydb, meta
from indexes.verify import stored

from idx_helpers import doc

DEFS = [IndexDefinition("age", "age", type="int"),
        IndexDefinition("email", "email", unique=True)]


@pytest.fixture
def fast_dir(tmp_path) -> Iterator[str]:
    """tmpfs when there is one: every LMDB commit is synced, and thousands of them on
    a real disk only measure the disk."""
    if not os.path.isdir("/dev/shm"):
        yield str(tmp_path / "ix")
        return
    d = tempfile.mkdtemp(dir="/dev/shm", prefix="idx-layout-")
    try:
        yield os.path.join(d, "ix")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _data(p: int, n: int = 3) -> dict[bytes, bytes]:
    """n documents, and one whose primary key is too long for a key (its entries have
    data: they live in the ``long`` database)."""
    out = {b"k%d-%d" % (p, i): doc(age=(p * 7 + i) % 50, email=f"{p}.{i}@x")
           for i in range(n)}
    out[b"L" * 600 + b"%d" % p] = doc(age=p % 50, email=f"long{p}@x")
    return out


def test_5000_partitions_in_one_store(fast_dir) -> None:
    n = 5000
    src = MemorySource({p: _data(p) for p in range(n)})
    s = IndexStore.open(fast_dir, DEFS)
    for p in range(n):                       # DbsFullError at p = 4095 with a database each
        s.rebuild(p, src)
    assert s.ready_partitions() == list(range(n))
    want = sorted(k for p in range(n) for k, v in src.data[p].items()
                  if json.loads(v)["age"] == 7)
    assert s.lookup("age", 7) == want
    s.apply(4321, b"new", None, doc(age=7, email="new@x"))
    s.drop(17)
    s.close()
    s = IndexStore.open(fast_dir)
    assert len(s.ready_partitions()) == n - 1 and not s.ready(17)
    assert s.lookup("age", 7) == sorted(set(want) - set(src.data[17]) | {b"new"})
    assert s.entry_count(4321) == 2 * 4 + 2 and s.entry_count(17) == 0
    s.close()


@pytest.mark.parametrize("op", ["drop", "clear", "rebuild"])
def test_a_partition_operation_touches_its_own_entries_only(fast_dir, op: str) -> None:
    edge = entrydb.MAX_PARTITION
    parts = [0, 1, 2, 255, 256, 257, edge - 1, edge]
    src = MemorySource({p: _data(p) for p in parts})
    s = IndexStore.open(fast_dir, DEFS)
    for p in parts:
        s.rebuild(p, src)
    before = {p: list(stored(s, p)) for p in parts}
    for p in (1, 256, edge):
        if op == "rebuild":
            s.rebuild(p, MemorySource({p: {b"only": doc(age=1, email="o@x")}}))
        else:
            getattr(s, op)(p)
    for p in parts:
        if p in (1, 256, edge):
            assert len(list(stored(s, p))) == s.entry_count(p) == (2 if op == "rebuild" else 0)
        else:
            assert list(stored(s, p)) == before[p] and s.entry_count(p) == 8
            assert sum(1 for _, data in before[p] if data) == 2     # the long key's
    s.close()


@pytest.mark.parametrize("p", [-1, entrydb.MAX_PARTITION + 1, 1 << 40])
def test_a_partition_outside_u32_is_refused(fast_dir, p: int) -> None:
    with IndexStore.open(fast_dir, DEFS) as s, pytest.raises(IndexStoreError, match="outside"):
        s.rebuild(p, EMPTY)


class _Twice:
    """A source that gives every pair twice (a duplicate is stored once, counted)."""

    def __init__(self, data: dict[bytes, bytes]) -> None:
        self.data = data

    def scan(self, partition: int) -> Iterator[tuple[bytes, bytes]]:
        for kv in self.data.items():
            yield kv
            yield kv


def test_a_rebuild_between_filled_partitions_stores_what_one_alone_stores(
        fast_dir, tmp_path) -> None:
    data = {b"u%05d" % i: doc(age=i % 90, email=f"{i}@x") for i in range(3000)}
    data.update({b"L" * 600 + b"%d" % i: doc(age=i, email=f"L{i}@x") for i in range(5)})
    alone = IndexStore.open(str(tmp_path / "alone"), DEFS)
    r_end = alone.rebuild(5, _Twice(data), batch=700)
    mid = IndexStore.open(fast_dir, DEFS)
    for p in (4, 6):
        mid.rebuild(p, MemorySource({p: _data(p, 50)}))
    r_mid = mid.rebuild(5, _Twice(data), batch=700)
    assert list(stored(mid, 5)) == list(stored(alone, 5))
    assert (r_mid.entries, r_mid.duplicates) == (r_end.entries, r_end.duplicates) == (6010, 6010)
    r_again = mid.rebuild(5, _Twice(data), batch=700)        # over its own old entries
    assert (r_again.entries, r_again.duplicates) == (6010, 6010)
    assert list(stored(mid, 5)) == list(stored(alone, 5))
    assert [mid.entry_count(p) for p in (4, 6)] == [102, 102]
    assert mid.lookup("age", 3) == sorted([b"u00003", b"u00093"] + [b"u%05d" % i for i in
                                          range(183, 3000, 90)] + [b"L" * 600 + b"3"]
                                         + [k for p in (4, 6) for k, v in _data(p, 50).items()
                                            if json.loads(v)["age"] == 3])
    alone.close()
    mid.close()


# -- layout format ------------------------------------------------------------------------
def _write_old_layout(path: str) -> None:
    """An environment as the layout before this one wrote it: a named database
    ``p/<partition>`` per partition, keys ``u16 index id | value | primary key``."""
    os.makedirs(path)
    env = lmdb.open(path, max_dbs=16, subdir=True)
    ids = {"age": 1, "email": 2}
    body = {"next_id": 3, "defs": [dict(d.to_json(), id=ids[d.name]) for d in DEFS]}
    with env.begin(write=True) as txn:
        m = env.open_db(b"meta", txn=txn)
        txn.put(b"format", b"1", db=m)
        txn.put(b"codec", b'"json"', db=m)
        txn.put(b"indexes", json.dumps(body).encode(), db=m)
        txn.put(b"ready/3", json.dumps({"fingerprint": "x", "entries": 1, "bad": 0,
                                        "at": 0}).encode(), db=m)
        p3 = env.open_db(b"p/3", txn=txn)
        txn.put(b"\x00\x01" + b"stale-entry", b"", db=p3)
    env.close()


def test_an_older_layout_is_replaced_and_its_partitions_rebuilt_from_data(tmp_path, caplog) -> None:
    path = str(tmp_path / "ix")
    _write_old_layout(path)
    with caplog.at_level(logging.WARNING, logger="ferry.indexes"):
        s = IndexStore.open(path)                       # the stored definitions
    assert "layout format 1" in caplog.text and "rebuilt from its data" in caplog.text
    assert [d.name for d in s.definitions] == ["age", "email"]
    assert s.schema.ids == {"age": 1, "email": 2}
    assert s.ready_partitions() == [] and list(stored(s, 3)) == []
    with s.env.env.begin() as txn:                      # nothing of the old one is left
        assert meta.layout_format(txn, s.env.meta) == meta.FORMAT
        names = [k for k, _ in txn.cursor()]
    assert sorted(names) == [b"entries", b"long", b"meta"]
    s.rebuild(3, MemorySource({3: {b"a": doc(age=4, email="a@x")}}))
    assert s.lookup("age", 4) == [b"a"]
    s.close()
    with IndexStore.open(path, DEFS) as again:         # now this layout: kept as it is
        assert again.ready_partitions() == [3] and again.lookup("age", 4) == [b"a"]


def test_an_older_layout_opened_with_definitions_is_replaced_too(tmp_path) -> None:
    path = str(tmp_path / "ix")
    _write_old_layout(path)
    with IndexStore.open(path, DEFS + [IndexDefinition("n", "n")]) as s:
        assert s.ready_partitions() == [] and s.schema.ids["age"] == 1
        assert s.schema.ids["n"] == 3


def test_a_newer_layout_is_refused(tmp_path) -> None:
    path = str(tmp_path / "ix")
    IndexStore.open(path, DEFS).close()
    env = lmdb.open(path, max_dbs=4, subdir=True)
    with env.begin(write=True) as txn:
        txn.put(b"format", json.dumps(meta.FORMAT + 1).encode(), db=env.open_db(b"meta", txn=txn))
    env.close()
    with pytest.raises(IndexStoreError, match=rf"layout format {meta.FORMAT + 1}, newer than "
                                              rf"this version's {meta.FORMAT}.*delete the directory"):
        IndexStore.open(path)
    assert os.path.exists(os.path.join(path, "data.mdb"))    # refused, not deleted


def test_ready_markers_hold_only_for_the_layout_they_were_built_in(tmp_path) -> None:
    with IndexStore.open(str(tmp_path / "ix"), DEFS) as s:
        s.rebuild(1, EMPTY)
        fp = s.marker(1)["fingerprint"]
    old = meta.Schema(s.schema.codec, s.schema.definitions, s.schema.ids, s.schema.next_id)
    assert old.fingerprint == fp
    import xxhash
    without_format = xxhash.xxh3_64_hexdigest(json.dumps(
        [old.codec, [[old.ids[d.name], d.to_json()] for d in old.definitions]],
        sort_keys=True).encode())
    assert without_format != fp          # a Ferry of the older layout finds nothing ready
