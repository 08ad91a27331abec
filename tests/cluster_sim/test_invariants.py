"""The checker on real partition files: it holds on agreeing copies and fails on each
kind of damage (a lost acknowledged write, a removed key back, owners differing, a
leftover temp file, too few OWNING copies)."""
from __future__ import annotations

import os

from checkpoint import PartitionStore
from node.assignment import partition_of

from cluster_sim.invariants import Copy, Layout, check_all
from cluster_sim.workload import Model, Op

P = 2


def _store(d: str, entries: dict[bytes, bytes]) -> None:
    s = PartitionStore.open(os.path.join(d, "caches", "default"), checkpoint_interval=None)
    for p in range(P):
        s.create_partition(p)
    for k, v in entries.items():
        s.put(partition_of(k, P), k, v)
    s.close()


def _layout(dirs: dict[str, str], want: int = 2) -> Layout:
    copies = [Copy(n, d, "default", p, "OWNING") for n, d in dirs.items() for p in range(P)]
    return Layout(copies, P, want, dirs, {})


def _setup(tmp_path, b_entries=None):
    data = {b"k%d" % i: b'{"city":"oslo","i":%d}' % i for i in range(20)}
    dirs = {"a": str(tmp_path / "a"), "b": str(tmp_path / "b")}
    _store(dirs["a"], data)
    _store(dirs["b"], data if b_entries is None else b_entries)
    m = Model()
    for k, v in data.items():
        m.ack(Op(0, 0, k, v))
    return dirs, m, data


def test_all_hold_on_agreeing_copies(tmp_path) -> None:
    dirs, m, _ = _setup(tmp_path)
    out = check_all(_layout(dirs), m)
    assert all(not v for v in out.values()), out


def test_each_kind_of_damage_is_caught(tmp_path) -> None:
    data = {b"k%d" % i: b'{"city":"oslo","i":%d}' % i for i in range(20)}
    less = dict(data)
    del less[b"k3"]
    dirs, m, _ = _setup(tmp_path, less)
    m.ack(Op(0, 1, b"k5", None))                          # acknowledged remove, still there
    open(os.path.join(dirs["b"], "caches", "default", "part-0.bin.ferry-tmp"), "w").close()
    out = check_all(_layout(dirs, want=3), m)
    assert any("b'k3'" in p and "lost" in p for p in out["acknowledged_writes_present"])
    assert any("b'k5'" in p and "came back" in p for p in out["no_removed_key_returns"])
    assert out["owners_agree"]
    assert out["no_temp_files_left"]
    assert out["owning_copies"]
