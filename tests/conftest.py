from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
