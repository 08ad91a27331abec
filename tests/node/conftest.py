from __future__ import annotations

import os
import sys

# the node tests share nodeharness.py (real node processes, offline checks)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


import pytest  # noqa: E402


@pytest.fixture
def nodes():
    from nodeharness import Nodes
    ns = Nodes()
    yield ns
    ns.kill_all()
