"""PartitionStore: the update path, counters, reopen, install/drop, checkpoints."""
from __future__ import annotations

import os
import shutil
import threading
import time

import pytest

from checkpoint import CheckpointError, PartitionStore, iter_entries, read_meta
from checkpoint.errors import PartitionNotFoundError, SnapshotBusyError, StoreClosedError


def test_put_get_remove_scan_counters(open_store) -> None:
    s = open_store()
    assert s.put(1, b"a", b"1") == 1
    assert s.put(1, b"b", b"2" * 5000) == 2          # overflow value
    assert s.put(2, b"a", b"x") == 1                 # counters are per partition
    assert s.remove(1, b"a") == 3
    assert s.remove(1, b"nope") == 4                 # still an update with a counter
    assert s.get(1, b"a") is None and s.get(1, b"b") == b"2" * 5000
    assert dict(s.scan(1)) == {b"b": b"2" * 5000}
    assert s.counter(1) == 4 and s.partitions() == [1, 2]
    with pytest.raises(PartitionNotFoundError):
        s.counter(9)


def test_apply_is_idempotent_by_counter(open_store) -> None:
    s = open_store()
    assert s.apply(3, b"k", b"v5", 5) is True
    assert s.apply(3, b"k", b"old", 5) is False      # at the counter: ignored
    assert s.apply(3, b"k", b"older", 2) is False    # below: ignored
    assert s.apply(3, b"k", None, 9) is True
    assert s.get(3, b"k") is None and s.counter(3) == 9
    assert s.put(3, b"k", b"again") == 10


def test_reopen_after_close_and_after_abandon(open_store, tmp_path) -> None:
    s = open_store()
    for i in range(2000):
        s.put(i % 3, b"k%d" % i, b"v%d" % i)
    s.close()
    s = open_store()
    assert s.replayed == 0
    assert s.get(1999 % 3, b"k1999") == b"v1999"
    for i in range(2000, 2500):
        s.put(i % 3, b"k%d" % i, b"v%d" % i)
    s.wal.sync()
    s.close(checkpoint=False)                        # no checkpoint: WAL replay needed
    s = open_store()
    assert s.replayed == 500
    assert all(s.get(i % 3, b"k%d" % i) == b"v%d" % i for i in range(2500))


def test_bad_input_is_refused_and_loses_nothing(open_store) -> None:
    s = open_store(page_size=1024)
    s.put(0, b"k", b"v")
    with pytest.raises(CheckpointError, match="key of"):
        s.put(0, b"x" * 2000, b"v")
    with pytest.raises(CheckpointError, match="value of"):
        s.put(0, b"k", bytes(16 * 1024 * 1024 + 1))
    with pytest.raises(CheckpointError, match="page size"):
        PartitionStore.open("/tmp/never-created-ferry", page_size=3000)
    assert s.get(0, b"k") == b"v" and s.counter(0) == 1
    s.close()
    with pytest.raises(StoreClosedError):
        s.put(0, b"k", b"v")


@pytest.mark.slow
def test_max_value_round_trip(open_store) -> None:
    s = open_store(memory_budget=8 << 20)
    big = os.urandom(16 * 1024 * 1024)
    s.put(0, b"big", big)
    s.checkpoint()
    assert s.get(0, b"big") == big
    s.put(0, b"big", b"small")                       # the chain's pages become free
    s.checkpoint()
    size = os.path.getsize(s.partition_path(0))
    s.put(0, b"big2", big)                           # ... and are reused
    s.checkpoint()
    assert os.path.getsize(s.partition_path(0)) == size


def test_shrinking_partition_does_not_grow(open_store) -> None:
    s = open_store()
    for round_ in range(5):
        for i in range(3000):
            s.put(0, b"k%d" % i, bytes(200))
        s.checkpoint()
        size = os.path.getsize(s.partition_path(0))
        for i in range(3000):
            s.remove(0, b"k%d" % i)
        s.checkpoint()
        if round_ == 0:
            first = size
    assert size == first


def test_checkpoint_marker_reclaims_wal(open_store) -> None:
    s = open_store(wal_segment_size=64 * 1024)
    marks = []
    for r in range(4):
        for i in range(1000):
            s.put(0, b"k%d" % i, bytes(100))
        marks.append(s.checkpoint().mark_lsn)
    segs = [n for n in os.listdir(os.path.join(s.dir, "wal")) if n.endswith(".wal")]
    # After checkpoint 4 the log is kept from checkpoint 3's mark on (the marker of 4
    # is not fsynced by the checkpoint itself): rounds 3-4 and their undo images,
    # ~0.5 MB of the ~1 MB written, in 64 KiB segments.
    assert len(segs) <= 9, segs
    assert s.wal.first_lsn > marks[1]


def test_wait_checkpoint_covering_and_callback(open_store) -> None:
    s = open_store(checkpoint_interval=0.05)
    seen: list[dict[int, int]] = []
    s.on_checkpoint(seen.append)
    c = s.put(4, b"k", b"v")
    assert s.wait_checkpoint_covering(4, c, timeout=10)
    assert s.last_checkpoint_counter(4) >= c
    assert read_meta(s.partition_path(4)).counter >= c
    assert any(d.get(4, 0) >= c for d in seen)
    assert s.wait_checkpoint_covering(4, c + 5, timeout=0.2) is False


def test_install_and_drop(open_store, tmp_path) -> None:
    a = PartitionStore.open(str(tmp_path / "a"), checkpoint_interval=None, wal_sync="none")
    for i in range(500):
        a.put(5, b"k%d" % i, b"a%d" % i)
    snap = a.open_transfer_snapshot(5)
    received = str(tmp_path / "received.bin")
    with open(snap.path, "rb") as f:
        data = f.read(snap.size_bytes)
    snap.close()
    a.close()
    with open(received, "wb") as f:
        f.write(data)
    s = open_store()
    s.put(5, b"stale", b"old incarnation")           # WAL records that must not come back
    s.wal.sync()
    s.install_partition(5, received)
    assert s.get(5, b"stale") is None and s.get(5, b"k7") == b"a7"
    assert s.counter(5) == 500
    s.close(checkpoint=False)                        # replay must skip the pre-install record
    s = open_store()
    assert s.get(5, b"stale") is None and s.get(5, b"k499") == b"a499"
    s.put(6, b"x", b"y")
    s.drop_partition(6)
    assert 6 not in s.partitions() and not os.path.exists(s.partition_path(6))
    s.close(checkpoint=False)
    s = open_store()
    assert 6 not in s.partitions() and s.get(5, b"k1") == b"a1"


def test_file_checked_holds_from_the_install_scan_until_a_checkpoint_writes(open_store,
                                                                            tmp_path) -> None:
    """file_checked(p): every page passed check_page in the scan that installed (or
    opened) the file, and no checkpoint wrote it since: what lets the index rebuild of
    an installed file skip the CRCs."""
    a = PartitionStore.open(str(tmp_path / "a"), checkpoint_interval=None, wal_sync="none")
    for i in range(300):
        a.put(5, b"k%d" % i, b"a%d" % i)
    a.checkpoint()
    received = str(tmp_path / "received.bin")
    shutil.copyfile(a.partition_path(5), received)
    a.close()
    s = open_store()
    assert not s.file_checked(5) and not s.file_checked(6)     # no such partition
    s.install_partition(5, received)
    assert s.file_checked(5)
    s.checkpoint()                                    # nothing dirty: nothing written
    assert s.file_checked(5)
    s.put(5, b"new", b"v")
    s.checkpoint()                                    # the file is written: no longer
    assert not s.file_checked(5)
    s.close()
    s = open_store()                                  # the open scan checks every page
    assert s.file_checked(5)


def test_install_refuses_wrong_partition(open_store, tmp_path) -> None:
    s = open_store()
    s.put(1, b"k", b"v")
    s.checkpoint()
    other = str(tmp_path / "other.bin")
    shutil.copy(s.partition_path(1), other)
    with pytest.raises(CheckpointError, match="cannot be installed"):
        s.install_partition(2, other)
    assert os.path.exists(other) and s.get(1, b"k") == b"v"


def test_writers_many_threads_group_commit(open_store) -> None:
    s = open_store(wal_sync="group")
    def work(t: int) -> None:
        for i in range(200):
            s.put(t % 2, b"t%d-%d" % (t, i), b"v")
    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert s.counter(0) + s.counter(1) == 1600
    assert sum(1 for _ in s.scan(0)) + sum(1 for _ in s.scan(1)) == 1600


def test_snapshot_one_per_partition_and_delta_removed(open_store) -> None:
    s = open_store()
    s.put(1, b"k", b"v")
    s.put(2, b"k", b"v")
    a = s.open_transfer_snapshot(1)
    b = s.open_transfer_snapshot(2)                  # several partitions at once
    assert os.path.exists(a.delta_path) and os.path.exists(b.delta_path)
    with pytest.raises(SnapshotBusyError):
        s.open_transfer_snapshot(1)
    with pytest.raises(SnapshotBusyError):
        s.drop_partition(1)
    a.close()
    assert not os.path.exists(a.delta_path)
    s.close(checkpoint=False)                        # b is left open, as a crash would
    open(b.delta_path, "wb").write(b"left by a crash")
    s = open_store()
    assert not any(n.endswith(".delta") for n in os.listdir(s.dir))
    assert [e.key for e in iter_entries(s.partition_path(2))] == [b"k"]


def test_unlogged_apply_many_is_durable_only_by_checkpoint(open_store) -> None:
    """``apply_many(logged=False)`` (the temp-WAL replay of a move): page memory only,
    no UPDATE record in the WAL; a covering checkpoint makes it durable, a crash before
    one loses exactly those updates and nothing else, and the store reopens cleanly."""
    from checkpoint.records import RecordType, decode_update

    def updates_logged(s, p: int) -> int:
        return sum(1 for r in s.wal.read_from(s.wal.first_lsn)
                   if r.type == RecordType.UPDATE and decode_update(r.payload).partition == p)
    s = open_store(wal_sync="group")
    for i in range(50):
        s.put(1, b"base-%d" % i, b"v" * 100)
    s.put(2, b"other", b"kept")
    s.checkpoint()
    before = updates_logged(s, 1)
    ups = [(b"r-%d" % i, b"R%d-" % i + b"x" * (200 if i % 7 else 9000), 51 + i) for i in range(300)]
    assert s.apply_many(1, ups, logged=False) == [True] * 300
    assert updates_logged(s, 1) == before
    assert s.counter(1) == 350 and s.get(1, b"r-299") == ups[299][1]
    s.put(2, b"other-2", b"logged")                     # other partitions log as always
    s.wal.sync()
    s.close(checkpoint=False)                           # a crash: no checkpoint since
    s = open_store(wal_sync="group")
    assert s.counter(1) == 50 and s.get(1, b"r-0") is None
    assert s.get(1, b"base-49") == b"v" * 100
    assert s.get(2, b"other") == b"kept" and s.get(2, b"other-2") == b"logged"
    assert s.apply_many(1, ups, logged=False) == [True] * 300
    assert s.wait_checkpoint_covering(1, 350, timeout=30)
    s.close(checkpoint=False)                           # a crash after the covering checkpoint
    s = open_store(wal_sync="group")
    assert s.counter(1) == 350
    assert dict(s.scan(1)) == {**{b"base-%d" % i: b"v" * 100 for i in range(50)},
                               **{k: v for k, v, _ in ups}}


def test_waits_that_one_checkpoint_covers_share_it(open_store, monkeypatch) -> None:
    """Moves that end together each wait for a checkpoint covering their partition; the
    first one's checkpoint covers the others, which must not write another one each."""
    s = open_store(checkpoint_interval=None)
    want = {p: s.put(p, b"k", b"v" * 3000) for p in range(1, 9)}   # all applied first
    runs: list[int] = []
    real = s._checkpoint_locked

    def slow_checkpoint():
        runs.append(1)
        out = real()
        time.sleep(0.2)           # the others are waiting for the lock meanwhile
        return out
    monkeypatch.setattr(s, "_checkpoint_locked", slow_checkpoint)
    results: list[bool] = []
    threads = [threading.Thread(target=lambda p=p: results.append(
        s.wait_checkpoint_covering(p, want[p], timeout=30))) for p in want]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [True] * len(want)
    assert len(runs) == 1
    assert all(s.last_checkpoint_counter(p) >= c for p, c in want.items())
