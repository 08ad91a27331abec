"""Multi-host modes: network namespaces with veth pairs (root, permitted kernel) and
containers (a Docker engine); each skips with the reason its prerequisite is missing."""
from __future__ import annotations

import pytest

import cluster_sim
from cluster_sim import containers, netns

NETNS_OK, NETNS_WHY = netns.permitted()
DOCKER_OK, DOCKER_WHY = containers.available()


@pytest.mark.slow
@pytest.mark.skipif(not NETNS_OK, reason=f"netns mode: {NETNS_WHY}")
def test_join_with_each_node_in_its_own_namespace(tmp_path) -> None:
    s = cluster_sim.load_scenario("join")
    with netns.Netns(s.all_nodes()) as net:
        r = cluster_sim.run(s, seed=1, workdir=str(tmp_path), net=net)
    assert r.passed, (r.problems, r.error)


@pytest.mark.skipif(not DOCKER_OK, reason=f"container mode: {DOCKER_WHY}")
def test_container_mode_reports_what_it_lacks() -> None:
    with pytest.raises(cluster_sim.SimError, match="container mode"):
        containers.require()


def test_container_probe_gives_a_reason() -> None:
    ok, why = containers.available()
    assert ok or why
