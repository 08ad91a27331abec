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


@pytest.fixture(autouse=True)
def _control_plane(tmp_path):
    """A fresh etcd for each test, started only when a node needs it."""
    from nodeharness import reset_control_plane
    reset_control_plane(str(tmp_path / "etcd"))
    yield
    reset_control_plane(None)


@pytest.fixture
def etcd(tmp_path):
    """A real one-member etcd of its own and a client of it (a test module may define
    its own ``etcd`` fixture instead)."""
    from node.control import Etcd
    from node.etcdserver import EtcdCluster
    c = EtcdCluster(str(tmp_path / "etcd")).start()
    yield Etcd(c.endpoints)
    c.stop()
