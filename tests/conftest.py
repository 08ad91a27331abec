from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Tests are imported with --import-mode=importlib (so tests/wal/test_cli.py and
# tests/transfer/test_cli.py can share a basename); the per-package helper modules
# (transfer_helpers, nodeharness ...) are found through these paths. Their names are unique.
_TESTS = os.path.dirname(os.path.abspath(__file__))
for _d in sorted(os.listdir(_TESTS)):
    if os.path.isdir(os.path.join(_TESTS, _d)) and not _d.startswith((".", "_")):
        sys.path.insert(0, os.path.join(_TESTS, _d))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.fixture
def py_env() -> dict[str, str]:
    """Environment for a child Python process that imports Ferry from this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("FERRY_CRASH", None)
    env.pop("FERRY_CRASH_TRACE", None)
    return env


@pytest.fixture
def python() -> str:
    return sys.executable
