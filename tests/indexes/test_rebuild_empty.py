"""A rebuild from a source with no live pair: one commit, the same ready state."""
from __future__ import annotations

import json

from indexes import EMPTY, IndexDefinition, IndexStore, MemorySource, PartitionFileSource
from pagegen import write_partition_file

from idx_helpers import dump

DEFS = [IndexDefinition("city", "city")]


def _commits(store: IndexStore) -> list[int]:
    """Counts the store's LMDB write transactions from now on."""
    env = store.env
    n = [0]
    inner = env.write

    def write(fn):  # type: ignore[no-untyped-def]
        n[0] += 1
        return inner(fn)
    env.write = write  # type: ignore[method-assign]
    return n


def _stale(store: IndexStore, p: int) -> None:
    """p ready with entries, as an earlier copy of the partition left it."""
    store.rebuild(p, MemorySource({p: {b"k%d" % i: json.dumps({"city": "Oslo"}).encode()
                                       for i in range(5)}}))
    assert len(dump(store, p)) == 5 and store.ready(p)


def test_an_empty_partition_file_is_made_ready_in_one_commit(tmp_path) -> None:
    write_partition_file(str(tmp_path / "part-3.bin"), 3, [(b"gone", None)])   # a tombstone only
    with IndexStore.open(str(tmp_path / "idx"), DEFS) as s:
        _stale(s, 3)
        _stale(s, 4)
        n = _commits(s)
        res = s.rebuild(3, PartitionFileSource(str(tmp_path)))
        assert n[0] == 1
        assert (res.entries, res.scanned, res.bad, res.runs) == (0, 0, 0, 0)
        assert s.ready(3) and dump(s, 3) == []
        m = s.marker(3)
        assert m is not None and (m["entries"], m["bad"]) == (0, 0)
        assert m["fingerprint"] == s.schema.fingerprint
        assert len(dump(s, 4)) == 5 and s.ready(4)          # another partition untouched
        s.apply(3, b"new", None, json.dumps({"city": "Lima"}).encode())
        assert s.lookup("city", "Lima") == [b"new"]
    with IndexStore.open(str(tmp_path / "idx"), DEFS) as s:  # durable, as a rebuild's
        assert s.ready(3) and s.marker(3)["entries"] == 0 and len(dump(s, 3)) == 1


def test_a_source_that_counts_nothing_is_made_ready_in_one_commit(tmp_path) -> None:
    with IndexStore.open(str(tmp_path / "idx"), DEFS) as s:
        _stale(s, 1)
        n = _commits(s)
        s.rebuild(1, EMPTY)
        assert n[0] == 1 and s.ready(1) and dump(s, 1) == []


def test_a_partition_file_with_a_live_pair_is_rebuilt_as_before(tmp_path) -> None:
    write_partition_file(str(tmp_path / "part-3.bin"), 3,
                         [(b"a", json.dumps({"city": "Pune"}).encode()), (b"b", None)])
    with IndexStore.open(str(tmp_path / "idx"), DEFS) as s:
        _stale(s, 3)
        n = _commits(s)
        res = s.rebuild(3, PartitionFileSource(str(tmp_path)))
        assert n[0] == 3                        # clear, one load batch, ready
        assert res.entries == 1 and s.lookup("city", "Pune") == [b"a"] and s.ready(3)
        # a live pair whose value no index takes is still a full rebuild
        write_partition_file(str(tmp_path / "part-3.bin"), 3, [(b"c", b"{}")])
        n[0] = 0
        res = s.rebuild(3, PartitionFileSource(str(tmp_path)))
        assert n[0] == 2 and res.scanned == 1 and res.entries == 0 and dump(s, 3) == []


def test_empty_streamed_keys_are_made_ready_in_one_commit(tmp_path) -> None:
    from checkpoint.pagefile import read_meta
    path = str(tmp_path / "part-2.bin")
    write_partition_file(path, 2, [(b"gone", None)])
    meta = read_meta(path)
    with IndexStore.open(str(tmp_path / "idx"), DEFS) as s:
        _stale(s, 2)
        si = s.streaming(2, path, meta.page_size, meta.page_count, 4)
        si.pages_written(0, meta.page_count)
        built = si.finish(path)
        n = _commits(s)
        res = s.load_streamed(2, built)
        assert n[0] == 1 and res.entries == 0 and s.ready(2) and dump(s, 2) == []
