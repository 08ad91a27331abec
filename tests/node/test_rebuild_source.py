"""The move's index rebuild reads the installed partition file (the bulk decoder of
``PartitionFileSource``) and gives the same index as a rebuild from the store; a file
that cannot be read falls back to the store."""
from __future__ import annotations

import json
import logging
from types import SimpleNamespace

from checkpoint import PartitionStore
from indexes import IndexDefinition, IndexStore, PartitionFileSource
from node.filemove import FileMoves


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


def test_rebuild_from_the_installed_file_equals_a_rebuild_from_the_store(tmp_path) -> None:
    store = _store_with_entries(tmp_path)
    defs = [IndexDefinition("by_city", "city")]
    via_file = IndexStore.open(str(tmp_path / "ix-file"), defs)
    via_store = IndexStore.open(str(tmp_path / "ix-store"), defs)
    try:
        mv = SimpleNamespace(cache="default", p=3)
        FileMoves._rebuild_installed(SimpleNamespace(), mv, SimpleNamespace(store=store, indexes=via_file),
                                     None)
        via_store.rebuild(3, store)
        for city in ("Oslo", "Lima", "Pune"):
            got = sorted(via_file.lookup("by_city", city))
            assert got == sorted(via_store.lookup("by_city", city)) and got
        assert b"key-7" not in via_file.lookup("by_city", "Lima") + via_file.lookup("by_city", "Pune") \
            + via_file.lookup("by_city", "Oslo")
        assert via_file.ready(3)
    finally:
        via_file.close()
        via_store.close()
        store.close()


def test_an_unreadable_installed_file_falls_back_to_the_store(tmp_path, caplog) -> None:
    sources = []

    class Indexes:
        def rebuild(self, p, source, progress=None):
            sources.append(source)
            if isinstance(source, PartitionFileSource):
                list(source.scan_batches(p))       # the file is missing: IndexStoreError

    store = SimpleNamespace(partition_path=lambda p: str(tmp_path / f"part-{p}.bin"))
    with caplog.at_level(logging.WARNING, logger="ferry.node.filemove"):
        FileMoves._rebuild_installed(SimpleNamespace(), SimpleNamespace(cache="c", p=5),
                                     SimpleNamespace(store=store, indexes=Indexes()), None)
    assert isinstance(sources[0], PartitionFileSource) and sources[1] is store
    assert "rebuilding from the store" in caplog.text
