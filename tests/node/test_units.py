"""Config, rendezvous assignment and the partition state table."""
from __future__ import annotations

import errno
import os

import pytest

from faults import fileio
from faults.fileio import OutOfDiskError
from node import ALLOWED, State, StateTable, owners, partition_of
from node.assignment import assignment
from node.config import load
from node.errors import ConfigError, IllegalTransition


# -- config ---------------------------------------------------------------------------
def test_defaults_from_flags_only(tmp_path):
    cfg = load(None, id="n1", data=str(tmp_path))
    assert [(c.name, c.partitions, c.backups) for c in cfg.caches] == [("default", 64, 1)]
    assert cfg.rebalance_mode == "files" and cfg.listen == "127.0.0.1:7001"


def test_toml_with_flag_override(tmp_path):
    f = tmp_path / "node.toml"
    f.write_text('id = "n1"\ndata = "d"\nlisten = "127.0.0.1:7005"\n'
                 '[control_plane]\nendpoints = ["http://127.0.0.1:2379"]\nlease_ttl_s = 4\n'
                 '[wal]\nsync = "always"\n[rebalance]\nmode = "messages"\n'
                 '[[caches]]\nname = "people"\npartitions = 8\nbackups = 2\n'
                 '[[caches.indexes]]\nname = "by_city"\nfield = "city"\n')
    cfg = load(str(f), listen="127.0.0.1:7009")
    assert cfg.listen == "127.0.0.1:7009" and cfg.wal_sync == "always"
    assert cfg.control_plane == ("http://127.0.0.1:2379",) and cfg.lease_ttl_s == 4
    assert cfg.data == os.path.join(str(tmp_path), "d")     # relative to the file
    c = cfg.cache("people")
    assert (c.partitions, c.backups, c.indexes[0].field) == (8, 2, "city")


@pytest.mark.parametrize("text,needle", [
    ('id = "n1"\ndata = "d"\nbogus = 1\n', "unknown key"),
    ('id = "n1"\ndata = "d"\n[wal]\nsync = "sometimes"\n', "wal.sync"),
    ('id = "n1"\ndata = "d"\nlisten = "nowhere"\n', "HOST:PORT"),
    ('id = "n1"\ndata = "d"\n[[caches]]\npartitions = 0\n', "partitions"),
    ('id = "n1"\ndata = "d"\n[rebalance]\nmode = "carrier-pigeon"\n', "rebalance.mode"),
    ('id = "n1"\ndata = "d"\n[rebalance]\nindex_workers = -1\n', "rebalance.index_workers"),
    ('id = "n1"\ndata = "d"\n[rebalance]\nindex_offload = "sometimes"\n', "rebalance.index_offload"),
    ('id = "n1"\ndata = "d"\n[rebalance]\nindex_offload_min_bytes = -5\n', "index_offload_min_bytes"),
    ('id = "n1"\ndata = "d"\n[rebalance]\nstream_index = "yes"\n', "rebalance.stream_index"),
    ('id = "n1"\ndata = \n', "not valid TOML"),
    ('id = "n1"\ndata = "d"\njoin = ["127.0.0.1:7001"]\n', "membership lives in the control plane"),
    ('id = "n1"\ndata = "d"\n[membership]\nfailure_timeout_s = 3\n', "control plane"),
    ('id = "n1"\ndata = "d"\n[control_plane]\nlease_ttl_s = 1\n', "lease_ttl_s"),
    ('id = "n1"\ndata = "d"\n[control_plane]\nlease_ttl_s = 2.5\n', "whole number"),
    ('id = "n1"\ndata = "d"\n[control_plane]\nlease_ttl_s = 4\nlease_margin_s = 3\n', "lease_margin_s"),
    ('id = "n1"\ndata = "d"\n[control_plane]\nendpoints = ["ftp://x"]\n', "etcd client URL"),
    ('id = "n1"\ndata = "d"\n[cluster]\nmin_in_sync = 0\n', "min_in_sync"),
    ('data = "d"\n', "'id' is required"),
])
def test_bad_config_is_refused_with_a_clear_message(tmp_path, text, needle):
    f = tmp_path / "node.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load(str(f))


def test_stream_index_is_a_config_key_off_by_default(tmp_path):
    f = tmp_path / "node.toml"
    f.write_text('id = "n1"\ndata = "d"\n')
    assert load(str(f)).stream_index is False
    f.write_text('id = "n1"\ndata = "d"\n[rebalance]\nstream_index = true\n')
    assert load(str(f)).stream_index is True


# -- assignment -------------------------------------------------------------------------
def test_partition_of_is_stable():
    assert partition_of(b"hello", 64) == partition_of(b"hello", 64)
    assert {partition_of(str(i).encode(), 8) for i in range(200)} == set(range(8))


@pytest.mark.parametrize("n", [3, 5, 9])
def test_join_moves_about_one_nth(n):
    P, B = 1024, 1
    before = assignment("c", P, [f"n{i}" for i in range(n)], B)
    after = assignment("c", P, [f"n{i}" for i in range(n + 1)], B)
    # a copy moves only to the new node, and about (B+1)/(N+1) of the copies do
    moved = 0
    for b, a in zip(before, after):
        gained = set(a) - set(b)
        assert gained <= {f"n{n}"}
        moved += len(gained)
    expect = P * (B + 1) / (n + 1)
    assert 0.75 * expect < moved < 1.25 * expect, (moved, expect)


def test_leave_moves_only_the_leavers_partitions():
    nodes = [f"n{i}" for i in range(5)]
    before = assignment("c", 256, nodes, 1)
    after = assignment("c", 256, nodes[:-1], 1)
    for b, a in zip(before, after):
        if "n4" not in b:
            assert a == b
        else:
            assert set(b) - {"n4"} <= set(a)


def test_owners_primary_first_and_b_plus_one():
    o = owners("c", 3, ["a", "b", "c", "d"], 2)
    assert len(o) == 3 and len(set(o)) == 3
    assert owners("c", 3, ["a"], 2) == ["a"]


# -- states --------------------------------------------------------------------------------
def test_state_table_allows_the_documented_path_and_is_durable(tmp_path):
    t = StateTable(str(tmp_path))
    t.set("c", 1, State.MOVING)
    t.set("c", 1, State.OWNING)
    t.set("c", 1, State.RENTING)
    t.set("c", 1, State.EVICTED)
    t.set("c", 2, State.OWNING)
    again = StateTable(str(tmp_path))
    assert again.get("c", 1) == State.EVICTED and again.get("c", 2) == State.OWNING


@pytest.mark.parametrize("path", [
    [State.RENTING], [State.EVICTED], [State.OWNING, State.EVICTED],
    [State.MOVING, State.RENTING], [State.OWNING, State.RENTING, State.MOVING],
    [State.OWNING, State.LOST],
])
def test_illegal_transitions_are_refused_and_change_nothing(tmp_path, path):
    t = StateTable(str(tmp_path))
    for s in path[:-1]:
        t.set("c", 0, s)
    before = t.get("c", 0)
    with pytest.raises(IllegalTransition):
        t.set("c", 0, path[-1])
    assert t.get("c", 0) == before == StateTable(str(tmp_path)).get("c", 0)


class _FullDisk(fileio.FileLayer):
    """The disk fills up (ENOSPC on every write); ``seen`` records what a reader of the
    table saw while the write was being attempted."""

    def __init__(self, table: StateTable) -> None:
        self.table, self.seen = table, []

    def write(self, fd: int, data: bytes | memoryview) -> int:
        self.seen.append((self.table.get("c", 1), self.table.get("c", 2)))
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_state_is_visible_only_once_durable_and_a_failed_write_changes_nothing(tmp_path):
    """``get`` takes no lock: it must never show a state that is not on disk yet (an
    eviction acting on RENTING before RENTING is durable would, after a crash, leave
    OWNING on disk and no file), and a write that fails must leave the table as it was."""
    t = StateTable(str(tmp_path))
    t.set("c", 1, State.OWNING)
    full = _FullDisk(t)
    with fileio.use(full), pytest.raises(OutOfDiskError):
        t.set("c", 1, State.RENTING)
    with fileio.use(full), pytest.raises(OutOfDiskError):
        t.set_many([("c", 1, State.RENTING), ("c", 2, State.MOVING)])
    assert full.seen and all(seen == (State.OWNING, None) for seen in full.seen)
    assert t.get("c", 1) == State.OWNING and t.get("c", 2) is None
    assert dict(t.items()) == {("c", 1): State.OWNING}
    assert StateTable(str(tmp_path)).get("c", 1) == State.OWNING
    t.set("c", 1, State.RENTING)             # the disk has room again
    assert StateTable(str(tmp_path)).get("c", 1) == State.RENTING


def test_every_state_has_a_way_forward():
    for s in State:
        assert s in ALLOWED and ALLOWED[s], s
