"""LivePlan.tasks: the partitions spread over ``parallel`` tasks and the rate limit
shared by the tasks that run at once (no Spark, no cluster)."""
from __future__ import annotations

from validation.live import LivePlan, LiveSettings


def _plan(parts: int, parallel: int, rate: float | None) -> LivePlan:
    return LivePlan(LiveSettings(seeds=["127.0.0.1:1"], parallel=parallel, rate=rate),
                    ["127.0.0.1:1"], "/dev/null",
                    [{"cache": "default", "partition": p} for p in range(parts)], {"default": parts}, 1)


def test_every_partition_lands_in_exactly_one_task():
    tasks = _plan(10, 4, None).tasks()
    got = sorted(p["partition"] for t in tasks for p in t["parts"])
    assert got == list(range(10)) and len(tasks) == 4


def test_rate_is_shared_by_the_tasks_running_at_once():
    # 4 tasks on 2 executor slots: 2 run at once, each may use half the rate
    assert {t["rate"] for t in _plan(16, 4, 100e6).tasks(slots=2)} == {50e6}
    # more slots than tasks: every task runs at once
    assert {t["rate"] for t in _plan(16, 4, 100e6).tasks(slots=8)} == {25e6}
    assert {t["rate"] for t in _plan(16, 4, 100e6).tasks()} == {25e6}


def test_fewer_partitions_than_parallel_and_no_rate():
    tasks = _plan(2, 4, None).tasks(slots=2)
    assert len(tasks) == 2 and all(t["rate"] is None for t in tasks)
