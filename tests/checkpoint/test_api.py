"""The store's batch apply and the live checkpoint interval."""
from __future__ import annotations

import time

import pytest

from checkpoint import CheckpointError


def test_apply_many_is_apply_per_item(open_store) -> None:
    s = open_store()
    s.apply(3, b"a", b"v4", 4)
    got = s.apply_many(3, [(b"a", b"old", 4),      # at the partition's counter: ignored
                           (b"b", b"v5", 5),
                           (b"c", b"v7", 7),
                           (b"d", b"v6", 6),        # below the batch's own latest: ignored
                           (b"a", None, 8)])        # remove
    assert got == [False, True, True, False, True]
    assert s.counter(3) == 8
    assert s.get(3, b"a") is None and s.get(3, b"b") == b"v5" and s.get(3, b"d") is None
    assert s.apply_many(3, []) == []
    assert s.apply_many(4, [(b"k", b"x" * 9000, 1)]) == [True]   # overflow value, new partition
    assert s.get(4, b"k") == b"x" * 9000


def test_apply_many_writes_one_wal_batch_and_survives_replay(open_store) -> None:
    s = open_store(wal_sync="group")
    before = s.wal.last_lsn
    syncs = []
    real = s.wal.wait_durable
    s.wal.wait_durable = lambda lsn: (syncs.append(lsn), real(lsn))[1]
    got = s.apply_many(0, [(b"k%d" % i, b"v%d" % i, i + 1) for i in range(500)])
    assert all(got) and s.wal.last_lsn == before + 500
    assert syncs == [before + 500]               # ONE durability wait for the batch
    s.close(checkpoint=False)                    # nothing checkpointed: replay from the WAL
    s = open_store()
    assert s.replayed == 500 and s.counter(0) == 500
    assert dict(s.scan(0)) == {b"k%d" % i: b"v%d" % i for i in range(500)}


def test_apply_many_chunks_stay_within_page_memory(open_store) -> None:
    s = open_store(page_size=1024, memory_budget=64 * 1024)
    n = 4000
    assert sum(s.apply_many(1, [(b"key-%06d" % i, bytes(200), i + 1) for i in range(n)])) == n
    st = s.stats()
    assert st["dirty_pages"] + st["cut_pages"] <= st["capacity_pages"]
    assert sum(1 for _ in s.scan(1)) == n


def test_apply_many_refuses_bad_input_and_applies_nothing(open_store) -> None:
    s = open_store(page_size=1024)
    s.apply(0, b"k", b"v", 1)
    with pytest.raises(CheckpointError, match="key of"):
        s.apply_many(0, [(b"ok", b"v", 2), (b"x" * 2000, b"v", 3)])
    with pytest.raises(TypeError):
        s.apply_many(0, [(b"ok", "text", 2)])
    assert s.counter(0) == 1 and s.get(0, b"ok") is None


def test_checkpoint_interval_is_set_live(open_store) -> None:
    s = open_store()
    assert s.checkpoint_interval is None
    s.put(0, b"k", b"v")
    s.set_checkpoint_interval(0.05)
    assert s.checkpoint_interval == 0.05
    deadline = time.monotonic() + 20
    while s.last_checkpoint_counter(0) < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert s.last_checkpoint_counter(0) == 1     # the background loop picked it up
    s.set_checkpoint_interval(None)
    assert s.checkpoint_interval is None
    with pytest.raises(ValueError):
        s.set_checkpoint_interval(0)
