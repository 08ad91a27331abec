"""Multi-host modes: network namespaces with veth pairs (root, permitted kernel; with
tls etcd serves https on a certificate naming the nodes' gateways) and containers (a Docker engine: DOCKER_HOST, or a private dockerd the `docker_engine`
fixture starts); each skips with the reason its prerequisite is missing.

Container mode runs the built-in `join` and `kill-restart` with every node in its own
container under a memory limit, and the faults only containers give: the controller
frozen by `docker pause` (`pause`), and a node joining with its data on a throttled
disk (`slow-disk-join`). Each checks that its fault landed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest

import cluster_sim
from cluster_sim import containers, loopdisk, netns
from cluster_sim.drivers import ClusterDriver
from cluster_sim.drivers.container import SCENARIOS, ContainerMode
from node.certs import describe

NETNS_OK, NETNS_WHY = netns.permitted()


@pytest.mark.slow
@pytest.mark.skipif(not NETNS_OK, reason=f"netns mode: {NETNS_WHY}")
def test_join_with_each_node_in_its_own_namespace(tmp_path) -> None:
    s = cluster_sim.load_scenario("join")
    with netns.Netns(s.all_nodes()) as net:
        r = cluster_sim.run(s, seed=1, workdir=str(tmp_path), net=net)
    assert r.passed, (r.failed, r.error)


def test_etcd_server_certificate_names_the_gateways(tmp_path) -> None:
    """What the nodes in namespaces dial (their gateways) is in etcd's server
    certificate besides loopback; a certificate made for other addresses is issued again."""
    from node.etcdserver import EtcdCluster
    EtcdCluster(str(tmp_path), tls=True, server_ips=("10.77.1.1", "10.77.2.1"))
    crt = os.path.join(str(tmp_path), "pki", "etcd-server.crt")
    assert describe(crt)["ips"] == ["127.0.0.1", "::1", "10.77.1.1", "10.77.2.1"]
    assert describe(crt)["dns"] == ["localhost"]
    EtcdCluster(str(tmp_path), tls=True, server_ips=("10.77.3.1",))
    assert describe(crt)["ips"] == ["127.0.0.1", "::1", "10.77.3.1"]
    EtcdCluster(str(tmp_path), tls=True)            # loopback is always named: kept
    assert describe(crt)["ips"] == ["127.0.0.1", "::1", "10.77.3.1"]


def test_sim_run_netns_refuses_what_it_cannot_run() -> None:
    from click.testing import CliRunner
    from cluster_sim.cli import SKIPPED_EXIT, sim
    r = CliRunner().invoke(sim, ["run", "--scenario", "net-cut", "--netns", "--tls"])
    assert r.exit_code == SKIPPED_EXIT and "loopback only" in r.output, r.output
    r = CliRunner().invoke(sim, ["run", "--scenario", "join", "--netns", "--containers"])
    assert r.exit_code == 2 and "pick one" in r.output, r.output


# Run in a node's namespace: a plain-http request to its gateway proxy in front of etcd,
# and an https one with etcd's CA and the node role's certificate (hostname checked:
# the proxy's address must be in etcd's server certificate)
_PROBE = """
import json, ssl, sys, urllib.request
url, ca, crt, key = sys.argv[1:5]
out = {}
def get(u, ctx=None):
    try:
        with urllib.request.urlopen(u + "/health", timeout=5, context=ctx) as r:
            return r.status, r.read().decode()[:200]
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"[:200]
out["http"] = get(url.replace("https://", "http://"))
ctx = ssl.create_default_context(cafile=ca)
ctx.load_cert_chain(crt, key)
out["https"] = get(url, ctx)
print(json.dumps(out))
"""


def _probe_etcd(driver: Any) -> dict[str, Any]:
    """From inside n1's namespace, what its etcd endpoint answers to http and https."""
    url = driver.control_plane_for("n1")[0]
    a = driver.etcd_access
    assert a is not None, "etcd runs without TLS"
    r = subprocess.run([*driver.net.prefix("n1"), sys.executable, "-c", _PROBE, url, a.ca, a.cert, a.key],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return {"url": url, **json.loads(r.stdout)}


@pytest.mark.skipif(not NETNS_OK, reason=f"netns mode: {NETNS_WHY}")
def test_kill_restart_in_namespaces_with_tls(tmp_path, monkeypatch) -> None:
    """With tls in network namespaces etcd serves https only, with client certificates
    and RBAC, on a server certificate that names every node's gateway (where its
    control proxies listen); the nodes reach it with the node role's credentials."""
    probes: dict[str, Any] = {}
    settle = ClusterDriver.after_settle

    def probing(self: ClusterDriver) -> None:
        probes.update(_probe_etcd(self))
        settle(self)
    monkeypatch.setattr(ClusterDriver, "after_settle", probing)
    s = replace(cluster_sim.load_scenario("kill-restart"), tls=True)
    with netns.Netns(s.all_nodes()) as net:
        r = cluster_sim.run(s, seed=3, workdir=str(tmp_path), net=net, keep=True)
        gateways = {net.gateway(n) for n in s.all_nodes()}
    assert r.passed, ({k: v for k, v in r.problems.items() if v}, r.error, r.dir)
    assert r.dir is not None
    assert probes["url"].startswith("https://10.77.1.1:"), probes
    assert probes["https"][0] == 200 and '"health":"true"' in probes["https"][1], probes
    assert probes["http"][0] is None, probes       # plain http is refused
    assert gateways <= set(describe(os.path.join(r.dir, "etcd", "pki", "etcd-server.crt"))["ips"])
    base = open(os.path.join(r.dir, "node.toml")).read()
    assert 'user = "ferry-default-node"' in base and "etcd/pki/ca.crt" in base
    for n in s.all_nodes():
        log = open(os.path.join(r.dir, f"{n}.log")).read()
        assert f"control plane https://{net.gateway(n)}:" in log
        assert "control plane http://" not in log
    kinds = [(m.node, m.kind) for m in r.timeline.marks]
    assert ("n2", "kill") in kinds and ("n2", "restart") in kinds


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
