"""A delta fetch that takes the store's older file as its temp file (``Demander(...,
adopt=True)``, what a node's move does): nothing of the base is copied, the pages
received are written over it in place, and the file installed is the very inode the
store held. The store's side (``PartitionStore.give_up_file``) is crash-safe as a drop,
and the releaser frees a replaced file's blocks off the store's lock."""
from __future__ import annotations

import os

import pytest

from checkpoint import CheckpointError, PartitionStore, SnapshotBusyError, pagefile
from checkpoint.release import Releaser
from faults import fileio
from transfer import ChecksumError, Demander, PartitionStoreStorage, SupplierServer, delta
from transfer.errors import Busy
from transfer.resume import partial_paths
from transfer_helpers import SECRET, peer_of

from test_partition_store import _key, stores  # noqa: F401  (stores: the fixture)


def _fill(store, p: int, n: int, tag: bytes = b"v0") -> None:
    for i in range(n):
        store.put(p, _key(i), tag + b"-%d-" % i + b"x" * 200)
    store.checkpoint()


def _change(store, p: int, keys: range, tag: bytes) -> None:
    for i in keys:
        store.put(p, _key(i), tag + b"-%d-" % i + b"y" * 200)
    store.checkpoint()


def _fetch(a, b, p: int = 3, *, adopt: bool = True):
    srv = SupplierServer(PartitionStoreStorage(a), SECRET).start()
    try:
        return Demander(PartitionStoreStorage(b), peer_of(srv), SECRET, chunk_size=64 << 10,
                        adopt=adopt).fetch(p)
    finally:
        srv.stop()


def _same(a, b, p: int = 3) -> None:
    assert dict(b.scan(p)) == dict(a.scan(p))
    assert b.counter(p) == a.counter(p)
    assert pagefile.verify(b.partition_path(p)) == []
    assert open(b.partition_path(p), "rb").read() == open(a.partition_path(p), "rb").read()


def _stale_copy(a, b, n: int, every: int) -> os.stat_result:
    """b holds a's partition 3 of ``n`` keys (one whole fetch); then every ``every``-th
    key changes on a. Returns the stat of b's (now stale) file."""
    _fill(a, 3, n)
    _fetch(a, b)
    stale = os.stat(b.partition_path(3))
    _change(a, 3, range(0, n, every), b"NEW")
    return stale


def test_the_installed_file_is_the_stale_file_written_in_place(stores) -> None:
    a, b = stores
    stale = _stale_copy(a, b, 6000, 600)
    res = _fetch(a, b)
    assert res.mode == "delta" and 1 <= res.pages_sent <= 21, res
    now = os.stat(b.partition_path(3))
    # the same inode: handed over as the temp file, written in place, renamed back
    assert (now.st_dev, now.st_ino) == (stale.st_dev, stale.st_ino)
    _same(a, b)
    assert not any(os.path.exists(x) for x in partial_paths(b.partition_path(3)))


def test_without_adopt_the_base_is_a_copy_and_the_old_file_stays(stores) -> None:
    a, b = stores
    stale = _stale_copy(a, b, 3000, 500)
    res = _fetch(a, b, adopt=False)
    assert res.mode == "delta", res
    assert os.stat(b.partition_path(3)).st_ino != stale.st_ino
    _same(a, b)


def test_a_failed_adopted_delta_leaves_the_base_for_the_next_fetch(stores, monkeypatch) -> None:
    """The root check fails (a supplier leaving out a changed page): nothing installed,
    the store no longer holds the partition, and the temp file keeps the base with
    what was received; the next fetch takes that as its base and is a delta again."""
    a, b = stores
    _fill(a, 3, 3000)
    _fetch(a, b)
    _change(a, 3, (7, 2500), b"changed")
    real = delta.diff_ranges
    monkeypatch.setattr(delta, "diff_ranges", lambda base, mine, **kw: real(base, mine, **kw)[1:])
    with pytest.raises(ChecksumError, match="root digest mismatch"):
        _fetch(a, b)
    assert 3 not in b.partitions()
    tmp = partial_paths(b.partition_path(3))[0]
    assert os.path.getsize(tmp) > 0 and not os.path.exists(b.partition_path(3))
    monkeypatch.setattr(delta, "diff_ranges", real)
    res = _fetch(a, b)
    assert res.mode == "delta" and res.pages_sent <= 4, res
    _same(a, b)


def test_the_base_left_by_a_crash_survives_the_store_reopening(tmp_path) -> None:
    """A crash right after the hand-over (SIGKILL-like: no checkpoint at close): the
    partition's earlier WAL records are not replayed (the DROP comes first), the store
    opens without it, and the temp file is the next fetch's base."""
    path = str(tmp_path / "b")
    b = PartitionStore.open(path, checkpoint_interval=None)
    _fill(b, 3, 2000)
    for i in range(50):                       # in the WAL only: no checkpoint after them
        b.put(3, _key(i), b"wal-only")
    tmp = partial_paths(b.partition_path(3))[0]
    assert b.give_up_file(3, tmp) is True
    held = open(tmp, "rb").read()
    b.close(checkpoint=False)
    b = PartitionStore.open(path, checkpoint_interval=None)
    try:
        assert 3 not in b.partitions()
        assert not os.path.exists(b.partition_path(3))
        assert open(tmp, "rb").read() == held
    finally:
        b.close()


def test_no_file_to_hand_over_is_a_full_fetch(stores) -> None:
    a, b = stores
    _fill(a, 3, 500)
    tmp = partial_paths(b.partition_path(3))[0]
    assert b.give_up_file(3, tmp) is False and not os.path.exists(tmp)
    res = _fetch(a, b)
    assert res.mode == "full"
    _same(a, b)


@pytest.mark.parametrize("name", ["../elsewhere.bin", "part-4.bin.ferry-tmp", "part-3.bin",
                                  "/tmp/part-3.bin.ferry-tmp", "part-30.bin.ferry-tmp"])
def test_a_name_not_beside_the_file_is_refused(stores, name) -> None:
    a, b = stores
    _fill(b, 3, 100)
    to = name if os.path.isabs(name) else os.path.join(os.path.dirname(b.partition_path(3)), name)
    with pytest.raises(CheckpointError, match="not a name beside"):
        b.give_up_file(3, to)
    assert 3 in b.partitions() and os.path.exists(b.partition_path(3))


def test_an_open_snapshot_keeps_the_file(stores) -> None:
    a, b = stores
    _fill(b, 3, 100)
    tmp = partial_paths(b.partition_path(3))[0]
    snap = b.open_transfer_snapshot(3)
    try:
        with pytest.raises(SnapshotBusyError):
            b.give_up_file(3, tmp)
        with pytest.raises(Busy):
            PartitionStoreStorage(b).adopt_base("default", 3, tmp)
    finally:
        snap.close()
    assert 3 in b.partitions() and not os.path.exists(tmp)


def test_the_releaser_closes_off_the_callers_path(tmp_path) -> None:
    path = str(tmp_path / "f")
    with open(path, "wb") as f:
        f.write(b"x" * 4096)
    r = Releaser()
    fd = r.hold(path)
    assert fd is not None
    os.unlink(path)                           # the name goes; the inode lives on
    os.fstat(fd)
    r.release(fd)
    r.drain()
    with pytest.raises(OSError):
        os.fstat(fd)                          # closed by the releaser's thread
    r.release(None)                           # nothing to do
    r.close()
    assert r.hold(str(tmp_path / "missing")) is None


def test_the_releaser_holds_nothing_under_a_swapped_layer(tmp_path, monkeypatch) -> None:
    path = str(tmp_path / "f")
    open(path, "wb").close()

    class Layer(fileio.FileLayer):
        pass
    monkeypatch.setattr(fileio, "layer", lambda: Layer())
    assert Releaser.hold(path) is None


def test_an_install_does_not_free_the_old_file_under_the_lock(stores, monkeypatch) -> None:
    """The replaced file's descriptor reaches the releaser after the rename and the
    directory's fsync, not before: its blocks are freed off the checkpoint lock."""
    a, b = stores
    _fill(a, 3, 2000)
    _fetch(a, b, adopt=False)
    _change(a, 3, range(0, 2000, 100), b"NEW")
    seen = []
    real = b._release.release

    def release(fd):
        seen.append((fd, b._ckpt_lock._is_owned()))
        real(fd)
    monkeypatch.setattr(b._release, "release", release)
    _fetch(a, b, adopt=False)
    held = [owned for fd, owned in seen if fd is not None]
    assert held == [False], seen
    b._release.drain()
    _same(a, b)


def test_a_partition_made_again_during_the_hand_over_stays(stores, monkeypatch) -> None:
    """A write makes the partition again while the DROP becomes durable (the store
    lock is not held then): the new partition keeps its file, nothing is handed over."""
    a, b = stores
    _fill(b, 3, 200)
    real = b.wal.wait_durable

    def wait_and_write(lsn):
        real(lsn)
        b.put(3, _key(1), b"made again")
    monkeypatch.setattr(b.wal, "wait_durable", wait_and_write)
    tmp = partial_paths(b.partition_path(3))[0]
    assert b.give_up_file(3, tmp) is False
    monkeypatch.setattr(b.wal, "wait_durable", real)
    assert not os.path.exists(tmp)
    assert dict(b.scan(3)) == {_key(1): b"made again"}
