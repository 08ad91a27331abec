"""The shipped index (``[rebalance] index_transfer``) over a real transfer, real
partition files and real LMDB: the supplier exports p's entries under p's lock with
its file snapshot while it keeps writing; the demander checks them against the
installed file and loads them. The result equals a rebuild from the installed file,
also after the replay of later updates; a forged, stale or truncated index is refused
(the partition left not ready) and the move's index stage rebuilds instead."""
from __future__ import annotations

import json
import os
import random
import sys
import threading
from collections import defaultdict
from dataclasses import replace
from typing import Any

import msgpack
import pytest

from checkpoint import PartitionStore
from indexes import (IndexDefinition, IndexStore, PartitionFileSource, ShippedIndexRefused,
                     load_shipped)
from indexes.shipped import ShipHeader, digest, export
from indexes.verify import stored
from node.filemove import make_supplier_storage
from node.errors import Unavailable
from node.indexship import IndexShipper
from node.move.rebuild import index_installed
from node.move.ship import index_shipped, live_docs
from transfer import Demander, Limits, SupplierServer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "transfer"))
from transfer_helpers import SECRET, peer_of  # noqa: E402

DEFS = [IndexDefinition("city", "city"), IndexDefinition("n", "n", type="int"),
        IndexDefinition("tag", "tag")]
P = 3


def _doc(i: int, tag: str, pad: int) -> bytes:
    d: dict[str, Any] = {"city": f"{tag}-{i % 17}", "n": i, "pad": "x" * pad}
    if i % 5 == 0:
        d["tag"] = ("long-" * 60) + str(i)     # a long value: hashed key, entry with data
    return json.dumps(d).encode()


class Data:
    """One cache's partitions as the engine sees them (PartitionData), with the node's
    rule: a write changes the store and the index under p's lock."""

    def __init__(self, root: str) -> None:
        self.store = PartitionStore.open(os.path.join(root, "data"), wal_sync="none",
                                         checkpoint_interval=None)
        self.indexes = IndexStore.open(os.path.join(root, "ix"), DEFS)
        self.locks: dict[tuple[str, int], threading.RLock] = defaultdict(threading.RLock)

    def plock(self, cache: str, p: int) -> threading.RLock:
        return self.locks[(cache, p)]

    def index_current(self, p: int) -> bool:
        return True                    # every change here updates the index at once

    def counter(self, p: int) -> int:
        return int(self.store.counter(p))

    def put(self, p: int, key: bytes, value: bytes | None) -> None:
        with self.plock("default", p):
            old = self.store.get(p, key)
            if value is None:
                self.store.remove(p, key)
            else:
                self.store.put(p, key, value)
            self.indexes.apply(p, key, old, value)

    def close(self) -> None:
        self.indexes.close()
        self.store.close()


class Supply:
    """The IndexSupply port straight to a supplier's IndexShipper (no RPC), with a hook
    to tamper with what travels."""

    def __init__(self, shipper: IndexShipper, tamper: Any = None) -> None:
        self.shipper, self.tamper = shipper, tamper

    def want(self, supplier: str, cache: str, p: int, below: int = 0) -> bool:
        return self.shipper.op_index_want(cache, p, "n2", below)

    def page(self, supplier: str, cache: str, p: int, counter: int, page: int
             ) -> tuple[dict[str, object], bytes]:
        shot = self.shipper.shots.get((cache, p))
        if shot is not None:    # serve whatever the export says it is (a forger's counter too)
            counter = shot.header.counter
        r = self.shipper.op_index_page(cache, p, counter, page)
        return dict(r.header), r.data


def _entries(ix: IndexStore, p: int) -> list[tuple[bytes, bytes]]:
    return list(stored(ix, p))


def _setup(tmp_path, pad: int, n: int):
    a = Data(str(tmp_path / "a"))
    b = Data(str(tmp_path / "b"))
    a.store.create_partition(P)
    a.indexes.rebuild(P, a.store)
    for i in range(n):
        a.put(P, b"key-%06d" % i, _doc(i, "old", pad))
    a.store.checkpoint()
    shipper = IndexShipper("n1")
    storage = make_supplier_storage({"default": a}, _Use(), lambda c, p: None,   # type: ignore[dict-item]
                                    plock=a.plock, shipper=shipper)
    return a, b, shipper, storage


class _Use:
    def opened(self, key: Any) -> None:
        pass

    def closed(self, key: Any) -> None:
        pass


def _fetch(a: Data, b: Data, storage: Any, shipper: IndexShipper, pad: int, n: int,
           writes: bool = True):
    """Fetch p from a to b while a keeps writing; returns (FetchResult, later updates)."""
    srv = SupplierServer(storage, SECRET, limits=Limits(2, rate=4e6)).start()
    wrote: list[int] = []
    later: list[tuple[bytes, bytes | None]] = []

    def writer(ev: Any) -> None:
        if writes and ev.stage in ("accept", "receive") and len(wrote) < 4:
            k = len(wrote)
            for i in range(k * n // 8, (k + 1) * n // 8):
                a.put(P, b"key-%06d" % i, _doc(i, "new", pad))
            a.put(P, b"key-%06d" % (n - 1 - k), None)
            a.store.checkpoint()
            wrote.append(1)
    shipper.op_index_want("default", P, "n2")
    from transfer import PartitionStoreStorage
    try:
        res = Demander(PartitionStoreStorage(b.store), peer_of(srv), SECRET,
                       chunk_size=64 << 10).fetch(P, progress=writer)
    finally:
        srv.stop()
    # what a temp WAL would hold: updates after C, replayed after the index stage
    for i in range(0, n, 7):
        later.append((b"key-%06d" % i, _doc(i, "replayed", pad)))
    later.append((b"key-%06d" % 1, None))
    later.append((b"fresh", _doc(99, "fresh", pad)))
    return res, later, wrote


@pytest.mark.parametrize("pad,n", [(40, 4000), (900, 1200), (5000, 200)])
def test_shipped_index_equals_a_rebuild_also_after_replay(tmp_path, pad: int, n: int) -> None:
    a, b, shipper, storage = _setup(tmp_path, pad, n)
    ref = IndexStore.open(str(tmp_path / "ref"), DEFS)
    try:
        res, later, wrote = _fetch(a, b, storage, shipper, pad, n)
        assert wrote, "nothing was written during the send"
        got = index_shipped("default", P, b, Supply(shipper), "n1", res.counter, None,
                            lambda: False)
        assert b.indexes.ready(P)
        ref.rebuild(P, PartitionFileSource(b.store.partition_path(P)))
        assert _entries(b.indexes, P) == _entries(ref, P)
        assert got.entries == len(_entries(ref, P)) > 0
        assert any(d for _, d in _entries(ref, P)), "no long entry (entry with data) tested"
        # the replay: each later update applied to data and index, as the engine does
        for key, value in later:
            b.put(P, key, value)
        ref.rebuild(P, b.store)
        assert _entries(b.indexes, P) == _entries(ref, P)
    finally:
        ref.close()
        a.close()
        b.close()


def _shot(tmp_path, pad: int = 40, n: int = 3000):
    a, b, shipper, storage = _setup(tmp_path, pad, n)
    res, _, _ = _fetch(a, b, storage, shipper, pad, n, writes=False)
    shot = shipper.shots[("default", P)]
    return a, b, shipper, res, shot


def _refused(b: Data, shipper: IndexShipper, res: Any, match: str | None = None, **kw: Any) -> None:
    """The index stage refuses the supplier's export: p's index is left not ready."""
    with pytest.raises(ShippedIndexRefused, match=match):
        index_shipped("default", P, b, Supply(shipper), "n1", res.counter, None, lambda: False, **kw)
    assert not b.indexes.ready(P)


def _pages(shot) -> list[tuple[list[bytes], list[list[bytes]]]]:
    return [tuple(msgpack.unpackb(pg, raw=False)) for pg in shot.pages]


def _reship(shot, pages) -> None:
    """Replace the export by ``pages`` with a consistent header (a forger's work)."""
    blobs = [msgpack.packb([list(pl), [list(x) for x in lg]], use_bin_type=True) for pl, lg in pages]
    count = sum(len(pl) + len(lg) for pl, lg in pages)
    shot.pages = blobs
    shot.header = replace(shot.header, pages=len(blobs), count=count, digest=digest(blobs))


def _drop_half(shot) -> None:
    _reship(shot, [(pl[::2], lg) for pl, lg in _pages(shot)])


def _alter_values(shot) -> None:
    # every "city" entry of key-000001 .. points to another value (sorted again)
    pages = _pages(shot)
    flat = sorted(k.replace(b"old-", b"olc-") for pl, _ in pages for k in pl)
    _reship(shot, [(flat, [lg for _, lgs in pages for lg in lgs])])


def _extra_entries(shot) -> None:
    # every real entry kept, and as many for keys the file does not hold
    pages = _pages(shot)
    flat = sorted({k for pl, _ in pages for k in pl} | {k + b"-ghost" for pl, _ in pages for k in pl})
    _reship(shot, [(flat, [lg for _, lgs in pages for lg in lgs])])


def _flip_byte(shot) -> None:
    pg = bytearray(shot.pages[0])
    pg[len(pg) // 2] ^= 0x01
    shot.pages[0] = bytes(pg)


def _truncate(shot) -> None:
    shot.pages = shot.pages[:-1]
    shot.header = replace(shot.header, pages=len(shot.pages))


def _other_counter(shot) -> None:
    shot.header = replace(shot.header, counter=shot.header.counter - 1)


def _other_fingerprint(shot) -> None:
    shot.header = replace(shot.header, fingerprint="0" * 16)


def _other_docs(shot) -> None:
    shot.header = replace(shot.header, docs=shot.header.docs + 1)


def _unsorted(shot) -> None:
    pages = _pages(shot)
    pl, lg = pages[0]
    pages[0] = (pl[1:2] + pl[:1] + pl[2:], lg)
    _reship(shot, pages)


TAMPER = {"dropped half (count and digest made to agree)": _drop_half,
          "values altered": _alter_values, "entries for absent keys": _extra_entries, "a flipped byte": _flip_byte,
          "truncated": _truncate, "another counter": _other_counter,
          "other definitions": _other_fingerprint, "another document count": _other_docs,
          "keys out of order": _unsorted}


@pytest.mark.parametrize("how", sorted(TAMPER))
def test_a_forged_or_truncated_index_is_refused_and_rebuilt(tmp_path, how: str) -> None:
    a, b, shipper, res, shot = _shot(tmp_path)
    ref = IndexStore.open(str(tmp_path / "ref"), DEFS)
    try:
        TAMPER[how](shot)
        _refused(b, shipper, res, rng=random.Random(7))
        # the move's index stage: refused, logged, rebuilt from the file
        shipper.shots[("default", P)] = shot
        src = index_installed("default", P, b, None, None, pool=None, cancel=lambda: False,
                              shipped=lambda: index_shipped("default", P, b, Supply(shipper), "n1",
                                                            res.counter, None, lambda: False,
                                                            rng=random.Random(7)))
        assert src == "rebuilt"
        assert b.indexes.ready(P)
        ref.rebuild(P, PartitionFileSource(b.store.partition_path(P)))
        assert _entries(b.indexes, P) == _entries(ref, P)
    finally:
        ref.close()
        a.close()
        b.close()


def test_a_stale_index_is_refused(tmp_path) -> None:
    """The supplier's entries at an earlier counter, relabelled as the file's: the
    documents changed since give other entries, which the samples find."""
    a, b, shipper, storage = _setup(tmp_path, 40, 3000)
    try:
        with a.plock("default", P):
            stale = export(a.indexes, P, a.counter(P), live_docs(a.store, P) or 0)
        for i in range(3000):              # every document changes (same count)
            a.put(P, b"key-%06d" % i, _doc(i, "later", 40))
        a.store.checkpoint()
        res, _, _ = _fetch(a, b, storage, shipper, 40, 3000, writes=False)
        fresh = shipper.shots[("default", P)]
        stale.header = replace(stale.header, counter=fresh.header.counter)
        shipper.shots[("default", P)] = stale
        _refused(b, shipper, res)
    finally:
        a.close()
        b.close()


def test_no_export_falls_back_to_rebuild(tmp_path) -> None:
    """The supplier holds no export (restarted, or the want came too late): the
    index stage rebuilds."""
    a, b, shipper, res, shot = _shot(tmp_path)
    try:
        shipper.shots.clear()
        src = index_installed("default", P, b, None, None, pool=None, cancel=lambda: False,
                              shipped=lambda: index_shipped("default", P, b, Supply(shipper), "n1",
                                                            res.counter, None, lambda: False))
        assert src == "rebuilt" and b.indexes.ready(P)
    finally:
        a.close()
        b.close()


def test_load_refuses_a_header_of_another_partition(tmp_path) -> None:
    ix = IndexStore.open(str(tmp_path / "ix"), DEFS)
    try:
        h = ShipHeader(4, 1, ix.schema.fingerprint, 0, 0, 0, 0, digest([]))
        with pytest.raises(ShippedIndexRefused):
            load_shipped(ix, 5, h, [])
        load_shipped(ix, 4, h, [])
        assert ix.ready(4)
    finally:
        ix.close()


@pytest.mark.slow
def test_join_under_a_writer_ships_indexes_with_real_nodes(tmp_path, nodes) -> None:
    """Real node processes with index_transfer = "ship": n3 joins under a writer; its
    file moves load the suppliers' shipped indexes (no rebuild), and at the end every
    acknowledged write is on every owner and every index verifies against its data."""
    import nodeharness
    from nodeharness import NodeProc, status, wait_settled
    from test_cluster import Writer, writes_during
    from test_filemove import FILES, finish_and_check, moved_by_files
    from node.wire import Pool, load_secret

    config = FILES.replace('mode = "files"\n', 'mode = "files"\nindex_transfer = "ship"\n')
    assert 'index_transfer = "ship"' in config
    secret, cfg, n1, n2 = nodeharness.start_pair(tmp_path, nodes, config)
    w = Writer([n1.address], secret)
    w.start()
    try:
        writes_during(w, 150)
        n3 = NodeProc(str(tmp_path), "n3", secret, config=cfg)
        nodes.append(n3)
        n3.start()
        wait_settled(n1.address, secret, 3, 1)
        writes_during(w, 30)
        doc = status(n1.address, secret)
    finally:
        w.finish()
    assert moved_by_files(n3) >= 2
    done = Pool(load_secret(secret), role="client").call(n3.address, "moves_done")
    assert done and all(d["mode"] == "files" for d in done), done
    sources = [d.get("index_source") for d in done]
    assert sources.count("shipped") >= 2, sources
    log3 = open(n3.log, errors="replace").read()
    assert "rebuilding from the file" not in log3, log3[-3000:]
    supplied = open(n1.log, errors="replace").read() + open(n2.log, errors="replace").read()
    assert "index export at counter" in supplied
    assert not doc["moves"] and not doc["lost"]
    finish_and_check(w, nodes, secret)


def test_auto_wants_are_taken_only_below_the_size_per_entry(tmp_path) -> None:
    """index_transfer = auto: the supplier takes the want only when its file of p holds
    fewer bytes per live entry than ``below`` (so big values cost no export)."""
    a, b, shipper, storage = _setup(tmp_path, 900, 600)
    try:
        path = a.store.partition_path(P)
        shipper.sizer = lambda cache, p: (os.path.getsize(path), live_docs(a.store, p))
        per = os.path.getsize(path) / (live_docs(a.store, P) or 1)
        assert not shipper.op_index_want("default", P, "n2", below=int(per))
        assert not shipper.wanted("default", P)
        assert shipper.op_index_want("default", P, "n2", below=int(per) + 1)
        assert shipper.wanted("default", P)
        assert shipper.op_index_want("default", P, "n2")          # 0: always
    finally:
        a.close()
        b.close()


def test_an_export_past_the_memory_bound_is_not_received(tmp_path, monkeypatch) -> None:
    import node.move.ship as ship
    a, b, shipper, res, shot = _shot(tmp_path)
    try:
        assert shot.header.pages > 1
        monkeypatch.setattr(ship, "MAX_RECEIVE_BYTES", len(shot.pages[0]))
        _refused(b, shipper, res, match="not held in memory")
    finally:
        a.close()
        b.close()


def test_exports_held_by_a_supplier_stay_within_its_memory_bound(tmp_path) -> None:
    """A supplier keeps unread exports until read or KEEP_S: their bytes are bounded.
    One export bigger than the bound is not kept; a new one that would pass it drops
    the oldest; a demander that then finds no export rebuilds (test above)."""
    from node.indexship import shot_bytes
    a, b, shipper, res, shot = _shot(tmp_path)
    try:
        size = shot_bytes(shot)
        assert size > 0

        def read():
            return shipper.capture("default", P, a.indexes, res.counter, live_docs(a.store, P))
        small = IndexShipper("n1", max_bytes=size - 1)
        small.publish("default", P, read())
        assert not small.shots and small.dropped == 1
        with pytest.raises(Unavailable, match="no index export"):
            small.op_index_page("default", P, res.counter, 0)
        one = IndexShipper("n1", max_bytes=2 * size - 1)       # room for one
        one.publish("default", P, read())
        one.publish("other", P, read())
        assert list(one.shots) == [("other", P)] and one.dropped == 1
        two = IndexShipper("n1", max_bytes=2 * size)
        for cache in ("default", "other", "default"):          # the third replaces the first
            two.publish(cache, P, read())
        assert sorted(two.shots) == [("default", P), ("other", P)] and two.dropped == 0
    finally:
        a.close()
        b.close()
