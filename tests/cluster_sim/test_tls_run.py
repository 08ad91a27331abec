"""The harness with mutual TLS (``tls = true``): the scenario key, ``--tls`` in replay
commands and matrix cells, and a real run of the ``join-tls`` built-in (nodes with
certificates of the run's CA and no secret, the harness's writers and readers with a
client certificate) with a crash plan on the demander."""
from __future__ import annotations

import os

import cluster_sim
from cluster_sim import CrashPlan
from cluster_sim.matrix import plan_cells, replay_command
from cluster_sim.scenario import from_dict


def test_tls_is_a_scenario_key_and_a_matrix_option() -> None:
    assert from_dict({"name": "t", "tls": True}).tls is True
    assert from_dict({"name": "t"}).tls is False
    assert cluster_sim.load_scenario("join-tls").tls is True
    assert replay_command("join", "demander.mid_replay", 1, "demander", 4, tls=True) == \
        "ferry sim run --scenario join --crash demander.mid_replay:1 --side demander --seed 4 --tls"
    cells = plan_cells(["demander.mid_replay"], ["demander"], [1, 2], tls=True)
    assert [c.tls for c in cells] == [True, True] and cells[0].replay.endswith("--tls")
    assert not plan_cells(["demander.mid_replay"], ["demander"], [1])[0].tls


def test_join_tls_with_a_crash_on_the_demander(tmp_path) -> None:
    s = cluster_sim.load_scenario("join-tls")
    r = cluster_sim.run(s, seed=2, crash=CrashPlan("demander.after_install", side="demander"),
                        workdir=str(tmp_path), keep=True)
    assert r.passed, (r.failed, r.error)
    assert r.invariants["crash_point_reached"] and r.invariants["reads_serve_last_acked"]
    assert r.acked > 0
    # every node ran with [tls] naming its own certificate, and was given no secret
    assert r.dir is not None
    for n in ("n1", "n2", "n3"):
        cfg = open(os.path.join(r.dir, f"node-{n}.toml")).read()
        assert "[tls]" in cfg and f"nodes/{n}.crt" in cfg
        assert "does not know the cluster secret" not in open(os.path.join(r.dir, f"{n}.log")).read()
        # ... and reached etcd over https as the cluster's node user (RBAC on)
        assert 'user = "ferry-default-node"' in cfg and "etcd/pki/node.crt" in cfg
        assert "control plane https://127.0.0.1:" in open(os.path.join(r.dir, f"{n}.log")).read()
    # etcd's RBAC was set up (``ferry etcd setup`` made root's password)
    assert open(os.path.join(r.dir, "etcd", "pki", "root.password")).read().strip()
