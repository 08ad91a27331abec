"""Multi-host modes: network namespaces with veth pairs (root, permitted kernel) and
containers (a Docker engine: DOCKER_HOST, or a private dockerd the `docker_engine`
fixture starts); each skips with the reason its prerequisite is missing.

Container mode runs the built-in `join` and `kill-restart` with every node in its own
container under a memory limit, and the faults only containers give: the controller
frozen by `docker pause` (`pause`), and a node joining with its data on a throttled
disk (`slow-disk-join`). Each checks that its fault landed."""
from __future__ import annotations

import os
from dataclasses import replace

import pytest

import cluster_sim
from cluster_sim import containers, loopdisk, netns
from cluster_sim.drivers.container import SCENARIOS, ContainerMode

NETNS_OK, NETNS_WHY = netns.permitted()


@pytest.mark.slow
@pytest.mark.skipif(not NETNS_OK, reason=f"netns mode: {NETNS_WHY}")
def test_join_with_each_node_in_its_own_namespace(tmp_path) -> None:
    s = cluster_sim.load_scenario("join")
    with netns.Netns(s.all_nodes()) as net:
        r = cluster_sim.run(s, seed=1, workdir=str(tmp_path), net=net)
    assert r.passed, (r.problems, r.error)


def test_container_probe_gives_a_reason() -> None:
    ok, why = containers.available()
    assert ok or why


def _run_in_containers(engine: containers.Engine, name: str, tmp_path,
                       seed: int = 1, tls: bool = False) -> cluster_sim.RunResult:
    scenario, spec = SCENARIOS[name]
    if tls:
        scenario = replace(scenario, tls=True)
    with ContainerMode(engine, spec) as mode:
        r = cluster_sim.run(scenario, seed=seed, workdir=str(tmp_path), net=mode, keep=tls)
    assert r.passed, ({k: v for k, v in r.problems.items() if v}, r.error, r.dir)
    starts = [m for m in r.timeline.marks if m.kind in ("start", "restart")]
    assert starts and not mode.procs.keys() - set(scenario.all_nodes())
    # every life of every node was a container, and none is left
    assert all(p.history and p.lives == len(p.history) for p in mode.procs.values())
    if tls:     # each node's own credentials, read-only, and never a CA's key
        for node, p in mode.procs.items():
            names = {os.path.basename(h): m for h, _, m in p.box.mounts}
            assert names[f"{node}.key"] == "ro" and names["node.key"] == "ro"
            assert "ca.key" not in names and not any(n.endswith(".key") and n not in
                                                      (f"{node}.key", "node.key") for n in names)
    client = engine.client()
    try:
        assert not client.containers.list(all=True, filters={"label": f"org.ferry.sim={mode.tag}"})
    finally:
        client.close()
    return r


def test_join_in_containers(docker_engine, tmp_path) -> None:
    r = _run_in_containers(docker_engine, "join", tmp_path)
    assert [m.node for m in r.timeline.marks if m.kind == "join"] == ["n3"]


@pytest.mark.slow
def test_kill_restart_in_containers_with_tls(docker_engine, tmp_path) -> None:
    """Mutual TLS in containers: each container sees its own certificate, key and the
    CA's certificate (never a CA key) and the etcd node role's files, read-only; the
    nodes reach etcd over https with RBAC."""
    r = _run_in_containers(docker_engine, "kill-restart", tmp_path, tls=True)
    assert r.dir is not None
    for n in ("n1", "n2", "n3"):
        assert "control plane https://127.0.0.1:" in open(os.path.join(r.dir, f"{n}.log")).read()
    kinds = [(m.node, m.kind) for m in r.timeline.marks]
    assert ("n2", "kill") in kinds and kinds.count(("n2", "restart")) >= 1


def test_kill_restart_in_containers(docker_engine, tmp_path) -> None:
    r = _run_in_containers(docker_engine, "kill-restart", tmp_path)
    kinds = [(m.node, m.kind) for m in r.timeline.marks]
    assert ("n2", "kill") in kinds and kinds.count(("n2", "restart")) >= 1


@pytest.mark.slow
def test_pause_of_the_controller_in_containers(docker_engine, tmp_path) -> None:
    r = _run_in_containers(docker_engine, "pause", tmp_path)
    marks = {m.kind: m for m in r.timeline.marks}
    paused, thawed = marks["paused"], marks["unpaused"]
    assert paused.node == marks["resolved"].node          # the controller was frozen ...
    assert marks["lease expired"].node == paused.node     # ... long enough to lose its lease
    assert thawed.t - paused.t >= 5.5
    assert r.invariants["pause_lease_expired"] and r.invariants["converged_after_unpause"]


@pytest.mark.slow
@pytest.mark.skipif(not loopdisk.permitted()[0], reason=f"slow disk: {loopdisk.permitted()[1]}")
def test_slow_disk_join_in_containers(docker_engine, tmp_path) -> None:
    r = _run_in_containers(docker_engine, "slow-disk-join", tmp_path)
    assert r.invariants["slow_disk_effective"]
    written = [m for m in r.timeline.marks if m.kind == "slow disk written"]
    assert written and written[0].node == "n3" and not written[0].detail.startswith("0 ")
