"""The move's index rebuild of a freshly installed file skips the page CRCs (the install
scan checked every page) and gives the same index as a full check; once a checkpoint
has written the file, the rebuild checks the CRCs again."""
from __future__ import annotations

import json
import shutil
import threading
from types import SimpleNamespace

import pytest

from checkpoint import PartitionStore
from indexes import IndexDefinition, IndexStore, PartitionFileSource, ScanPool
from node.move.rebuild import rebuild_installed


def _received(tmp_path) -> str:
    """A partition file as a transfer would have written it: a checkpointed copy."""
    src = PartitionStore.open(str(tmp_path / "src"), wal_sync="none", checkpoint_interval=None)
    src.create_partition(3)
    for i in range(800):
        src.put(3, f"key-{i}".encode(), json.dumps({"city": ["Oslo", "Lima"][i % 2],
                                                    "pad": "x" * (i % 90)}).encode())
    for i in range(0, 800, 9):
        src.remove(3, f"key-{i}".encode())
    src.checkpoint()
    out = str(tmp_path / "received.bin")
    shutil.copyfile(src.partition_path(3), out)
    src.close()
    return out


@pytest.mark.parametrize("pooled", [False, True])
def test_installed_file_is_indexed_without_a_second_crc_pass(tmp_path, pooled) -> None:
    store = PartitionStore.open(str(tmp_path / "data"), wal_sync="none", checkpoint_interval=None)
    store.install_partition(3, _received(tmp_path))
    defs = [IndexDefinition("by_city", "city")]
    ix = IndexStore.open(str(tmp_path / "ix"), defs)
    want = IndexStore.open(str(tmp_path / "ix-want"), defs)
    pool = ScanPool(1, min_bytes=0, when="always") if pooled else None
    seen: list[bool] = []
    real = ix.rebuild

    def spy(p, source, **kw):
        seen.append(isinstance(source, PartitionFileSource) and source.verified)
        return real(p, source, **kw)
    ix.rebuild = spy  # type: ignore[method-assign]
    try:
        data = SimpleNamespace(store=store, indexes=ix)
        rebuild_installed("default", 3, data, None, pool=pool, cancel=threading.Event().is_set)
        assert seen == [True]
        want.rebuild(3, PartitionFileSource(store.partition_path(3)))     # CRCs checked
        for city in ("Oslo", "Lima"):
            got = ix.lookup("by_city", city)
            assert got == want.lookup("by_city", city) and got
        assert b"key-9" not in ix.lookup("by_city", "Lima")
        # a checkpoint wrote the file: the next rebuild checks the CRCs itself
        store.put(3, b"key-new", b'{"city": "Pune"}')
        store.checkpoint()
        rebuild_installed("default", 3, data, None, pool=pool, cancel=threading.Event().is_set)
        assert seen == [True, False]
        assert ix.lookup("by_city", "Pune") == [b"key-new"]
    finally:
        if pool is not None:
            pool.close()
        ix.close()
        want.close()
        store.close()
