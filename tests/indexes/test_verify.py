"""verify: missing, extra and wrong entries, exact counts, capped details."""
from __future__ import annotations

from indexes import IndexDefinition, IndexStore, MemorySource

from idx_helpers import doc


def test_missing_extra_wrong_with_exact_counts_and_capped_details(tmp_path) -> None:
    defs = [IndexDefinition("age", "age")]
    data = {b"k%03d" % i: doc(age=i) for i in range(100)}
    with IndexStore.open(str(tmp_path), defs) as s:
        s.rebuild(0, MemorySource({0: data}))
        for i in range(10):                               # 10 entries now point elsewhere
            s.apply(0, b"k%03d" % i, data[b"k%03d" % i], doc(age=1000 + i))
        for i in range(10, 15):                           # 5 missing
            s.apply(0, b"k%03d" % i, data[b"k%03d" % i], None)
        for i in range(7):                                # 7 extra
            s.apply(0, b"x%d" % i, None, doc(age=i))
        rep = s.verify(0, MemorySource({0: data}))
        assert (rep.missing_count, rep.extra_count, rep.wrong_count) == (5, 7, 10)
        assert {w.key: (w.indexed, w.expected) for w in rep.wrong}[b"k003"] == (1003, 3)
        assert {m.key for m in rep.missing} == {b"k%03d" % i for i in range(10, 15)}
        assert rep.expected == 100 and rep.indexed == 102 and not rep.ok
        small = s.verify(0, MemorySource({0: data}), max_details=3)
        assert small.truncated and len(small.missing) <= 3 and len(small.extra) <= 3
        assert small.missing_count + small.wrong_count >= 5


def test_entries_of_a_removed_index_are_extra_and_partition_not_ready(tmp_path) -> None:
    data = {b"a": doc(age=1, name="n")}
    with IndexStore.open(str(tmp_path), [IndexDefinition("age", "age"),
                                         IndexDefinition("name", "name")]) as s:
        s.rebuild(0, MemorySource({0: data}))
    with IndexStore.open(str(tmp_path), [IndexDefinition("age", "age")]) as s:
        rep = s.verify(0, MemorySource({0: data}))
        assert not rep.ready and rep.extra_count == 1 and rep.extra[0].index.startswith("#")
        s.rebuild(0, MemorySource({0: data}))
        assert s.verify(0, MemorySource({0: data})).ok
