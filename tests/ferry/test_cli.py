from __future__ import annotations

import subprocess


def test_help_lists_groups_without_importing_heavy_packages(py_env, python) -> None:
    code = ("import sys\n"
            "from ferry.cli import cli\n"
            "try:\n    cli.main(['--help'], prog_name='ferry')\n"
            "except SystemExit:\n    pass\n"
            "heavy = [m for m in ('pyspark', 'lmdb', 'paramiko') if m in sys.modules]\n"
            "print('HEAVY', heavy)\n")
    r = subprocess.run([python, "-c", code], env=py_env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "Commands" in r.stdout
    assert "HEAVY []" in r.stdout


def test_unknown_subcommand_is_a_clear_error(py_env, python) -> None:
    r = subprocess.run([python, "-m", "ferry", "no-such-group"], env=py_env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "No such command" in r.stderr
