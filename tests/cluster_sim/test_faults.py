"""Disk full on a joining demander (a tmpfs the harness mounts) and a node cut off from
its peers by the RPC proxies (etcd still reaching it): the fault lands, is seen, and
the cluster converges."""
from __future__ import annotations

import dataclasses
import os
import re

import pytest

import cluster_sim
from cluster_sim import ScenarioError, load_scenario
from cluster_sim.diskfull import FILLER, Tmpfs, free_bytes, permitted
from cluster_sim.scenario import from_dict

TMPFS_OK, TMPFS_WHY = permitted()
needs_tmpfs = pytest.mark.skipif(not TMPFS_OK, reason=TMPFS_WHY or "tmpfs permitted")


@needs_tmpfs
def test_tmpfs_fill_free_and_unmount_keeps_the_files(tmp_path) -> None:
    fs = Tmpfs(str(tmp_path / "d"), 8)
    fs.mount()
    try:
        with open(tmp_path / "d" / "keep.txt", "w") as f:
            f.write("node data")
        fs.fill(2)
        assert 1 << 20 <= free_bytes(fs.path) <= 3 << 20
        fs.free()
        assert free_bytes(fs.path) > 6 << 20
    finally:
        fs.unmount()
    assert not os.path.ismount(fs.path)
    assert open(tmp_path / "d" / "keep.txt").read() == "node data"
    assert not os.path.exists(tmp_path / "d" / FILLER)


def test_fault_events_are_validated() -> None:
    base = {"name": "x", "nodes": ["n1"], "events": [{"at": 1, "action": "join", "node": "n2"}]}
    with pytest.raises(ScenarioError, match="needs disk"):
        from_dict(base | {"events": base["events"] + [{"at": 2, "action": "fill", "node": "n2"}]})
    with pytest.raises(ScenarioError, match="needs proxy"):
        from_dict(base | {"events": base["events"] + [{"at": 2, "action": "cut", "node": "n2"}]})
    with pytest.raises(ScenarioError, match="free_mib"):
        from_dict(base | {"disk": {"node": "n2", "size_mib": 8, "free_mib": 8}})
    with pytest.raises(ScenarioError, match="disk.node"):
        from_dict(base | {"disk": {"node": "n9"}})
    with pytest.raises(ScenarioError, match="unknown key"):
        from_dict(base | {"disk": {"node": "n2", "bytes": 3}})
    ok = from_dict(base | {"disk": {"node": "n2"},
                           "events": base["events"] + [{"at": 2, "action": "fill", "node": "n2"}]})
    assert ok.disk is not None and ok.disk.free_mib < 64   # below the transfer's margin


@needs_tmpfs
@pytest.mark.slow
def test_disk_full_demander_move_fails_cleanly_then_converges(tmp_path) -> None:
    r = cluster_sim.run(load_scenario("disk-full"), seed=1, workdir=str(tmp_path), keep=True)
    assert r.passed, (r.failed, r.error)
    # the move really failed for lack of space, was checked clean, and then succeeded
    assert r.invariants["disk_full_move_failed_cleanly"]
    marks = [m.kind for m in r.timeline.marks]
    assert "disk full" in marks and "move refused" in marks
    log = open(os.path.join(r.dir, "n3.log")).read()
    assert "bytes free for partition" in log and "MOVING -> OWNING" in log
    assert not os.path.ismount(os.path.join(r.dir, "data", "n3"))   # unmounted, files kept
    assert os.path.exists(os.path.join(r.dir, "data", "n3", "states.json"))


@needs_tmpfs
@pytest.mark.slow
def test_disk_full_mid_transfer_loses_nothing_and_converges(tmp_path) -> None:
    """The disk fills to the last byte while a transfer is writing its file (past the
    free-disk check): the transfer fails with the clear out-of-space error, the temp
    WAL's appends fail too (the primary's replication to the MOVING copy), nothing
    acknowledged is lost, and once space is freed the moves converge."""
    r = cluster_sim.run(load_scenario("disk-full-mid-transfer"), seed=1, workdir=str(tmp_path), keep=True)
    assert r.passed, (r.failed, r.error)
    marks = [m.kind for m in r.timeline.marks]
    assert marks.index("transfer running") < marks.index("disk full") < marks.index("move refused")
    log = open(os.path.join(r.dir, "n3.log")).read()
    # the transfer that was writing ran out of space in the middle of its file
    assert re.search(r"transfer failed at stage receive, partition \d+, .*: out of disk space "
                     r"writing .*part-\d+\.bin\.ferry-tmp .*No space left on device", log)
    assert "MOVING -> OWNING" in log
    assert r.invariants["acknowledged_writes_present"] and r.invariants["no_temp_files_left"]
    # a replication the full disk refused is one clear WARNING (once a minute per cause),
    # not a traceback per refused request
    assert "handler 'replicate' failed" not in log
    assert any("stage=storage disk full on" in ln for ln in log.splitlines()), log[-3000:]


def test_mid_transfer_disk_spec_and_transfer_rate_are_validated() -> None:
    base = {"name": "x", "nodes": ["n1", "n2"], "events": [{"at": 2, "action": "fill", "node": "n2"}]}
    with pytest.raises(ScenarioError, match="free_mib"):
        from_dict(base | {"disk": {"node": "n2", "free_mib": 0}})          # 0 only mid-transfer
    ok = from_dict(base | {"disk": {"node": "n2", "free_mib": 0, "mid_transfer": True},
                           "transfer_rate": 65536})
    assert ok.disk is not None and ok.disk.mid_transfer and ok.transfer_rate == 65536
    with pytest.raises(ScenarioError, match="transfer_rate"):
        from_dict(base | {"disk": {"node": "n2"}, "transfer_rate": -1})


@pytest.mark.slow
def test_node_cut_from_its_peers_stays_a_member_and_resyncs_after_heal(tmp_path) -> None:
    # n3 is cut from its peers only: etcd still reaches it, so its lease lives on (no
    # "lease expired"); replication to and from it fails, the primaries on both sides
    # shrink their in-sync sets through the controller; healed, n3's copies resync and
    # the cluster converges within 3 lease TTLs with every invariant.
    s = dataclasses.replace(load_scenario("net-cut"), settle_timeout=25.0)
    r = cluster_sim.run(s, seed=1, workdir=str(tmp_path), keep=True)
    assert r.passed, (r.failed, r.error)
    kinds = [m.kind for m in r.timeline.marks]
    assert "cut" in kinds and "lease expired" not in kinds and "converged" in kinds
    logs = "".join(open(os.path.join(r.dir, f"{n}.log")).read() for n in ("n1", "n2", "n3"))
    assert re.search(r"in-sync \[[^]]*\] -> \[[^]]*\] at n\d's request .*removed \['n3'\]|"
                     r"removed \['n[12]'\]", logs)


def test_disk_full_without_mount_permission_is_skipped_with_the_reason(tmp_path, monkeypatch) -> None:
    from cluster_sim import diskfull
    monkeypatch.setattr(diskfull, "permitted", lambda: (False, "mounting a tmpfs is not permitted here: EPERM"))
    with pytest.raises(diskfull.SimSkipped, match="need a tmpfs: mounting a tmpfs is not permitted"):
        cluster_sim.run(load_scenario("disk-full"), seed=1, workdir=str(tmp_path))
    assert os.listdir(tmp_path) == []            # no run folder left behind
