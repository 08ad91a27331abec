"""A FerryError no command turned into its own message still ends as one line."""
from __future__ import annotations

import subprocess


def test_an_unhandled_ferry_error_is_one_line_not_a_traceback(py_env, python) -> None:
    code = ("import sys, click\n"
            "from ferry import cli as c\n"
            "from faults.errors import FerryError\n"
            "@click.command('boom')\n"
            "def boom():\n"
            "    raise FerryError('the thing at /x is broken;\\nfix it')\n"
            "c.GROUPS['boom'] = ('ferry.cli', 'boom', 'test')\n"
            "c.boom = boom\n"
            "sys.argv = ['ferry', 'boom']\n"
            "c.main()\n")
    r = subprocess.run([python, "-c", code], env=py_env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert r.stderr == "ferry boom: error: the thing at /x is broken; fix it\n"


def test_other_exceptions_keep_their_traceback(py_env, python) -> None:
    code = ("import sys, click\n"
            "from ferry import cli as c\n"
            "@click.command('boom')\n"
            "def boom():\n"
            "    raise ZeroDivisionError('a bug')\n"
            "c.GROUPS['boom'] = ('ferry.cli', 'boom', 'test')\n"
            "c.boom = boom\n"
            "sys.argv = ['ferry', 'boom']\n"
            "c.main()\n")
    r = subprocess.run([python, "-c", code], env=py_env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" in r.stderr and "ZeroDivisionError" in r.stderr
