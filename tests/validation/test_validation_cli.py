"""`ferry validate` and `spark-submit validation/job.py` as processes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from validation_pages import entries, write_node

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_help_does_not_import_pyspark(py_env, python) -> None:
    code = ("import sys\nfrom ferry.cli import cli\n"
            "try:\n    cli.main(['validate', '--help'], prog_name='ferry')\n"
            "except SystemExit:\n    pass\n"
            "print('PYSPARK', 'pyspark' in sys.modules)\n")
    r = subprocess.run([python, "-c", code], env=py_env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "--expected" in r.stdout and "PYSPARK False" in r.stdout


@pytest.mark.parametrize("args, message", [
    (["/no/such/folder"], "is not a directory"),
    (["{ok}", "--expected", "/no/such.jsonl"], "does not exist"),
    (["{ok}", "--conf", "nokey"], "expected KEY=VALUE"),
])
def test_bad_arguments_fail_before_spark_starts(py_env, python, tmp_path, args, message) -> None:
    ok = write_node(str(tmp_path / "ok"), "c", {0: entries(0, 3)})
    args = [a.replace("{ok}", ok) for a in args]
    r = subprocess.run([python, "-m", "ferry", "validate", *args], env=py_env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr


def _nodes(tmp_path, diverge: bool) -> list[str]:
    a = write_node(str(tmp_path / "a"), "users", {p: entries(p, 40) for p in range(3)})
    b_parts = {p: entries(p, 40) for p in range(3)}
    if diverge:
        b_parts[1] = b_parts[1][:-1]
    b = write_node(str(tmp_path / "b"), "users", b_parts)
    return [a, b]


@pytest.mark.slow
def test_ferry_validate_command(py_env, python, tmp_path) -> None:
    dirs = _nodes(tmp_path, diverge=True)
    html = tmp_path / "report.html"
    r = subprocess.run([python, "-m", "ferry", "validate", *dirs, "--master", "local[2]",
                        "--json", "--report", str(html)], env=py_env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 1, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert res["passed"] is False
    assert [(d["partition"], [k["key"] for k in d["keys"]]) for d in res["divergent"]] == \
        [(1, ["k1-39"])]
    assert "<table>" in html.read_text()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("spark-submit", path=os.path.dirname(sys.executable)) is None,
                    reason="spark-submit is not installed next to this Python")
def test_spark_submit_runs_the_job(py_env, tmp_path) -> None:
    dirs = _nodes(tmp_path, diverge=False)
    env = dict(py_env, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    r = subprocess.run([submit, "--master", "local[2]", os.path.join(ROOT, "validation", "job.py"),
                        *dirs], env=env, capture_output=True, text=True, timeout=300,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("PASSED: 3 partitions of 1 caches on 2 nodes")
