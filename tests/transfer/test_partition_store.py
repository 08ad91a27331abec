"""The transfer layer over checkpoint's PartitionStore: a partition moved while the
supplier keeps writing and checkpointing arrives exactly as it was at counter C."""
from __future__ import annotations

import os

import pytest

try:
    from checkpoint import PartitionStore
    from checkpoint import pagefile
except ImportError:          # pragma: no cover - only while checkpoint/ is absent
    PartitionStore = None

from transfer import Demander, Limits, PartitionStoreStorage, RemoteError, SupplierServer
from transfer.frames import ErrorCode
from transfer_helpers import SECRET, peer_of

pytestmark = pytest.mark.skipif(PartitionStore is None, reason="checkpoint.PartitionStore not available")


def _key(i: int) -> bytes:
    return b"key-%06d" % i


@pytest.fixture
def stores(tmp_path):
    a = PartitionStore.open(str(tmp_path / "a"), wal_sync="none", checkpoint_interval=None)
    b = PartitionStore.open(str(tmp_path / "b"), wal_sync="none", checkpoint_interval=None)
    yield a, b
    a.close()
    b.close()


def _entries(store, p: int) -> dict[bytes, bytes]:
    return dict(store.scan(p))


def test_move_under_live_writes_is_exact_at_c(stores) -> None:
    a, b = stores
    at_c: dict[bytes, bytes] = {}
    for i in range(3000):
        a.put(3, _key(i), b"v0-%d-" % i + b"x" * 80)
    at_c = _entries(a, 3)
    # Rate-limited so the writer below overwrites pages before and after they are sent.
    srv = SupplierServer(PartitionStoreStorage(a), SECRET, limits=Limits(2, rate=2e6)).start()
    wrote = []

    def writer(ev) -> None:
        if ev.stage in ("accept", "receive") and len(wrote) < 6:
            for i in range(len(wrote) * 500, len(wrote) * 500 + 500):
                a.put(3, _key(i), b"NEW-%d-" % i + b"y" * 80)    # same size: overwrite in place
            a.put(3, b"appended-%d" % len(wrote), b"z" * 500)
            a.checkpoint()                                        # pages hit the live file now
            wrote.append(1)
    try:
        d = Demander(PartitionStoreStorage(b), peer_of(srv), SECRET, chunk_size=64 << 10)
        res = d.fetch(3, progress=writer)
    finally:
        srv.stop()
    assert len(wrote) >= 2, "the writer never ran during the transfer"
    assert res.preimages > 0, "no page was overwritten during the send; the test proves nothing"
    assert res.counter == 3000
    assert _entries(b, 3) == at_c                 # exactly the partition at C
    assert _entries(a, 3) != at_c                 # while the source moved on
    assert b.counter(3) == 3000
    path = b.partition_path(3)
    assert pagefile.verify(path) == []


def test_not_held_and_busy(stores) -> None:
    a, b = stores
    a.put(1, b"k", b"v")
    srv = SupplierServer(PartitionStoreStorage(a), SECRET).start()
    try:
        d = Demander(PartitionStoreStorage(b), peer_of(srv), SECRET)
        with pytest.raises(RemoteError) as ei:
            d.fetch(2)
        assert ei.value.code == ErrorCode.NOT_HELD
        snap = a.open_transfer_snapshot(1)
        try:
            with pytest.raises(RemoteError) as ei:
                d.fetch(1)
            assert ei.value.code == ErrorCode.BUSY
        finally:
            snap.close()
        d.fetch(1)
        assert b.get(1, b"k") == b"v"
    finally:
        srv.stop()


def test_bad_page_at_source_is_never_installed(stores) -> None:
    a, b = stores
    for i in range(200):
        a.put(4, _key(i), b"v" * 100)
    a.checkpoint()
    path = a.partition_path(4)
    with open(path, "r+b") as f:          # rot one byte of page 2 at the source
        f.seek(2 * 4096 + 100)
        byte = f.read(1)
        f.seek(2 * 4096 + 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    from transfer import PageCheckError
    srv = SupplierServer(PartitionStoreStorage(a), SECRET).start()
    try:
        with pytest.raises(PageCheckError, match="page 2 .* bad at the source") as ei:
            Demander(PartitionStoreStorage(b), peer_of(srv), SECRET).fetch(4)
        assert ei.value.stage == "verify"
    finally:
        srv.stop()
    assert not os.path.exists(b.partition_path(4))
    assert [f for f in os.listdir(os.path.dirname(b.partition_path(4))) if "part-4" in f] == []


SUPPLIER_SCRIPT = r"""
import sys, threading, time
from checkpoint import PartitionStore
from transfer import Limits, PartitionStoreStorage, SupplierServer
store = PartitionStore.open(sys.argv[1], wal_sync="none", checkpoint_interval=None)
if not store.partitions():
    for i in range(3000):
        store.put(5, b"key-%06d" % i, b"v" * 90)
    store.checkpoint()
class Storage(PartitionStoreStorage):
    def open_snapshot(self, cache, partition):
        snap = super().open_snapshot(cache, partition)
        for i in range(0, 3000, 7):       # pages overwritten before they are sent: pre-images
            store.put(5, b"key-%06d" % i, b"u" * 90)
        store.checkpoint()
        return snap
srv = SupplierServer(Storage(store), sys.argv[2].encode(), limits=Limits(2, rate=float(sys.argv[3]))).start()
print("port", srv.address[1], flush=True)
def writer():        # the cluster keeps writing while the partition is sent
    n = 0
    while True:
        for i in range(n % 3000, n % 3000 + 200):
            store.put(5, b"key-%06d" % i, b"w" * 90)
        n += 200
        store.checkpoint()
        time.sleep(0.02)
threading.Thread(target=writer, daemon=True).start()
time.sleep(600)
"""


@pytest.mark.parametrize("crash", ["supplier.mid_preimages:1", "supplier.mid_send:3"])
def test_supplier_killed_while_store_is_written_then_refetched(tmp_path, py_env, stores, crash) -> None:
    import signal
    import subprocess
    import sys
    _, b = stores

    def start(env_crash: str | None) -> tuple[subprocess.Popen, str]:
        env = dict(py_env)
        if env_crash:
            env["FERRY_CRASH"] = env_crash
        p = subprocess.Popen([sys.executable, "-c", SUPPLIER_SCRIPT, str(tmp_path / "sup"), SECRET.decode(), "1e6"],
                             env=env, stdout=subprocess.PIPE, text=True)
        line = p.stdout.readline().split()
        assert line and line[0] == "port", line
        return p, f"127.0.0.1:{line[1]}"
    from transfer import PeerClosed
    p, peer = start(crash)
    try:
        with pytest.raises(PeerClosed):
            Demander(PartitionStoreStorage(b), peer, SECRET, chunk_size=64 << 10).fetch(5)
        assert p.wait(20) == -signal.SIGKILL
    finally:
        p.kill()
    assert 5 not in b.partitions()
    p, peer = start(None)
    try:
        res = Demander(PartitionStoreStorage(b), peer, SECRET, chunk_size=64 << 10).fetch(5)
    finally:
        p.kill()
        p.wait()
    assert res.verified and b.counter(5) == res.counter >= 3000
    assert pagefile.verify(b.partition_path(5)) == []
    assert len(dict(b.scan(5))) == 3000


def test_received_file_is_read_and_checked_once(stores, monkeypatch) -> None:
    """The store's install scan is the page check: one pass over the received file
    (checkpoint.partition's key scan), no page-by-page check_page in the demander."""
    import checkpoint.partition as partition_mod
    a, b = stores
    for i in range(2000):
        a.put(6, _key(i), b"v-%d-" % i + b"x" * 300)
    a.put(6, b"big", b"B" * 50_000)                      # an overflow chain too
    a.checkpoint()
    want = _entries(a, 6)
    scans: list[str] = []
    # the install's scan: iter_page_keys, or the hashed scan (keyscan.scan_key_hashes)
    for mod, name in ((partition_mod, "iter_page_keys"), (partition_mod, "scan_key_hashes")):
        def counting(path, *args, _real=getattr(mod, name), **kw):  # noqa: B008 - binds the real function at definition
            scans.append(os.path.basename(path))
            return _real(path, *args, **kw)
        monkeypatch.setattr(mod, name, counting)
    checks: list[int] = []
    storage = PartitionStoreStorage(b)
    monkeypatch.setattr(storage, "check_page", lambda *a_: checks.append(1))
    srv = SupplierServer(PartitionStoreStorage(a), SECRET).start()
    try:
        scans.clear()                                     # the supplier side scans nothing
        Demander(storage, peer_of(srv), SECRET).fetch(6)
    finally:
        srv.stop()
    assert scans == ["part-6.bin.ferry-tmp"] and checks == []
    assert _entries(b, 6) == want


def test_prepared_install_given_up_changes_nothing(stores, tmp_path) -> None:
    import shutil
    a, b = stores
    for i in range(300):
        a.put(2, _key(i), b"v" * 100)
    a.checkpoint()
    src = str(tmp_path / "received.bin")
    shutil.copy(a.partition_path(2), src)
    prepared = b.prepare_install(2, src)
    prepared.close()
    assert 2 not in b.partitions() and os.path.exists(src)
    assert not os.path.exists(b.partition_path(2))
    prepared = b.prepare_install(2, src)                 # used: installed as if scanned now
    b.install_partition(2, src, prepared)
    assert _entries(b, 2) == _entries(a, 2) and not os.path.exists(src)
    b.put(2, b"after", b"install")                        # the partition's write fd is at dst
    b.checkpoint()
    got = {e.key: e.value for e in pagefile.iter_entries(b.partition_path(2), include_tombstones=False)}
    assert got[b"after"] == b"install" and len(got) == 301


def test_the_receive_slot_is_given_back_before_the_page_check(stores) -> None:
    """With ONE receive slot, a second transfer's bytes flow while the first one's page
    check (this side's CPU and disk alone) still runs: the slot covers the wire only."""
    import threading

    a, b = stores
    for p in (1, 2):
        for i in range(400):
            a.put(p, _key(i), b"v-%d-" % i + b"x" * 200)
    a.checkpoint()
    in_check = threading.Event()
    let_go = threading.Event()
    order: list[str] = []

    class SlowCheck(PartitionStoreStorage):
        def prepare_install(self, cache, partition, path):   # the first fetch's page check waits
            if partition == 1:
                order.append("check 1 starts")
                in_check.set()
                assert let_go.wait(10), "the second transfer never received its bytes"
            return super().prepare_install(cache, partition, path)

    srv = SupplierServer(PartitionStoreStorage(a), SECRET, limits=Limits(4)).start()
    try:
        d = Demander(SlowCheck(b), peer_of(srv), SECRET, limits=Limits(1))
        first: list = []
        t = threading.Thread(target=lambda: first.append(d.fetch(1)))
        t.start()
        assert in_check.wait(10)

        def progress(ev) -> None:
            if ev.stage == "verify" and "receive 2 done" not in order:
                order.append("receive 2 done")
                let_go.set()          # the first check may finish only after this
        second = d.fetch(2, progress=progress)
        t.join(10)
    finally:
        let_go.set()
        srv.stop()
    assert order == ["check 1 starts", "receive 2 done"]
    assert first and first[0].counter == a.counter(1) and second.counter == a.counter(2)
    assert dict(b.scan(1)) == dict(a.scan(1)) and dict(b.scan(2)) == dict(a.scan(2))
