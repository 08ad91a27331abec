"""Queries read what they answer: ``range(limit=)`` ends the scan, and ``partitions=``
skips the other partitions' databases (a node answers for the partitions it leads)."""
from __future__ import annotations

import json

from indexes import IndexDefinition, IndexStore


class _Source:
    """What a rebuild scans: (key, value) pairs of one partition."""

    def __init__(self, parts: dict[int, list[tuple[bytes, bytes]]]) -> None:
        self.parts = parts

    def scan(self, partition: int):
        return iter(self.parts[partition])


def _store(tmp_path, parts: int = 8, per: int = 2000) -> IndexStore:
    s = IndexStore.open(str(tmp_path / "ix"), [IndexDefinition("by_n", "n")])
    data = {p: [(b"k%d-%05d" % (p, i), json.dumps({"n": i}).encode()) for i in range(per)]
            for p in range(parts)}
    src = _Source(data)
    for p in range(parts):
        s.rebuild(p, src)
    return s


def test_partitions_keep_only_theirs(tmp_path) -> None:
    s = _store(tmp_path, per=50)
    rows = s.range("by_n", 10, 12, partitions=[1, 3])
    assert rows == [(10, b"k1-00010"), (10, b"k3-00010"), (11, b"k1-00011"), (11, b"k3-00011")]
    assert s.range("by_n", 10, 12, limit=3, partitions=[1, 3]) == rows[:3]
    assert s.lookup("by_n", 7, partitions=[2]) == [b"k2-00007"]
    assert s.range("by_n", partitions=[]) == [] and s.lookup("by_n", 7, partitions=[9]) == []
    assert len(s.lookup("by_n", 7)) == 8
    s.close()


def test_limit_ends_the_scan(tmp_path, monkeypatch) -> None:
    from indexes import store as store_mod
    s = _store(tmp_path)                                   # 16,000 entries
    parsed = []
    real = store_mod.keycodec.parse_entry
    monkeypatch.setattr(store_mod.keycodec, "parse_entry",
                        lambda k, d: parsed.append(k) or real(k, d))
    assert s.range("by_n", limit=1) == [(0, b"k0-00000")]
    assert len(parsed) == 1                                # not 16,000 read and dropped
    parsed.clear()
    assert len(s.range("by_n", 5, limit=10, partitions=[6, 7])) == 10
    assert len(parsed) == 10
    s.close()
