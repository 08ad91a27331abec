"""The matrix: every crash point x the side it hits x K seeds, one run per cell.

:data:`PLAN` says which scenario reaches a point on which side. Every scenario runs
real ``ferry node`` processes, so every cell crashes the node's own code:

- ``join`` (n3 joins n1 and n2): the demander's points of a file move on n3;
  ``owner.mid_eviction`` on n2 and n1, which give copies away;
- ``slow-join`` (n1 alone with a preload, n2 joins, 256 KiB/s transfers under paced
  writes): the supplier's points on n1, which supplies every move; pages are
  overwritten mid-send, so ``supplier.mid_preimages`` is reached; the WAL and
  checkpointer points on n1 and n2 (both take writes for seconds after the join);
- ``join-stream-index`` (``join`` with ``[rebalance] stream_index`` on):
  ``demander.mid_stream_index`` on n3;
- ``join-ship-index`` (``join`` with ``[rebalance] index_transfer = "ship"``):
  ``demander.mid_index_receive`` and ``demander.mid_index_load`` on n3;
- ``restart-catchup`` (n2 SIGKILLed and back, its copies catch up by delta fetches):
  the demander's delta points on n2; ``pair-catchup`` (the same with two nodes, so
  n1 supplies every delta): ``supplier.mid_delta_send`` on n1;
- ``kill-restart``: the WAL and checkpointer points on the third node (n3).

``--scenario NAME`` (:func:`plan_cells`) runs every point on each role of NAME instead;
``--tls`` runs every cell with ``tls = true`` (the nodes' links mutual TLS).

The Nth hit a crash fires on comes from the seed (:func:`default_nth`) for points hit
many times per run, so seeds explore different moments; a failing cell prints the one
command that replays it exactly.

Fault cells (:data:`FAULTS`: partitions, the controller cut off or killed, etcd members
lost, the whole control plane down) carry no crash plan: the fault is the scenario's
events. Their point is ``none`` and their side ``-``; they run once per seed.
"""
from __future__ import annotations

import random
import shlex
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from faults import POINTS

from .builtins import FAULT_SCENARIOS, load
from .runner import RunResult, run
from .scenario import SIDES, CrashPlan

FAULTS: tuple[str, ...] = FAULT_SCENARIOS
NO_CRASH = "none"          # the point of a fault cell

_DURABLE = {"supplier": "slow-join", "demander": "slow-join", "third": "kill-restart"}
PLAN: dict[str, dict[str, str]] = {
    "wal.before_sync": _DURABLE,
    "wal.after_sync": _DURABLE,
    "checkpoint.mid_write": _DURABLE,
    "supplier.after_snapshot": {"supplier": "slow-join"},
    "supplier.mid_send": {"supplier": "slow-join"},
    "supplier.mid_preimages": {"supplier": "slow-join"},
    "supplier.mid_delta_send": {"supplier": "pair-catchup"},
    "demander.mid_base_copy": {"demander": "restart-catchup"},
    "demander.mid_delta_receive": {"demander": "restart-catchup"},
    "demander.after_demand": {"demander": "join"},
    "demander.mid_receive": {"demander": "join"},
    "demander.mid_stream_index": {"demander": "join-stream-index"},
    "demander.mid_index_receive": {"demander": "join-ship-index"},
    "demander.mid_index_load": {"demander": "join-ship-index"},
    "demander.before_install": {"demander": "join"},
    "demander.after_install": {"demander": "join"},
    "demander.mid_index_rebuild": {"demander": "join"},
    "demander.mid_replay": {"demander": "join"},
    "demander.before_owning": {"demander": "join"},
    "demander.after_owning": {"demander": "join"},
    "owner.mid_eviction": {"supplier": "join", "third": "join"},
}

# Points hit many times in a run: the seed picks which hit crashes (1..max).
MANY_HITS = {"wal.before_sync": 30, "wal.after_sync": 30, "checkpoint.mid_write": 2,
             "supplier.mid_send": 3, "demander.mid_receive": 3}


def default_nth(point: str, seed: int) -> int:
    hi = MANY_HITS.get(point, 1)
    return random.Random(f"nth:{point}:{seed}").randint(1, hi) if hi > 1 else 1


def replay_command(scenario: str, point: str, nth: int, side: str, seed: int, tls: bool = False) -> str:
    flag = " --tls" if tls else ""
    if point == NO_CRASH:
        return f"ferry sim run --scenario {shlex.quote(scenario)} --seed {seed}{flag}"
    return ("ferry sim run --scenario " + shlex.quote(scenario) +
            f" --crash {point}:{nth} --side {side} --seed {seed}{flag}")


@dataclass
class Cell:
    point: str
    side: str
    seed: int
    scenario: str
    nth: int
    passed: bool = False
    seconds: float = 0.0
    result: RunResult | None = None
    tls: bool = False           # the scenario with tls = true (mutual TLS between the nodes)

    @property
    def replay(self) -> str:
        return replay_command(self.scenario, self.point, self.nth, self.side, self.seed, self.tls)

    def to_json(self) -> dict[str, Any]:
        """One cell of ``ferry sim matrix --json`` (exactly these keys; docs/harness.md, "CLI")."""
        return {"point": self.point, "side": self.side, "seed": self.seed, "passed": self.passed,
                "seconds": self.seconds, "replay": self.replay}


@dataclass
class MatrixResult:
    cells: list[Cell] = field(default_factory=list)
    not_placed: list[str] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return sum(c.passed for c in self.cells)

    @property
    def failed(self) -> int:
        return len(self.cells) - self.passed

    def to_json(self) -> dict[str, Any]:
        return {"cells": [c.to_json() for c in self.cells], "passed": self.passed, "failed": self.failed}


def plan_cells(points: list[str], sides: list[str], seeds: list[int],
               scenario: str | None = None, faults: list[str] | tuple[str, ...] = (),
               tls: bool = False) -> list[Cell]:
    """The cells to run. ``scenario`` replaces the plan: every point on each of the
    scenario's sides (a user's own scenario, or ``join``: the points through node/'s
    own file moves).
    ``faults``: fault scenarios to run once per seed, without a crash plan.
    ``tls``: every cell's scenario with ``tls = true``."""
    cells = []
    for name in faults:
        load(name)              # an unknown name fails before anything runs
        cells += [Cell(NO_CRASH, "-", seed, name, 0) for seed in seeds]
    for point in points:
        if point not in POINTS:
            raise KeyError(f"unknown crash point {point!r}")
        if scenario is not None:
            per_side = {side: scenario for side in load(scenario).roles}
        else:
            per_side = PLAN.get(point, {})
        for side in sides:
            if side in per_side:
                for seed in seeds:
                    cells.append(Cell(point, side, seed, per_side[side], default_nth(point, seed)))
    for c in cells:
        c.tls = tls
    return cells


def run_matrix(cells: list[Cell], *, workdir: str | None = None,
               on_cell: Callable[[Cell], None] = lambda c: None,
               log: Callable[[str], None] = lambda m: None) -> MatrixResult:
    out = MatrixResult()
    for cell in cells:
        crash = None if cell.point == NO_CRASH else CrashPlan(cell.point, side=cell.side, nth=cell.nth)
        scenario = load(cell.scenario)
        if cell.tls:
            scenario = replace(scenario, tls=True)
        res = run(scenario, seed=cell.seed, workdir=workdir, log=log, crash=crash)
        cell.passed, cell.seconds, cell.result = res.passed, res.seconds, res
        out.cells.append(cell)
        on_cell(cell)
    return out


def all_sides() -> list[str]:
    return list(SIDES)
