from __future__ import annotations

import ast
import os
import signal
import subprocess
import textwrap

import pytest

from faults import POINTS, crash, crashpoint
from faults.crash import parse_spec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE_PACKAGES = ["faults", "wal", "checkpoint", "transfer", "indexes", "node",
                   "cluster_sim", "validation", "ferry"]


def _crashpoint_names_in_code() -> dict[str, str]:
    found: dict[str, str] = {}
    for pkg in SOURCE_PACKAGES:
        for dirpath, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if not f.endswith(".py"):
                    continue
                path = os.path.join(dirpath, f)
                tree = ast.parse(open(path, encoding="utf-8").read(), path)
                for node in ast.walk(tree):
                    if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "crashpoint"
                            and node.args and isinstance(node.args[0], ast.Constant)):
                        found[node.args[0].value] = path
    return found


def test_every_crashpoint_in_code_is_declared() -> None:
    undeclared = {n: p for n, p in _crashpoint_names_in_code().items() if n not in POINTS}
    assert undeclared == {}, f"crash points used but not declared in faults/points.py: {undeclared}"


def test_names_are_component_dot_stage() -> None:
    for name, text in POINTS.items():
        comp, _, stage = name.partition(".")
        assert comp and stage and "." not in stage, name
        assert len(text) > 20, f"{name} needs a sentence on what is durable there"


def test_unarmed_is_a_noop() -> None:
    crash.disarm()
    crashpoint("demander.mid_replay")   # returns, process lives


def test_unknown_point_refused_when_arming() -> None:
    with pytest.raises(ValueError, match="unknown crash point"):
        parse_spec("no.such_point:1")
    with pytest.raises(ValueError, match=">= 1"):
        parse_spec("wal.after_sync:0")


def test_parse_probability_and_seed() -> None:
    (a,) = parse_spec("wal.before_sync@0.25#9")
    assert a.probability == 0.25 and a.nth is None
    (b,) = parse_spec("wal.after_sync:3")
    assert b.nth == 3


def _run_child(py_env: dict[str, str], python: str, env_extra: dict[str, str], body: str):
    env = dict(py_env, **env_extra)
    return subprocess.run([python, "-c", textwrap.dedent(body)], env=env,
                          capture_output=True, text=True, timeout=60)


def test_armed_point_kills_on_nth_hit(py_env, python) -> None:
    r = _run_child(py_env, python, {"FERRY_CRASH": "demander.mid_replay:3"}, """
        import sys
        from faults import crashpoint
        for i in range(1, 6):
            print(i, flush=True)
            crashpoint("demander.mid_replay")
        print("survived", flush=True)
    """)
    assert r.returncode == -signal.SIGKILL
    assert r.stdout.split() == ["1", "2", "3"]


def test_armed_kill_skips_atexit_and_buffers(py_env, python) -> None:
    r = _run_child(py_env, python, {"FERRY_CRASH": "wal.after_sync:1"}, """
        import atexit, sys
        atexit.register(lambda: print("atexit ran", flush=True))
        from faults import crashpoint
        crashpoint("wal.after_sync")
    """)
    assert r.returncode == -signal.SIGKILL
    assert "atexit ran" not in r.stdout


def test_probability_crash_is_repeatable_under_a_seed(py_env, python) -> None:
    body = """
        from faults import crashpoint
        for i in range(1000):
            print(i, flush=True)
            crashpoint("checkpoint.mid_write")
    """
    runs = [_run_child(py_env, python, {"FERRY_CRASH": "checkpoint.mid_write@0.05#11"}, body)
            for _ in range(2)]
    assert all(r.returncode == -signal.SIGKILL for r in runs)
    assert runs[0].stdout == runs[1].stdout


def test_trace_records_reached_points(py_env, python, tmp_path) -> None:
    trace = tmp_path / "trace"
    r = _run_child(py_env, python, {"FERRY_CRASH_TRACE": str(trace)}, """
        from faults import crashpoint
        for _ in range(3):
            crashpoint("wal.before_sync")
        crashpoint("wal.after_sync")
    """)
    assert r.returncode == 0, r.stderr
    assert trace.read_text().split() == ["wal.before_sync", "wal.after_sync"]
