"""The quick matrix (every placed point, one seed, supplier and demander sides) passes,
and its JSON has exactly the documented schema (docs/harness.md)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cluster_sim.matrix import PLAN, plan_cells
from faults import POINTS


def test_plan_covers_every_point_and_cells_are_seeded() -> None:
    assert set(PLAN) == set(POINTS)
    cells = plan_cells(sorted(POINTS), ["supplier", "demander"], [1, 2])
    assert {c.point for c in cells} == set(POINTS)
    again = plan_cells(sorted(POINTS), ["supplier", "demander"], [1, 2])
    assert [(c.point, c.side, c.seed, c.nth) for c in cells] == [(c.point, c.side, c.seed, c.nth) for c in again]


def test_fault_scenarios_are_cells_without_a_crash_plan() -> None:
    from cluster_sim.matrix import FAULTS, NO_CRASH
    cells = plan_cells(["wal.before_sync"], ["third"], [1, 2], faults=list(FAULTS))
    faults = [c for c in cells if c.point == NO_CRASH]
    assert {c.scenario for c in faults} == set(FAULTS) and len(faults) == 2 * len(FAULTS)
    assert {"long-cut", "controller-cut", "flapping", "etcd-member-loss", "control-plane-outage"} <= set(FAULTS)
    assert faults[0].replay == f"ferry sim run --scenario {faults[0].scenario} --seed 1"
    assert set(faults[0].to_json()) == {"point", "side", "seed", "passed", "seconds", "replay"}


# The quick matrix in three parts (every point in one of them), so that the suite's
# workers run them side by side instead of one worker running every cell.
PARTS = 3
_ALL = sorted(POINTS)


@pytest.mark.slow
@pytest.mark.parametrize("part", range(PARTS))
def test_quick_matrix_passes(tmp_path, py_env, part: int) -> None:
    mine = _ALL[part::PARTS]
    out = subprocess.run([sys.executable, "-m", "ferry", "sim", "matrix", "--points", ",".join(mine),
                          "--sides", "supplier,demander", "--seeds", "1", "--faults", "none", "--json",
                          "--report", str(tmp_path / "report"), "--workdir", str(tmp_path)],
                         capture_output=True, text=True, env=py_env, timeout=900)
    doc = json.loads(out.stdout)
    assert set(doc) == {"cells", "passed", "failed"}
    for c in doc["cells"]:
        assert set(c) == {"point", "side", "seed", "passed", "seconds", "replay"}
    failed = [c["replay"] for c in doc["cells"] if not c["passed"]]
    assert not failed and out.returncode == 0, (failed, out.stderr[-3000:])
    assert {c["point"] for c in doc["cells"]} == set(mine)
    assert (tmp_path / "report" / "report.html").exists() and (tmp_path / "report" / "cell-000.png").exists()


def test_the_quick_matrix_parts_cover_every_point() -> None:
    parts = [set(_ALL[i::PARTS]) for i in range(PARTS)]
    assert set().union(*parts) == set(POINTS) and sum(map(len, parts)) == len(POINTS)
    # every point has a supplier or demander cell, so each part's cells name all of its points
    cells = plan_cells(_ALL, ["supplier", "demander"], [1])
    assert {c.point for c in cells} == set(POINTS)
