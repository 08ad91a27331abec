"""The matrix: every crash point x the side it hits x K seeds, one run per cell.

:data:`PLAN` says which scenario reaches a point on which side. The ``supplier.*`` and
``demander.*`` points run in the ``file-move`` driver (cluster_sim/mover: a supplier
process and a demander process that runs the node's move engine, node/move/), which reaches
``supplier.mid_preimages`` and a rate-limited transfer; ``owner.mid_eviction`` and the
third side of the WAL and checkpointer points run through nodes (``join``,
``kill-restart``). node/ moves partitions file-based with the same engine, so
``--scenario join`` (:func:`plan_cells`) runs every point on each role of ``join``
through the nodes' own moves.

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
from dataclasses import dataclass, field
from typing import Any, Callable

from faults import POINTS

from .builtins import FAULT_SCENARIOS, load
from .runner import RunResult, run
from .scenario import SIDES, CrashPlan

FAULTS: tuple[str, ...] = FAULT_SCENARIOS
NO_CRASH = "none"          # the point of a fault cell

_FM = {"supplier": "file-move", "demander": "file-move"}
PLAN: dict[str, dict[str, str]] = {
    "wal.before_sync": {**_FM, "third": "kill-restart"},
    "wal.after_sync": {**_FM, "third": "kill-restart"},
    "checkpoint.mid_write": {**_FM, "third": "kill-restart"},
    "supplier.after_snapshot": {"supplier": "file-move"},
    "supplier.mid_send": {"supplier": "file-move"},
    "supplier.mid_preimages": {"supplier": "file-move"},
    "supplier.mid_delta_send": {"supplier": "restart-catchup"},
    "demander.mid_base_copy": {"demander": "restart-catchup"},
    "demander.mid_delta_receive": {"demander": "restart-catchup"},
    "demander.after_demand": {"demander": "file-move"},
    "demander.mid_receive": {"demander": "file-move"},
    "demander.mid_stream_index": {"demander": "file-move"},
    "demander.before_install": {"demander": "file-move"},
    "demander.after_install": {"demander": "file-move"},
    "demander.mid_index_rebuild": {"demander": "file-move"},
    "demander.mid_replay": {"demander": "file-move"},
    "demander.before_owning": {"demander": "file-move"},
    "demander.after_owning": {"demander": "file-move"},
    "owner.mid_eviction": {"supplier": "join", "third": "join"},
}

# Points hit many times in a run: the seed picks which hit crashes (1..max).
MANY_HITS = {"wal.before_sync": 30, "wal.after_sync": 30, "checkpoint.mid_write": 2,
             "supplier.mid_send": 3, "demander.mid_receive": 3}


def default_nth(point: str, seed: int) -> int:
    hi = MANY_HITS.get(point, 1)
    return random.Random(f"nth:{point}:{seed}").randint(1, hi) if hi > 1 else 1


def replay_command(scenario: str, point: str, nth: int, side: str, seed: int) -> str:
    if point == NO_CRASH:
        return f"ferry sim run --scenario {shlex.quote(scenario)} --seed {seed}"
    return ("ferry sim run --scenario " + shlex.quote(scenario) +
            f" --crash {point}:{nth} --side {side} --seed {seed}")


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

    @property
    def replay(self) -> str:
        return replay_command(self.scenario, self.point, self.nth, self.side, self.seed)

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
               scenario: str | None = None, faults: list[str] | tuple[str, ...] = ()) -> list[Cell]:
    """The cells to run. ``scenario`` replaces the plan: every point on each of the
    scenario's sides (a user's own scenario, or ``join``: the points through node/'s
    own file moves).
    ``faults``: fault scenarios to run once per seed, without a crash plan."""
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
    return cells


def run_matrix(cells: list[Cell], *, workdir: str | None = None,
               on_cell: Callable[[Cell], None] = lambda c: None,
               log: Callable[[str], None] = lambda m: None) -> MatrixResult:
    out = MatrixResult()
    for cell in cells:
        crash = None if cell.point == NO_CRASH else CrashPlan(cell.point, side=cell.side, nth=cell.nth)
        res = run(load(cell.scenario), seed=cell.seed, workdir=workdir, log=log, crash=crash)
        cell.passed, cell.seconds, cell.result = res.passed, res.seconds, res
        out.cells.append(cell)
        on_cell(cell)
    return out


def all_sides() -> list[str]:
    return list(SIDES)
