"""Every point of faults.POINTS is placed in the code or listed as "not yet placed" in
docs/harness.md. (That every crashpoint() call names a declared point is
tests/faults/test_crash.py; that every point is reached by a scenario, with its crash
fired, is the quick matrix: tests/cluster_sim/test_matrix.py runs a cell per point and
a cell whose crash never fired fails.)"""
from __future__ import annotations

import ast
import os


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
