from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def spark():
    """ONE local Spark session per test module (a session takes ~6 s to start and its
    first query ~10 s more to warm up), with 2 cores so that the tests' 4+ partition
    files are more than the executor cores."""
    from validation.session import start

    session = start("local[2]", app_name="ferry-validation-tests",
                    conf={"spark.sql.shuffle.partitions": "4"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def standalone(tmp_path_factory):
    """A real Spark standalone master and worker on 127.0.0.1 (tests/sparkcluster.py)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from sparkcluster import StandaloneCluster

    cluster = StandaloneCluster(str(tmp_path_factory.mktemp("spark-standalone"))).start()
    yield cluster
    cluster.stop()
