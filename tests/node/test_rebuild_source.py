"""The move's index rebuild reads the installed partition file (the bulk decoder of
``PartitionFileSource``), in the node's scan pool or in its own process, and gives the
same index as a rebuild from the store; a file that cannot be read falls back to the
store; a stopping node ends the rebuild without the fallback."""
from __future__ import annotations

import json
import logging
import threading
from types import SimpleNamespace

import pytest

from checkpoint import PartitionStore
from indexes import IndexDefinition, IndexStore, PartitionFileSource, RebuildCancelled, ScanPool
from node.errors import Unavailable
from node.move.rebuild import rebuild_installed


def _node(pool=None) -> SimpleNamespace:
    return SimpleNamespace(scan_pool=pool, stopping=threading.Event())


def _rebuild(node: SimpleNamespace, cache: str, p: int, data: SimpleNamespace) -> None:
    rebuild_installed(cache, p, data, None, pool=node.scan_pool, cancel=node.stopping.is_set)


def _store_with_entries(tmp_path) -> PartitionStore:
    store = PartitionStore.open(str(tmp_path / "data"), wal_sync="none")
    store.create_partition(3)
    for i in range(600):
        city = ["Oslo", "Lima", "Pune"][i % 3]
        store.put(3, f"key-{i}".encode(), json.dumps({"city": city, "pad": "x" * (i % 50)}).encode())
    for i in range(0, 600, 7):
        store.remove(3, f"key-{i}".encode())      # tombstones must not be indexed
    store.checkpoint()
    return store


@pytest.mark.parametrize("pooled", [False, True])
def test_rebuild_from_the_installed_file_equals_a_rebuild_from_the_store(tmp_path, pooled) -> None:
    store = _store_with_entries(tmp_path)
    pool = ScanPool(1, min_bytes=0, when="always") if pooled else None
    defs = [IndexDefinition("by_city", "city")]
    via_file = IndexStore.open(str(tmp_path / "ix-file"), defs)
    via_store = IndexStore.open(str(tmp_path / "ix-store"), defs)
    try:
        _rebuild(_node(pool), "default", 3, SimpleNamespace(store=store, indexes=via_file))
        assert pool is None or pool.started == 1           # the scan ran in the pool
        via_store.rebuild(3, store)
        for city in ("Oslo", "Lima", "Pune"):
            got = sorted(via_file.lookup("by_city", city))
            assert got == sorted(via_store.lookup("by_city", city)) and got
        assert b"key-7" not in via_file.lookup("by_city", "Lima") + via_file.lookup("by_city", "Pune") \
            + via_file.lookup("by_city", "Oslo")
        assert via_file.ready(3)
    finally:
        if pool is not None:
            pool.close()
        via_file.close()
        via_store.close()
        store.close()


def test_an_unreadable_installed_file_falls_back_to_the_store(tmp_path, caplog) -> None:
    sources = []

    class Indexes:
        def rebuild(self, p, source, progress=None, pool=None, cancel=None):
            sources.append(source)
            if isinstance(source, PartitionFileSource):
                list(source.scan_batches(p))       # the file is missing: IndexStoreError

    store = SimpleNamespace(partition_path=lambda p: str(tmp_path / f"part-{p}.bin"))
    with caplog.at_level(logging.WARNING, logger="ferry.node.filemove"):
        _rebuild(_node(), "c", 5, SimpleNamespace(store=store, indexes=Indexes()))
    assert isinstance(sources[0], PartitionFileSource) and sources[1] is store
    assert "rebuilding from the store" in caplog.text


def test_a_stopping_node_ends_the_rebuild_without_falling_back(tmp_path) -> None:
    sources = []

    class Indexes:
        def rebuild(self, p, source, progress=None, pool=None, cancel=None):
            sources.append(source)
            if cancel():
                raise RebuildCancelled("cancelled")

    node = _node()
    node.stopping.set()
    store = SimpleNamespace(partition_path=lambda p: str(tmp_path / f"part-{p}.bin"))
    with pytest.raises(Unavailable, match="index rebuild of c/5 stopped"):
        _rebuild(node, "c", 5, SimpleNamespace(store=store, indexes=Indexes()))
    assert len(sources) == 1                             # no rebuild from the store after it
