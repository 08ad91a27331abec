"""Rebuild equals the incrementally maintained index; progress, cancel, crash safety."""
from __future__ import annotations

import json
import os
import random
import subprocess
import textwrap
import threading

import pytest

from indexes import (EMPTY, IndexDefinition, IndexNotReadyError, IndexStore, MemorySource,
                     PartitionFileSource, RebuildCancelled)
from pagegen import write_partition_file

from idx_helpers import doc, dump

DEFS = [IndexDefinition("age", "age", type="int"),
        IndexDefinition("city", "addr.city"),
        IndexDefinition("email", "email", unique=True)]


def make_data(n: int, seed: int = 1) -> dict[bytes, bytes]:
    rnd = random.Random(seed)
    out = {}
    for i in range(n):
        d: dict = {"age": rnd.randrange(100), "email": f"u{i}@example.com",
                   "addr": {"city": rnd.choice(["Oslo", "Lima", "Pune", "", "Zürich"])}}
        if i % 97 == 0:
            del d["age"]                     # skipped by policy, counted
        out[b"user:%08d" % i] = json.dumps(d).encode()
    return out


def _scratch(tmp_path, name: str) -> str:
    """A directory on tmpfs when there is one: the incremental reference store does
    one synced commit per entry, which is slow on a real disk and tests nothing here."""
    import tempfile
    if os.path.isdir("/dev/shm"):
        return os.path.join(tempfile.mkdtemp(dir="/dev/shm", prefix="idx-"), name)
    return str(tmp_path / name)


def incremental(path: str, partition: int, data: dict[bytes, bytes]) -> IndexStore:
    store = IndexStore.open(path, DEFS)
    store.rebuild(partition, EMPTY)
    for k, v in data.items():
        store.apply(partition, k, None, v)
    return store


def test_rebuild_with_spilled_runs_equals_incremental_index(tmp_path) -> None:
    data = make_data(3000)
    where = _scratch(tmp_path, "inc")
    inc = incremental(where, 5, data)
    reb = IndexStore.open(str(tmp_path / "reb"), DEFS)
    src = MemorySource({5: data})
    res = reb.rebuild(5, src, memory_limit=20_000, batch=1000)   # many runs, many batches
    assert res.runs >= 2 and res.scanned == 3000
    assert res.entries == len(dump(inc, 5)) == 3 * 3000 - res.bad
    assert dump(reb, 5) == dump(inc, 5)
    assert reb.ready(5) and reb.verify(5, src).ok and inc.verify(5, src).ok
    assert reb.lookup("city", "Lima") == inc.lookup("city", "Lima")
    assert reb.range("age", 10, 20) == inc.range("age", 10, 20)
    inc.close()
    reb.close()
    if where.startswith("/dev/shm"):
        import shutil
        shutil.rmtree(os.path.dirname(where), ignore_errors=True)


def test_rebuild_from_a_partition_file(tmp_path) -> None:
    data = make_data(2000, seed=2)
    items = list(data.items()) + [(b"gone", None)]          # a tombstone is not indexed
    write_partition_file(str(tmp_path / "part-9.bin"), 9, items)
    src = PartitionFileSource(str(tmp_path))
    assert src.partitions() == [9]
    with IndexStore.open(str(tmp_path / "idx"), DEFS) as s:
        res = s.rebuild(9, src)
        assert res.scanned == 2000
        assert s.verify(9, src).ok
        assert dump(s, 9) == dump(s_mem := _mem_rebuild(tmp_path, 9, data), 9)
        s_mem.close()


def _mem_rebuild(tmp_path, p: int, data: dict[bytes, bytes]) -> IndexStore:
    s = IndexStore.open(str(tmp_path / "mem"), DEFS)
    s.rebuild(p, MemorySource({p: data}))
    return s


@pytest.mark.slow
def test_rebuild_at_scale_equals_incremental_index(tmp_path) -> None:
    """300k values, 3 indexes, the rebuild's default load batch and a sort memory in the
    range of real ones. The incremental side goes through the write path in batches
    (apply_many: 1,000 updates per commit) to keep the test short; the file source is
    covered by the small tests (its scan speed is checkpoint's).

    What the size is for: 900k index entries are 9 LMDB commits of the default batch
    (DEFAULT_BATCH, 100k keys), and with 16 MiB of sort memory they spill runs (3) whose
    merge reads blocks at their 1 MiB cap (memory_limit / 16 >= 1 MiB), where the small
    test (20 kB, batch 1000) has tiny blocks and batches. A growing LMDB map during the
    load is test_full_map_grows_instead_of_failing's; more entries add nothing here
    (the test used 1M values and 32 MiB: 5 runs, 30 commits, 32 s)."""
    from indexes.rebuild import DEFAULT_BATCH
    n = 300_000
    assert 3 * n > 5 * DEFAULT_BATCH
    data = {b"k%09d" % i: b'{"age": %d, "addr": {"city": "c%d"}, "email": "e%d"}'
            % (i % 1000, i % 37, i) for i in range(n)}
    base = _scratch(tmp_path, "inc")
    try:
        inc = IndexStore.open(base, DEFS)
        inc.rebuild(1, EMPTY)
        items = list(data.items())
        for i in range(0, n, 1000):
            inc.apply_many(1, [(k, None, v) for k, v in items[i:i + 1000]])
        reb = IndexStore.open(str(tmp_path / "reb"), DEFS)
        res = reb.rebuild(1, MemorySource({1: data}), memory_limit=16 << 20)
        assert res.runs >= 2 and res.entries == 3 * n
        assert dump(reb, 1) == dump(inc, 1)
        inc.close()
        reb.close()
    finally:
        import shutil
        shutil.rmtree(os.path.dirname(base) if base.startswith("/dev/shm") else base,
                      ignore_errors=True)


def test_progress_reports_and_cancel(tmp_path) -> None:
    data = make_data(6_000)
    reports = []
    with IndexStore.open(str(tmp_path), DEFS) as s:
        s.rebuild(0, MemorySource({0: data}), progress=reports.append, batch=2000)
        stages = [r.stage for r in reports]
        assert stages[0] == "clear" and "scan" in stages and "load" in stages
        last_load = [r for r in reports if r.stage == "load"][-1]
        assert last_load.done == last_load.total and last_load.eta == 0
        assert all(r.total == 6_000 for r in reports if r.stage == "scan")

        stop = threading.Event()

        def on(p) -> None:
            if p.stage == "load":           # the forced report at the start of the stage
                stop.set()
        with pytest.raises(RebuildCancelled):
            s.rebuild(0, MemorySource({0: data}), progress=on, cancel=stop, batch=2000)
        assert not s.ready(0)
        assert s.lookup("city", "Oslo") == []                     # partial index not served
        with pytest.raises(IndexNotReadyError):
            s.apply(0, b"x", None, doc(age=1))
        s.rebuild(0, MemorySource({0: data}))
        assert s.ready(0) and s.verify(0, MemorySource({0: data})).ok


def test_rebuild_starts_clean_over_stale_entries_and_counts_duplicates(tmp_path) -> None:
    old = make_data(500, seed=3)
    new = make_data(400, seed=4)
    with IndexStore.open(str(tmp_path), DEFS) as s:
        s.rebuild(2, MemorySource({2: old}))
        twice = list(new.items()) + list(new.items())[:10]

        class Repeating:
            def scan(self, p):
                return iter(twice)
        res = s.rebuild(2, Repeating())
        assert res.duplicates == sum(1 for k, v in list(new.items())[:10]
                                     for _ in range(3 - (b'"age"' not in v)))
        assert s.verify(2, MemorySource({2: new})).ok


def test_unique_conflicts_in_the_data_are_reported_not_fatal(tmp_path) -> None:
    data = {b"a": doc(email="x@y"), b"b": doc(email="x@y"), b"c": doc(email="z@y")}
    with IndexStore.open(str(tmp_path), DEFS) as s:
        res = s.rebuild(0, MemorySource({0: data}))
        assert res.unique_conflicts == 1 and "x@y" in res.unique_samples[0]
        assert s.lookup("email", "x@y") == [b"a", b"b"]


def test_full_map_grows_instead_of_failing(tmp_path) -> None:
    data = make_data(8_000)
    with IndexStore.open(str(tmp_path), DEFS, map_size=256 << 10) as s:
        s.rebuild(0, MemorySource({0: data}))
        for i in range(50):
            s.apply(0, b"new%d" % i, None, doc(age=i, email=f"n{i}"))
        assert s._env.map_size() > 256 << 10
        assert len(s.lookup("age", 7)) > 1


CHILD = textwrap.dedent("""
    import sys
    from indexes import IndexDefinition, IndexStore, PartitionFileSource
    defs = [IndexDefinition("age", "age", type="int"), IndexDefinition("city", "addr.city"),
            IndexDefinition("email", "email", unique=True)]
    s = IndexStore.open(sys.argv[1], defs)
    s.rebuild(4, PartitionFileSource(sys.argv[2]), batch=1000)
    print("FINISHED")
""")


def test_sigkill_mid_rebuild_leaves_not_ready_and_next_rebuild_is_clean(tmp_path, py_env,
                                                                       python) -> None:
    idx, data_dir = str(tmp_path / "idx"), tmp_path / "data"
    data_dir.mkdir()
    old, new = make_data(3000, seed=5), make_data(3000, seed=6)
    with IndexStore.open(idx, DEFS) as s:                     # stale entries from old data
        s.rebuild(4, MemorySource({4: old}))
    write_partition_file(str(data_dir / "part-4.bin"), 4, new.items())
    env = dict(py_env, FERRY_CRASH="demander.mid_index_rebuild:3")
    r = subprocess.run([python, "-c", CHILD, idx, str(data_dir)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, r.stderr
    assert "FINISHED" not in r.stdout
    src = PartitionFileSource(str(data_dir))
    with IndexStore.open(idx, DEFS) as s:
        assert not s.ready(4)
        assert 0 < len(dump(s, 4)) < 3 * 3000                 # partly written
        assert s.lookup("city", "Oslo") == []                  # and not served
        rep = s.verify(4, src)
        assert not rep.ok and not rep.ready
        s.rebuild(4, src)
        assert s.ready(4) and s.verify(4, src).ok
        got = dump(s, 4)
    with IndexStore.open(str(tmp_path / "fresh"), DEFS) as f:
        f.rebuild(4, src)
        assert got == dump(f, 4)                                # no duplicate, no stale entry


def _partition_store_available() -> bool:
    try:
        from checkpoint.store import PartitionStore  # noqa: F401
        from wal import Wal  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.mark.skipif(not _partition_store_available(),
                    reason="checkpoint.PartitionStore / wal.Wal not importable in this checkout")
def test_rebuild_from_checkpoint_partition_store_and_its_file(tmp_path) -> None:
    from checkpoint.store import PartitionStore
    ps = PartitionStore.open(str(tmp_path / "node"), wal_sync="none", checkpoint_interval=None)
    try:
        for i in range(1500):
            ps.put(3, b"k%05d" % i, doc(age=i % 10, email=f"e{i}"))
        ps.remove(3, b"k00005")
        with IndexStore.open(str(tmp_path / "idx"), DEFS) as s:
            res = s.rebuild(3, ps)                       # live scan of page memory
            assert res.scanned == 1499 and s.lookup("age", 5) == [
                b"k%05d" % i for i in range(15, 1500, 10)]
            ps.checkpoint()
            assert s.verify(3, PartitionFileSource(ps.dir)).ok   # == the checkpointed file
    finally:
        ps.close()


def test_external_sort_block_merge_many_runs_duplicates_and_data(tmp_path) -> None:
    """Many small runs (blocks of 64 keys), keys given twice across runs, keys with
    data: the merged stream is the sorted input, duplicates adjacent, data kept."""
    import random
    from indexes.extsort import ExternalSorter
    rnd = random.Random(5)
    keys = [b"%06d-%s" % (rnd.randrange(5000), b"x" * rnd.randrange(40)) for _ in range(6000)]
    with_data = {k: b"d" + k for k in keys[::17]}
    s = ExternalSorter(str(tmp_path / "scratch"), memory_limit=20_000)
    for k in keys:
        if k in with_data:
            s.add_with_data(k, with_data[k])
        else:
            s.append(k)
        if rnd.random() < 0.05:
            s.check()
    assert len(s.runs) >= 5
    got = list(s.sorted())
    s.close()
    assert [k for k, _ in got] == sorted(keys)
    assert all(d == with_data.get(k, b"") for k, d in got)
    assert not os.path.exists(str(tmp_path / "scratch")) or not os.listdir(str(tmp_path / "scratch"))
