"""Every crash point placed in the code is reached by some scenario (FERRY_CRASH_TRACE),
and every point of faults.POINTS is placed or listed as "not yet placed" in
docs/harness.md. (That every crashpoint() call names a declared point is
tests/faults/test_crash.py.)"""
from __future__ import annotations

import ast
import os

import pytest

import cluster_sim
from faults import POINTS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKIP = {".venv", "tests", ".git", "build", "demo-run"}


def placed_points() -> dict[str, list[str]]:
    """point -> files with a ``crashpoint("<point>")`` call (any spelling of the callee)."""
    out: dict[str, list[str]] = {}
    for base, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP and not d.startswith(".")]
        for f in files:
            if not f.endswith(".py") or f == "crash.py":
                continue
            path = os.path.join(base, f)
            try:
                tree = ast.parse(open(path, encoding="utf-8").read())
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                        and getattr(node.func, "attr", getattr(node.func, "id", "")) == "crashpoint"):
                    out.setdefault(node.args[0].value, []).append(os.path.relpath(path, ROOT))
    return out


def test_unplaced_points_are_documented() -> None:
    placed = placed_points()
    missing = sorted(set(POINTS) - set(placed))
    doc = open(os.path.join(ROOT, "docs", "harness.md")).read()
    for p in missing:
        assert f"`{p}`" in doc.split("## Not yet placed", 1)[-1], f"{p} has no call site and is not documented"


@pytest.mark.slow
def test_every_placed_point_is_reached_by_a_scenario(tmp_path) -> None:
    reached: set[str] = set()
    # node processes only: slow-join (n1 supplies every move, pages overwritten mid-send),
    # join-stream-index (the streaming install, eviction), restart-catchup (delta fetches)
    for name in ("slow-join", "join-stream-index", "restart-catchup"):
        r = cluster_sim.run(cluster_sim.load_scenario(name), seed=1, workdir=str(tmp_path))
        reached |= set(r.reached)
    placed = placed_points()
    unreached = {p: placed[p] for p in placed if p in POINTS and p not in reached}
    assert not unreached, f"placed in code but reached by no scenario: {unreached}"
