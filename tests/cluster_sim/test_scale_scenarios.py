"""A fault scenario at 4,096 partitions: the control plane's own failure (the etcd
raft leader SIGKILLed under writes, restarted 5 s later) while 3 node processes, as
initial members, place and settle 4,096 partitions x 2 copies. Every acknowledged
write is present, no two primaries acknowledged at one counter, reads are
linearizable, and the cluster converges after the restart and settles. About 90 s on
2 cores (the settling of 8,192 copies, not the fault, is most of it)."""
from __future__ import annotations

import dataclasses
import re

import pytest

import cluster_sim
from cluster_sim import load_scenario
from cluster_sim.scenario import CacheSpec

pytestmark = pytest.mark.timeout(600)


@pytest.mark.slow
def test_etcd_leader_loss_at_4096_partitions(tmp_path) -> None:
    base = load_scenario("etcd-member-loss")
    sc = dataclasses.replace(base, name="etcd-member-loss-4096",
                             caches=(CacheSpec(partitions=4096, backups=1),),
                             initial_members=True, settle_timeout=240.0)
    r = cluster_sim.run(sc, seed=1, workdir=str(tmp_path))
    assert r.passed, (r.failed, r.error, r.dir)
    assert r.acked > 0
    for check in ("counters_unique", "reads_serve_last_acked", "acknowledged_writes_present",
                  "linearizable", "converged_after_heal"):
        assert r.invariants[check], (check, r.problems.get(check))
    kills = [m for m in r.timeline.marks if m.kind == "kill-etcd" and m.node != "@leader"]
    assert kills and re.fullmatch(r"etcd[123]", kills[-1].node)
    assert any(m.kind == "converged" for m in r.timeline.marks)
    lin = next(m for m in r.timeline.marks if m.kind == "linearizable")
    assert lin.detail.endswith(": ok")
