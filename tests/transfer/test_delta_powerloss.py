"""A power cut during a delta fetch (transfer.delta), on the file layer that keeps only
what was made durable (faults.powerloss): cut in the base copy, in the range receive,
just before the install, and right after a complete fetch. After each, the demander's
partition file is exactly the old copy or exactly the supplier's at C, never a mix; a
fetch after the cut ends with the supplier's file and leaves no temp file behind.

``keep_unsynced`` > 0 also keeps a seeded subset of the writes that were never synced,
in order, as real file systems may."""
from __future__ import annotations

import os

import pytest

from checkpoint import PartitionStore, pagefile
from faults import fileio
from faults.powerloss import PowerLossLayer
from transfer import Demander, PartitionStoreStorage, SupplierServer, partial_paths

from test_partition_store import _key
from transfer_helpers import SECRET, peer_of

P = 3


class _Cut(Exception):
    """The power goes at this point: nothing after it runs."""


def _fill(store: PartitionStore, n: int, tag: bytes) -> None:
    for i in range(n):
        store.put(P, _key(i), tag + b"-%d-" % i + b"x" * 200)
    store.checkpoint()


def _fetch(a: PartitionStore, b: PartitionStore):
    srv = SupplierServer(PartitionStoreStorage(a), SECRET).start()
    try:
        return Demander(PartitionStoreStorage(b), peer_of(srv), SECRET, chunk_size=64 << 10).fetch(P)
    finally:
        srv.stop()


def _cut_at(monkeypatch, point: str) -> None:
    """The crash point ``point`` raises _Cut (in this process) instead of a SIGKILL."""
    import transfer.delta
    import transfer.demander
    import transfer.receive

    def hit(name: str) -> None:
        if name == point:
            raise _Cut(name)
    for mod in (transfer.delta, transfer.receive, transfer.demander):
        monkeypatch.setattr(mod, "crashpoint", hit)


@pytest.mark.parametrize("keep", [0.0, 0.5])
@pytest.mark.parametrize("point", ["demander.mid_base_copy", "demander.mid_delta_receive",
                                   "demander.before_install", None])
def test_power_cut_in_a_delta_fetch_leaves_old_or_new_never_a_mix(tmp_path, monkeypatch, point, keep) -> None:
    a = PartitionStore.open(str(tmp_path / "a"), wal_sync="none", checkpoint_interval=None)
    b = PartitionStore.open(str(tmp_path / "b"), wal_sync="none", checkpoint_interval=None)
    try:
        _fill(a, 6000, b"v0")
        assert _fetch(a, b).mode == "full"                 # b holds a copy: the base
        b.checkpoint()
        for i in range(0, 6000, 150):                      # 40 keys changed across the file
            a.put(P, _key(i), b"NEW-%d-" % i + b"y" * 200)
        a.checkpoint()
        old = open(b.partition_path(P), "rb").read()
        new = open(a.partition_path(P), "rb").read()
        assert old != new
        layer = PowerLossLayer(keep_unsynced=keep, seed=7)
        with monkeypatch.context() as m:
            if point is not None:
                _cut_at(m, point)
            with fileio.use(layer):
                if point is None:
                    res = _fetch(a, b)
                    assert res.mode == "delta" and res.pages_sent < res.pages // 2, res
                else:
                    with pytest.raises(_Cut):
                        _fetch(a, b)
                b.close(checkpoint=False)                  # a dead process holds no file
        layer.cut()
    finally:
        a_path = a.partition_path(P)
    b2 = PartitionStore.open(str(tmp_path / "b"), wal_sync="none", checkpoint_interval=None)
    try:
        after_cut = open(b2.partition_path(P), "rb").read()
        # exactly one of the two files: the install is a rename made durable, the base
        # copy and the ranges go to the temp file only
        assert after_cut == (new if point is None else old)
        assert pagefile.verify(b2.partition_path(P)) == []
        res = _fetch(a, b2)                                 # the restart's fetch
        assert res.mode in ("delta", "full")
        assert open(b2.partition_path(P), "rb").read() == open(a_path, "rb").read()
        assert dict(b2.scan(P)) == dict(a.scan(P)) and b2.counter(P) == a.counter(P)
        leftovers = [q for q in partial_paths(b2.partition_path(P)) if os.path.exists(q)]
        assert leftovers == []
    finally:
        b2.close()
        a.close()
