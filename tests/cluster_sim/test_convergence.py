"""What counts as converged: one map on every node, every node a live member, no move,
the ideal owners OWNING, in sync and led by the ideal primary; a heal's clock."""
from __future__ import annotations

import time

from cluster_sim.drivers.convergence import ConvergenceWatch, map_problems, settled_problems
from cluster_sim.timeline import Timeline
from node.cluster_map import ClusterMap, Member, PartRecord
from node.config import CacheConfig


def _doc(**part: object) -> dict:
    p = {"cache": "default", "partition": 0, "states": {"n1": "OWNING", "n2": "OWNING"},
         "primary": "n1", "owners": ["n1", "n2"], "in_sync": ["n2", "n1"], "epoch": 4} | part
    return {"nodes": [{"id": n, "alive": True, "leaving": False} for n in ("n1", "n2")],
            "moves": [], "partitions": [p], "controller": "n1"}


def test_settled_needs_owners_owning_in_sync_and_the_ideal_primary() -> None:
    assert settled_problems(_doc(), {"n1", "n2"}, 1) == []
    assert "in_sync ['n1'] != owners" in settled_problems(_doc(in_sync=["n1"]), {"n1", "n2"}, 1)[0]
    assert "primary n2" in settled_problems(_doc(primary="n2"), {"n1", "n2"}, 1)[0]
    assert "OWNING on ['n1']" in settled_problems(_doc(states={"n1": "OWNING", "n2": "MOVING"}),
                                                  {"n1", "n2"}, 1)[0]
    assert "live members" in settled_problems(_doc(), {"n1", "n2", "n3"}, 1)[0]
    assert settled_problems(None, {"n1"}, 1) == ["no node answers cluster status"]


def _map(isr: tuple[str, ...], epoch: int, revision: int) -> ClusterMap:
    m = ClusterMap({"default": CacheConfig("default", partitions=1, backups=1)})
    m.epoch = revision
    m.controller = "n1"
    m.members = {n: Member(n, f"127.0.0.1:{i}", i) for i, n in enumerate(("n1", "n2"))}
    m.parts["default"][0] = PartRecord("n1", isr, epoch)
    m.states["default"][0] = {"n1": "OWNING", "n2": "OWNING"}
    return m


def test_one_map_ignores_the_revision_but_not_the_in_sync_set() -> None:
    a, b = _map(("n1", "n2"), 4, 100), _map(("n2", "n1"), 4, 117)   # reports moved the revision
    assert map_problems({"n1": a, "n2": b}) == []
    c = _map(("n1",), 5, 117)
    assert "maps differ: n2 vs n1: default/0" in map_problems({"n1": a, "n2": c})[0]
    assert map_problems({"n1": a, "n2": None}) == ["no map from n2"]


def test_convergence_watch_times_the_heal_and_flags_a_late_one() -> None:
    state = {"ok": False}
    w = ConvergenceWatch(lambda: [] if state["ok"] else ["not yet"], within=0.3, timeline=Timeline())
    w.start("heal")
    time.sleep(0.5)
    state["ok"] = True
    time.sleep(1.6)
    assert len(w.seconds) == 1 and w.seconds[0] >= 0.4
    assert len(w.problems) == 1 and "not converged" in w.problems[0] and "converged only" in w.problems[0]
    quick = ConvergenceWatch(lambda: [], within=5.0, timeline=Timeline())
    quick.start("heal")
    time.sleep(1.5)
    assert quick.problems == [] and quick.seconds and quick.seconds[0] < 0.5
