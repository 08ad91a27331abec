"""Real runs: the file move with a crash on the demander passes every invariant, the
crash is marked and the point reached; ``ferry sim run --json`` prints the schema; a
cut link mid-transfer heals and the transfer resumes from its verified chunks."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

import cluster_sim
from cluster_sim import CrashPlan
from cluster_sim.matrix import replay_command


def test_file_move_crash_after_install_on_the_demander(tmp_path) -> None:
    s = cluster_sim.load_scenario("file-move")
    r = cluster_sim.run(s, seed=3, crash=CrashPlan("demander.after_install", side="demander"),
                        workdir=str(tmp_path))
    assert r.passed, (r.problems, r.error)
    assert r.invariants["crash_point_reached"] and "demander.after_install" in r.reached
    assert [m.node for m in r.timeline.crashes()] == ["demander"]
    assert r.acked > 0
    assert r.to_json() == {"passed": True, "invariants": r.invariants, "seed": 3}


def test_cli_run_json_and_failing_exit(tmp_path, py_env) -> None:
    out = subprocess.run([sys.executable, "-m", "ferry", "sim", "run", "--scenario", "file-move",
                          "--crash", "supplier.after_snapshot", "--side", "supplier", "--seed", "2",
                          "--json", "--workdir", str(tmp_path)],
                         capture_output=True, text=True, env=py_env, timeout=120)
    doc = json.loads(out.stdout)
    assert set(doc) == {"passed", "invariants", "seed"} and doc["seed"] == 2
    assert doc["passed"] is True and out.returncode == 0, out.stderr[-2000:]
    bad = subprocess.run([sys.executable, "-m", "ferry", "sim", "run", "--scenario", "file-move",
                          "--crash", "nowhere.point"], capture_output=True, text=True, env=py_env)
    assert bad.returncode != 0 and "unknown" in bad.stderr


def test_replay_command_is_one_line() -> None:
    assert replay_command("file-move", "supplier.mid_send", 2, "supplier", 9) == \
        "ferry sim run --scenario file-move --crash supplier.mid_send:2 --side supplier --seed 9"


@pytest.mark.slow
def test_cut_link_mid_transfer_resumes_after_heal(tmp_path) -> None:
    r = cluster_sim.run(cluster_sim.load_scenario("file-move-cut"), seed=1, workdir=str(tmp_path),
                        keep=True)
    assert r.passed, (r.problems, r.error)
    log = open(f"{r.dir}/demander.log").read()
    assert "trying another owner" in log                       # the cut broke a transfer
    reused = [int(x) for x in re.findall(r"reused=(\d+)", log)]
    assert any(x > 0 for x in reused), log[-3000:]             # ... which resumed, not restarted


@pytest.mark.slow
def test_first_node_killed_mid_eviction_resumes_from_the_members_map(tmp_path) -> None:
    # n1 (the first node) SIGKILLed while evicting restarts within the failure
    # timeout; it used to bootstrap at an older map epoch than the members held, and the
    # primary hand-offs of the partitions it gave away never completed.
    s = cluster_sim.load_scenario("join")
    r = cluster_sim.run(s, seed=1, crash=CrashPlan("owner.mid_eviction", side="third"),
                        workdir=str(tmp_path))
    assert r.passed, (r.problems, r.error)
    assert [m.node for m in r.timeline.crashes()] == ["n1"]


@pytest.mark.slow
def test_node_whose_port_was_taken_starts_on_another(tmp_path, monkeypatch) -> None:
    # free_port() releases the port it found; on a busy machine someone may take it
    # before the node binds it. Here n3's port is held by a listening socket.
    import socket

    from cluster_sim.drivers import cluster as cluster_mod
    from cluster_sim.procs import free_port
    taken = socket.create_server(("127.0.0.1", 0))
    calls = iter([free_port(), free_port(), taken.getsockname()[1]])
    monkeypatch.setattr(cluster_mod, "free_port", lambda: next(calls, None) or free_port())
    try:
        r = cluster_sim.run(cluster_sim.load_scenario("join"), seed=4, workdir=str(tmp_path))
    finally:
        taken.close()
    assert r.passed, (r.problems, r.error)
    assert [m.node for m in r.timeline.marks if m.kind == "port retry"] == ["n3"]


def test_file_move_supplier_whose_port_was_taken_starts_on_another(tmp_path, monkeypatch) -> None:
    # The same race for the file-move driver (seen once in CI: the matrix cell
    # wal.after_sync:30 on the supplier failed with EADDRINUSE before "serving").
    # Here the supplier's control port is held by a listening socket; the retry must
    # keep the crash plan armed, so the crash point is still reached.
    import socket

    from cluster_sim.drivers import filemove as filemove_mod
    from cluster_sim.procs import free_port
    taken = socket.create_server(("127.0.0.1", 0))
    calls = iter([free_port(), taken.getsockname()[1]])
    monkeypatch.setattr(filemove_mod, "free_port", lambda: next(calls, None) or free_port())
    try:
        r = cluster_sim.run(cluster_sim.load_scenario("file-move"), seed=1,
                            crash=CrashPlan("wal.after_sync", side="supplier", nth=30),
                            workdir=str(tmp_path))
    finally:
        taken.close()
    assert r.passed, (r.problems, r.error)
    assert [m.node for m in r.timeline.marks if m.kind == "port retry"] == ["supplier"]
    assert "wal.after_sync" in r.reached
