"""Real runs: a node crashing at a move's point passes every invariant, the crash is
marked and the point reached; ``ferry sim run --json`` prints the schema; a node whose
port was taken starts on another with its crash plan still armed."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import cluster_sim
from cluster_sim import CrashPlan
from cluster_sim.matrix import replay_command


@pytest.mark.slow
def test_join_crash_after_install_on_the_demander(tmp_path) -> None:
    s = cluster_sim.load_scenario("join")
    r = cluster_sim.run(s, seed=3, crash=CrashPlan("demander.after_install", side="demander"),
                        workdir=str(tmp_path))
    assert r.passed, (r.failed, r.error)
    assert r.invariants["crash_point_reached"] and "demander.after_install" in r.reached
    assert [m.node for m in r.timeline.crashes()] == ["n3"]
    assert r.acked > 0
    assert r.to_json() == {"passed": True, "invariants": r.invariants, "seed": 3}


@pytest.mark.slow
def test_cli_run_json(tmp_path, py_env) -> None:
    out = subprocess.run([sys.executable, "-m", "ferry", "sim", "run", "--scenario", "slow-join",
                          "--crash", "supplier.after_snapshot", "--side", "supplier", "--seed", "2",
                          "--json", "--workdir", str(tmp_path)],
                         capture_output=True, text=True, env=py_env, timeout=300)
    doc = json.loads(out.stdout)
    assert set(doc) == {"passed", "invariants", "seed"} and doc["seed"] == 2
    assert doc["passed"] is True and doc["invariants"]["crash_point_reached"] is True
    assert out.returncode == 0, out.stderr[-2000:]


def test_cli_run_refuses_an_unknown_point(py_env) -> None:
    bad = subprocess.run([sys.executable, "-m", "ferry", "sim", "run", "--scenario", "join",
                          "--crash", "nowhere.point"], capture_output=True, text=True, env=py_env,
                         timeout=60)
    assert bad.returncode != 0 and "unknown" in bad.stderr


def test_replay_command_is_one_line() -> None:
    assert replay_command("slow-join", "supplier.mid_send", 2, "supplier", 9) == \
        "ferry sim run --scenario slow-join --crash supplier.mid_send:2 --side supplier --seed 9"


@pytest.mark.slow
def test_first_node_killed_mid_eviction_resumes_from_the_members_map(tmp_path) -> None:
    # n1 (the first node) SIGKILLed while evicting restarts within the failure
    # timeout; it used to bootstrap at an older map epoch than the members held, and the
    # primary hand-offs of the partitions it gave away never completed.
    s = cluster_sim.load_scenario("join")
    r = cluster_sim.run(s, seed=1, crash=CrashPlan("owner.mid_eviction", side="third"),
                        workdir=str(tmp_path))
    assert r.passed, (r.failed, r.error)
    assert [m.node for m in r.timeline.crashes()] == ["n1"]


@pytest.mark.slow
def test_node_whose_port_was_taken_starts_on_another(tmp_path, monkeypatch) -> None:
    # free_port() releases the port it found; on a busy machine someone may take it
    # before the node binds it. Here n3's port is held by a listening socket; the retry
    # must keep n3's crash plan armed, so the crash point is still reached.
    import socket

    from cluster_sim.drivers import cluster as cluster_mod
    from node.listen_ports import free_port
    taken = socket.create_server(("127.0.0.1", 0))
    calls = iter([free_port(), free_port(), taken.getsockname()[1]])
    monkeypatch.setattr(cluster_mod, "free_port", lambda: next(calls, None) or free_port())
    try:
        r = cluster_sim.run(cluster_sim.load_scenario("join"), seed=4, workdir=str(tmp_path),
                            crash=CrashPlan("demander.after_demand", side="demander"))
    finally:
        taken.close()
    assert r.passed, (r.failed, r.error)
    assert [m.node for m in r.timeline.marks if m.kind == "port retry"] == ["n3"]
    assert r.invariants["crash_point_reached"] and [m.node for m in r.timeline.crashes()] == ["n3"]


class _DiesBetweenLooks:
    """A node's process as the harness sees it when its armed crash point fires between
    the driver's two looks in one poll: alive at the first, SIGKILLed at the second."""

    def __init__(self) -> None:
        self.looks = 0
        self.returncode: int | None = None

    def poll(self) -> int | None:
        self.looks += 1
        if self.looks > 1:
            self.returncode = -9
        return self.returncode


def test_a_crash_noticed_at_the_second_look_of_a_poll_is_a_crash(tmp_path) -> None:
    """The crash plan's SIGKILL can land between the base driver's look (crash
    detection) and the cluster driver's (a node that exited by itself is an error): the
    second look counts it as the crash, it does not fail the run."""
    from cluster_sim.drivers.cluster import ClusterDriver
    from cluster_sim.procs import Proc

    class _Marks:
        def __init__(self) -> None:
            self.marks: list[tuple[str, ...]] = []

        def mark(self, *args: str) -> None:
            self.marks.append(args)

    d = ClusterDriver.__new__(ClusterDriver)
    p = Proc("n1", ["true"], str(tmp_path / "n1.log"), crash="wal.after_sync:30")
    p.popen = _DiesBetweenLooks()  # type: ignore[assignment]
    d.procs, d.crashed, d._restart_at = {"n1": p}, [], {}
    d.timeline, d.crash_spec = _Marks(), "wal.after_sync:30"     # type: ignore[assignment]
    d.poll()                      # the old poll raised ProcessError: "n1 exited with status -9"
    assert d.crashed == ["n1"] and p.crashed and "n1" in d._restart_at
    d.poll()                      # noticed once
    assert d.crashed == ["n1"]
