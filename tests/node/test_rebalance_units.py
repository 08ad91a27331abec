"""In-process pieces of file-based rebalancing: the temp WAL, settings, move status/ETA
and batched apply. (Plans: tests/node/test_reassign_units.py.)"""
from __future__ import annotations

import json
import threading
import time

import pytest

from node.config import CacheConfig, load
from node.errors import ConfigError
from node.move import Stage
from node.rebalance import Move
from node.tempwal import TempWalSink, Update, leftovers, remove, tmpwal_dir


# -- temp WAL -------------------------------------------------------------------------
def test_temp_wal_round_trip_backlog_and_leftovers(tmp_path):
    data = str(tmp_path)
    sink = TempWalSink.fresh(data, "default", 7)
    sink.append(11, b"k1", b"v1")
    sink.append(12, b"k2", None)
    sink.append(13, b"k1", b"")
    got = sink.read(sink.wal.first_lsn, None)
    assert [u for _, u in got] == [Update(11, b"k1", b"v1"), Update(12, b"k2", None), Update(13, b"k1", b"")]
    assert sink.backlog() == 3
    sink.replayed = got[1][0]
    assert sink.backlog() == 1
    assert sink.read(got[-1][0] + 1, None) == []
    sink.close()
    # a crash leaves it on disk: found, reopened intact, then removed
    assert leftovers(data) == [("default", 7)]
    again = TempWalSink(tmpwal_dir(data, "default", 7))
    assert [u.counter for u in again.records()] == [11, 12, 13]
    again.close()
    remove(data, "default", 7)
    assert leftovers(data) == []
    fresh = TempWalSink.fresh(data, "default", 7)      # fresh = whatever was there is gone
    assert fresh.backlog() == 0 and list(fresh.records()) == []
    fresh.destroy()
    assert leftovers(data) == []


def test_fresh_temp_wal_is_on_disk_from_its_first_append(tmp_path):
    """A move that buffers nothing creates and deletes no log; the first append
    creates it before its record is written, and a destroyed sink never creates one."""
    import os
    from wal import WalClosedError
    data = str(tmp_path)
    sink = TempWalSink.fresh(data, "default", 3)
    assert not sink.on_disk and not os.path.exists(tmpwal_dir(data, "default", 3))
    assert sink.backlog() == 0 and sink.last_lsn == sink.first_lsn - 1 == 0
    cursor = sink.cursor(sink.first_lsn)
    assert cursor.read(None) == []
    sink.sync()                                         # nothing to make durable
    sink.append(5, b"k", b"v")
    assert sink.on_disk and leftovers(data) == [("default", 3)]
    assert [u for _, u in cursor.read(None)] == [Update(5, b"k", b"v")] and sink.backlog() == 1
    cursor.close()
    sink.destroy()
    assert leftovers(data) == []
    idle = TempWalSink.fresh(data, "default", 4)
    idle.destroy()                                      # nothing was on disk: nothing to do
    with pytest.raises(WalClosedError):
        idle.append(1, b"k", b"v")
    assert leftovers(data) == [] and not os.path.exists(tmpwal_dir(data, "default", 4))


def test_temp_wal_reader_never_blocks_appends(tmp_path):
    sink = TempWalSink.fresh(str(tmp_path), "c", 1, sync="none")
    stop = threading.Event()
    counter = [0]

    def writer() -> None:
        while not stop.is_set():
            counter[0] += 1
            sink.append(counter[0], b"k", b"x" * 50)
    t = threading.Thread(target=writer)
    t.start()
    try:
        lsn, seen = sink.wal.first_lsn, []
        deadline = time.monotonic() + 5
        while len(seen) < 2000 and time.monotonic() < deadline:
            batch = sink.read(lsn, 500)
            seen += [u.counter for _, u in batch]
            if batch:
                lsn = batch[-1][0] + 1
    finally:
        stop.set()
        t.join()
    assert seen == list(range(1, len(seen) + 1)) and len(seen) >= 100
    sink.destroy()


# -- config and move status --------------------------------------------------------------
def test_transfer_and_replay_settings(tmp_path):
    cfg = load(None, id="n1", data=str(tmp_path), listen="127.0.0.1:7001")
    assert cfg.rebalance_mode == "files" and cfg.supplier_listen == ("127.0.0.1", 0)
    cfg = load(None, id="n1", data=str(tmp_path), transfer_listen="0.0.0.0:9100")
    assert cfg.supplier_listen == ("0.0.0.0", 9100)
    with pytest.raises(ConfigError, match="transfer.listen"):
        load(None, id="n1", data=str(tmp_path), transfer_listen="nope")
    p = tmp_path / "n.toml"
    p.write_text('id = "n1"\ndata = "d"\n[rebalance]\nreplay_rate_limit = 50\n[transfer]\nlisten = "127.0.0.1:0"\n')
    cfg = load(str(p))
    assert cfg.replay_rate_limit == 50 and cfg.supplier_listen == ("127.0.0.1", 0)


def test_move_status_per_stage():
    mv = Move("default", 3, mode="files")
    mv.begin("transfer")
    mv.fig.bytes, mv.fig.bytes_total = 100, 400
    st = mv.status("n3")
    assert st["stage"] == "transfer" and st["mode"] == "files" and "prepare" in st["stage_seconds"]
    assert st["eta_s"] is not None and st["eta_s"] >= 0
    mv.begin("replay")
    assert mv.status("n3")["eta_s"] is None            # no replay rate yet
    assert set(mv.progress().fig.stage_seconds) == {"prepare", "transfer"}


def test_move_reports_replay_against_ingest(tmp_path):
    """status/moves_done carry the temp-WAL ingest rate and the replay rate."""
    mv = Move("default", 3, mode="files")
    sink = TempWalSink(str(tmp_path / "t"), sync="none")
    mv.use_sink(sink)
    mv.fig.buffer_started = time.monotonic() - 2.0
    for c in range(1, 11):
        sink.append(c, b"k%d" % c, b"v")
    st = mv.status("n3")
    assert st["buffered"] == 10 and 3.0 < st["ingest_rate"] <= 5.0   # ~10 records in 2 s
    assert st["replay_over_ingest"] is None                          # no replay yet
    mv.fig.replay_started, mv.fig.ingest_rate, mv.fig.replay_rate, mv.fig.replayed = time.monotonic(), 5.0, 50.0, 10
    c = mv.progress().catchup()
    assert c["replay_over_ingest"] == 10.0 and c["replayed"] == 10
    mv.fig.buffered = 10
    assert mv.take_sink() is sink
    sink.destroy()
    assert mv.summary("n3")["buffered"] == 10 and mv.summary("n3")["replay_over_ingest"] == 10.0


def test_move_control_changes_through_its_methods(tmp_path):
    """The engine changes a move's sink, mode, direct switch and gap through methods;
    readers get a snapshot that later changes do not touch, with the JSON fields of
    ``moves`` and ``moves_done``."""
    import dataclasses

    mv = Move("default", 3, mode="files", source="n1")
    for name in ("sink", "mode", "direct", "gap", "cancelled", "stage"):
        with pytest.raises(AttributeError):
            setattr(mv, name, None)
    sink = TempWalSink(str(tmp_path / "t"), sync="none")
    mv.use_sink(sink)
    mv.go_direct()
    mv.flag_gap("missed")
    assert mv.sink is sink and mv.direct and mv.gap == "missed"
    mv.use_sink(sink)                                   # a new attempt: neither any more
    assert not mv.direct and mv.gap is None
    snap = mv.progress()
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.stage = Stage.REPLAY                       # type: ignore[misc]
    snap.fig.stage_seconds["x"] = 1.0                   # the snapshot's own copy
    mv.fig.bytes = 5
    assert snap.fig.bytes == 0 and "x" not in mv.fig.stage_seconds
    assert set(mv.status("n3")) == {
        "cache", "partition", "from", "to", "mode", "stage", "bytes", "bytes_total", "rate_bps",
        "backlog", "eta_s", "wire_bytes", "stage_seconds", "seconds", "copy", "buffered", "replayed",
        "replay_rate", "ingest_rate", "ingest_rate_during_replay", "replay_cpu_s", "replay_from_disk",
        "replay_over_ingest"}
    assert set(mv.summary("n3")) == {
        "cache", "partition", "from", "to", "mode", "bytes", "wire_bytes", "replayed",
        "seconds_to_owning", "stage_seconds", "finished", "buffered", "replay_rate", "ingest_rate",
        "ingest_rate_during_replay", "replay_cpu_s", "replay_from_disk", "replay_over_ingest",
        "transfer_stages", "index_source", "copy"}
    assert mv.to_messages() is sink and mv.mode == "messages" and mv.sink is None
    assert set(mv.status("n3")) == {"cache", "partition", "from", "to", "mode", "stage", "bytes",
                                    "bytes_total", "rate_bps", "backlog", "eta_s"}
    mv.cancel()
    assert mv.cancelled
    sink.destroy()


def test_cache_data_apply_many_batches_and_keeps_the_index_right(tmp_path):
    """One batch with a key updated twice, a remove, and counters at or below the
    partition's (skipped): data and index end as if applied one by one."""
    from node.storage import CacheData
    cfg = load(None, id="n1", data=str(tmp_path), listen="127.0.0.1:7001")
    cache = CacheConfig.from_wire({"name": "default", "partitions": 4, "backups": 1,
                                   "indexes": [{"name": "by_city", "field": "city", "unique": False}]})
    d = CacheData(cfg, cache)
    try:
        d.create(1)
        city = lambda c: json.dumps({"city": c}).encode()   # noqa: E731
        assert d.apply(1, b"a", city("oslo"), 1)
        n = d.apply_many(1, [(b"a", city("lima"), 1),          # at the partition's counter: skipped
                             (b"a", city("pune"), 2), (b"b", city("kyiv"), 3),
                             (b"a", city("oslo"), 4), (b"b", None, 5), (b"c", city("pune"), 6),
                             (b"c", city("lima"), 6)])          # repeated counter: skipped
        assert n == 5 and d.counter(1) == 6
        assert d.get(1, b"a") == city("oslo") and d.get(1, b"b") is None and d.get(1, b"c") == city("pune")
        assert sorted(d.lookup("by_city", "oslo")) == [b"a"]
        assert d.lookup("by_city", "kyiv") == [] and d.lookup("by_city", "lima") == []
        assert sorted(d.lookup("by_city", "pune")) == [b"c"]
        assert d.apply_many(1, []) == 0 and d.apply_many(1, [(b"z", b"{}", 3)]) == 0
    finally:
        d.close()


def test_temp_wal_batch_appends_then_one_sync(tmp_path):
    """A replicated batch is written in order with durable=False and synced once."""
    sink = TempWalSink(str(tmp_path / "t"), sync="group")
    try:
        for c in range(1, 6):
            sink.append(c, b"k%d" % c, None if c == 3 else b"v", durable=False)
        sink.sync()
        assert sink.wal._durable_lsn >= sink.last_lsn     # durable after the one sync
        got = [(u.counter, u.key, u.value) for _, u in sink.read(sink.wal.first_lsn, None)]
        assert got == [(1, b"k1", b"v"), (2, b"k2", b"v"), (3, b"k3", None), (4, b"k4", b"v"), (5, b"k5", b"v")]
        assert sink.appended == 5 and sink.backlog() == 5
    finally:
        sink.destroy()


@pytest.mark.parametrize("cache_bytes", [0, 3000, 1 << 30])
def test_replay_cursor_reads_memory_tail_and_disk_in_order(tmp_path, cache_bytes):
    """The replay's cursor, with no memory tail, a tail too small for the backlog (the
    older records come from disk) and one that holds everything, while a writer keeps
    appending: every record exactly once, in LSN order, equal to what is on disk;
    ``read`` never returns more than asked, nor a record not yet written."""
    import random
    rnd = random.Random(7)
    sink = TempWalSink(str(tmp_path / "t"), sync="none", cache_bytes=cache_bytes)
    n = 3000

    def writer() -> None:
        for i in range(n):
            sink.append(i + 1, b"k%d" % i, None if i % 7 == 0 else bytes(i % 300))
    t = threading.Thread(target=writer)
    t.start()
    cursor = sink.cursor(sink.wal.first_lsn)
    got: list = []
    try:
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            limit, max_bytes = rnd.randrange(1, 50), rnd.choice([None, 500, 5000])
            batch = cursor.read(limit, max_bytes)
            assert len(batch) <= limit and all(lsn <= sink.wal.last_lsn for lsn, _ in batch)
            if batch and max_bytes is not None:   # stops once max_bytes is reached
                sizes = [len(u.encode()) for _, u in batch]
                assert sum(sizes[:-1]) < max_bytes
            got += batch
    finally:
        t.join()
        cursor.close()
    try:
        assert [u.counter for _, u in got] == list(range(1, n + 1))
        assert [lsn for lsn, _ in got] == list(range(sink.wal.first_lsn, sink.wal.first_lsn + n))
        assert [u for _, u in got] == list(sink.records())
        if cache_bytes == 0:
            assert cursor.from_disk == n
        assert sink.cache_size <= max(cache_bytes, 0) and len(sink.cache) == 0
    finally:
        sink.destroy()
