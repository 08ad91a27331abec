"""The streaming install over a real transfer: the supplier keeps writing (pages
overwritten after C arrive as pre-images), the demander's StreamFeed builds p's index
while the file arrives; the loaded index equals a rebuild from the installed file."""
from __future__ import annotations

import json
import os
import sys

import pytest

from checkpoint import PartitionStore
from indexes import IndexDefinition, IndexStore, PartitionFileSource
from indexes.verify import stored
from node.move.stream import StreamFeed
from transfer import Demander, Limits, PartitionStoreStorage, SupplierServer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "transfer"))
from transfer_helpers import SECRET, peer_of  # noqa: E402

DEFS = [IndexDefinition("city", "city"), IndexDefinition("n", "n", type="int")]


def _doc(i: int, tag: str, pad: int) -> bytes:
    return json.dumps({"city": f"{tag}-{i % 17}", "n": i, "pad": "x" * pad}).encode()


def _entries(ix: IndexStore, p: int) -> list[tuple[bytes, bytes]]:
    return list(stored(ix, p))


@pytest.mark.parametrize("pad", [60, 5000])       # inline values; overflow chains
def test_streamed_index_under_live_writes_equals_rebuild(tmp_path, pad: int) -> None:
    a = PartitionStore.open(str(tmp_path / "a"), wal_sync="none", checkpoint_interval=None)
    b = PartitionStore.open(str(tmp_path / "b"), wal_sync="none", checkpoint_interval=None)
    n = 3000 if pad < 1000 else 300
    for i in range(n):
        a.put(3, b"key-%06d" % i, _doc(i, "old", pad))
    srv = SupplierServer(PartitionStoreStorage(a), SECRET, limits=Limits(2, rate=4e6)).start()
    wrote: list[int] = []

    def writer(ev) -> None:
        # overwrite (same size) and add keys while the file is sent: pre-images follow
        if ev.stage in ("accept", "receive") and len(wrote) < 6:
            k = len(wrote)
            for i in range(k * n // 6, (k + 1) * n // 6):
                a.put(3, b"key-%06d" % i, _doc(i, "new", pad))
            for i in range(20):
                a.put(3, b"added-%d-%d" % (k, i), _doc(i, "add", pad))
            a.remove(3, b"key-%06d" % (n - 1 - k))
            a.checkpoint()
            wrote.append(1)
    ix = IndexStore.open(str(tmp_path / "ix"), DEFS)
    ref = IndexStore.open(str(tmp_path / "ref"), DEFS)
    feed = StreamFeed(ix, "default", 3)
    try:
        res = Demander(PartitionStoreStorage(b), peer_of(srv), SECRET, chunk_size=64 << 10,
                       observer=feed).fetch(3, progress=writer)
        path = b.partition_path(3)
        built = feed.result(path)
        got = ix.load_streamed(3, built)
        want = ref.rebuild(3, PartitionFileSource(os.path.dirname(path)))
    finally:
        feed.close()
        srv.stop()
    assert len(wrote) >= 2 and res.preimages > 0, "no page changed during the send"
    assert built.decodes > 0, "nothing was decoded while the file arrived"
    assert _entries(ix, 3) == _entries(ref, 3)
    assert (got.entries, got.scanned, got.bad) == (want.entries, want.scanned, want.bad)
    assert got.entries == n * len(DEFS)
    assert ix.ready(3)
    ix.close()
    ref.close()
    a.close()
    b.close()
