"""After an unclean stop a node does not rebuild every index before it serves: start-up
marks them stale. A stale index is never read (lookups and ranges leave its partition
out), is rebuilt before the partition's next change, by ``catch_up_index`` (the node's
background pass and its index reads, under p's lock), or by a move that installs p's
file (``index_rebuilt``); it is never exported to a demander; and one still stale at a
stop is marked not ready, so the next start does not trust it either."""
from __future__ import annotations

import json
import threading

import pytest

from indexes import IndexStore
from node.config import CacheConfig, IndexConfig, NodeConfig
from node.filemove import make_supplier_storage
from node.storage import CacheData

CACHE = CacheConfig("c", 2, 0, (IndexConfig("by_n", "n"),))


def _doc(i: int) -> bytes:
    return json.dumps({"n": i}).encode()


def _open(tmp_path, *, clean: bool) -> CacheData:
    return CacheData(NodeConfig(id="n1", data=str(tmp_path), caches=(CACHE,), wal_sync="none"),
                     CACHE, clean=clean)


def _crash_with_an_index_behind(tmp_path) -> None:
    """Partition 0 holds k0..k9 in data and index; then k10 reaches the data (WAL) but
    not the index, and the process stops without a clean stop (no close)."""
    d = _open(tmp_path, clean=True)
    d.create(0)
    d.create(1)
    for i in range(10):
        d.put(0, b"k%d" % i, _doc(i))
    d.put(1, b"other", _doc(500))
    d.store.put(0, b"k10", _doc(10))            # logged, applied to data ...
    # ... and the index commit never happened: the process dies here. The WAL has k10.
    d.store.close(checkpoint=False)
    d.indexes.close()


def test_an_unclean_start_trusts_no_index_and_rebuilds_none(tmp_path, monkeypatch) -> None:
    _crash_with_an_index_behind(tmp_path)
    rebuilds: list[int] = []
    real = IndexStore.rebuild
    monkeypatch.setattr(IndexStore, "rebuild",
                        lambda self, p, *a, **kw: (rebuilds.append(p), real(self, p, *a, **kw))[1])
    d = _open(tmp_path, clean=False)
    try:
        assert rebuilds == []                                   # none at start-up
        assert d.stale_indexes() == [0, 1]
        assert not d.index_current(0) and not d.index_current(1)
        assert d.get(0, b"k10") == _doc(10)                     # the data has k10
        # the stale index (which lacks k10 and still holds k3) is never read
        assert d.lookup("by_n", 3) == []
        assert d.lookup("by_n", 500) == []
        assert d.range("by_n", None, None, None) == []
        # an index read of the node catches up first (here: by hand, as the node does
        # under p's lock)
        assert d.catch_up_index(0) is True
        assert rebuilds == [0]
        assert d.lookup("by_n", 10) == [b"k10"]                 # the missed change is there
        assert d.lookup("by_n", 3) == [b"k3"]
        assert d.catch_up_index(0) is False                     # current: nothing to do
        assert d.stale_indexes() == [1]
        # a change of a stale partition rebuilds it first
        d.put(1, b"more", _doc(501))
        assert rebuilds == [0, 1]
        assert d.lookup("by_n", 500) == [b"other"] and d.lookup("by_n", 501) == [b"more"]
        assert d.stale_indexes() == []
        assert len(d.range("by_n", None, None, None)) == 13
    finally:
        d.close()


def test_a_stale_index_left_at_a_stop_is_not_trusted_at_the_next_start(tmp_path) -> None:
    _crash_with_an_index_behind(tmp_path)
    d = _open(tmp_path, clean=False)
    d.catch_up_index(1)
    d.close()                          # partition 0 still stale: its marker is removed
    d = _open(tmp_path, clean=True)    # even a start after a clean stop rebuilds it
    try:
        assert d.stale_indexes() == [0]
        assert d.indexes.ready(1) and not d.indexes.ready(0)
        d.catch_up_index(0)
        assert d.lookup("by_n", 10) == [b"k10"]
    finally:
        d.close()
    d = _open(tmp_path, clean=True)
    try:
        assert d.stale_indexes() == []
        assert d.lookup("by_n", 10) == [b"k10"]
    finally:
        d.close()


def test_a_move_rebuild_drop_or_create_ends_the_staleness(tmp_path) -> None:
    _crash_with_an_index_behind(tmp_path)
    d = _open(tmp_path, clean=False)
    try:
        d.indexes.rebuild(0, d.store)   # a move's index stage, then it says so
        d.index_rebuilt(0)
        assert d.index_current(0) and d.lookup("by_n", 10) == [b"k10"]
        d.drop(1)
        assert d.stale_indexes() == []
        d.create(1)
        assert d.index_current(1)
    finally:
        d.close()


def test_a_cache_without_indexes_has_nothing_stale(tmp_path) -> None:
    plain = CacheConfig("c", 2, 0, ())
    cfg = NodeConfig(id="n1", data=str(tmp_path), caches=(plain,), wal_sync="none")
    d = CacheData(cfg, plain)
    d.create(0)
    d.put(0, b"k", b"v")
    d.store.close(checkpoint=False)
    d.indexes.close()
    d = CacheData(cfg, plain, clean=False)
    try:
        assert d.stale_indexes() == [] and d.index_current(0)
        assert d.get(0, b"k") == b"v"
    finally:
        d.close()


class _Shipper:
    """Wants every index; records which partitions it was asked to capture."""

    def __init__(self) -> None:
        self.captured: list[int] = []

    def wanted(self, cache: str, p: int) -> bool:
        return True

    def capture(self, cache, p, indexes, counter, docs):
        self.captured.append(p)
        raise RuntimeError("captured")


class _Use:
    def opened(self, key) -> None: ...

    def closed(self, key) -> None: ...


@pytest.mark.parametrize("stale", [True, False])
def test_a_stale_index_is_not_exported(tmp_path, stale) -> None:
    _crash_with_an_index_behind(tmp_path)
    d = _open(tmp_path, clean=False)
    try:
        if not stale:
            d.catch_up_index(0)
        lock = threading.RLock()
        shipper = _Shipper()
        storage = make_supplier_storage({"c": d}, _Use(), lambda c, p: None,  # type: ignore[arg-type]
                                        plock=lambda c, p: lock, shipper=shipper)  # type: ignore[arg-type]
        d.store.checkpoint()
        if stale:
            storage.open_snapshot("c", 0).close()
            assert shipper.captured == []
        else:
            with pytest.raises(RuntimeError, match="captured"):
                storage.open_snapshot("c", 0)
            assert shipper.captured == [0]
    finally:
        d.close()
