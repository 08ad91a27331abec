"""A FerryError no command turned into its own message still ends as one line."""
from __future__ import annotations

import subprocess


def run_boom(py_env, python, raises: str) -> subprocess.CompletedProcess[str]:
    """``ferry boom`` in a child process, with a command ``boom`` that runs ``raises``."""
    code = ("import sys, click\n"
            "from ferry import cli as c\n"
            "from faults.errors import FerryError\n"
            "@click.command('boom')\n"
            "def boom():\n"
            f"    {raises}\n"
            "c.GROUPS['boom'] = ('ferry.cli', 'boom', 'test')\n"
            "c.boom = boom\n"
            "sys.argv = ['ferry', 'boom']\n"
            "c.main()\n")
    return subprocess.run([python, "-c", code], env=py_env, capture_output=True, text=True,
                          timeout=60)


def test_an_unhandled_ferry_error_is_one_line_not_a_traceback(py_env, python) -> None:
    r = run_boom(py_env, python, "raise FerryError('the thing at /x is broken;\\nfix it')")
    assert r.returncode == 1, r.stderr
    assert r.stderr == "ferry boom: error: the thing at /x is broken; fix it\n"


def test_other_exceptions_keep_their_traceback(py_env, python) -> None:
    r = run_boom(py_env, python, "raise ZeroDivisionError('a bug')")
    assert r.returncode == 1 and "Traceback" in r.stderr and "ZeroDivisionError" in r.stderr
