"""A run never hangs: past its time budget every process is killed and the run fails
naming the step it was stuck in."""
from __future__ import annotations

import dataclasses
import time

import cluster_sim
from cluster_sim import Event, WorkloadSpec
from cluster_sim.budget import Budget


def test_budget_names_the_step_and_what_it_was_doing() -> None:
    b = Budget(10)
    b.enter("events")
    b.note("in event 'heal', op 61 of 300")
    assert b.verdict().startswith("time budget of 10s exceeded in step 'events' (for 0s; in event 'heal'")
    assert 9 < b.left() <= 10


def test_a_run_that_cannot_settle_ends_at_its_budget_naming_settle(tmp_path) -> None:
    # n2 is killed and never restarted: the cluster cannot settle with n2 expected.
    # The budget leaves the writes after the kill room to finish (each may wait out the
    # dead node's lease and a new controller: seconds under a loaded CI machine), so the
    # run is stuck where this test means it to be: in settle.
    s = dataclasses.replace(cluster_sim.load_scenario("join"), name="stuck", nodes=("n1", "n2"),
                            workload=WorkloadSpec(ops=16, rate=50.0),
                            events=(Event(10, "kill", "n2"),), settle_timeout=300.0, time_budget=25.0,
                            roles={})
    t0 = time.monotonic()
    r = cluster_sim.run(s, seed=1, workdir=str(tmp_path))
    took = time.monotonic() - t0
    assert not r.passed and r.invariants["run_completed"] is False
    assert "time budget of 25s exceeded in step 'settle'" in r.error, r.error
    assert took < 25 + 20, took                 # the budget, the kill, the cleanup
    assert r.dir is not None                    # a failed run keeps its folder
    assert "over budget" in [m.kind for m in r.timeline.marks]
