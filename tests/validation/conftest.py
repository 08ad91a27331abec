from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _start_spark():
    from validation.session import start

    return start("local[2]", app_name="ferry-validation-tests",
                 conf={"spark.sql.shuffle.partitions": "4"})


@pytest.fixture(scope="session")
def _spark_session():
    """Holds the session the ``spark`` fixture hands out; stopped at the end."""
    held: dict = {}
    yield held
    if held:
        held["session"].stop()


@pytest.fixture(scope="module")
def spark(_spark_session):
    """ONE local Spark session per test process, shared by the test modules (a
    session takes ~6 s to start and its first query ~10 s more to warm up, ~5 s on a
    new session in the same JVM), with 2 cores so that the tests' 4+ partition files
    are more than the executor cores. The tests change nothing in it (no settings, no
    views; persisted rows are unpersisted); one that stopped it (validate() without
    spark= stops the session it started, and getOrCreate hands it this one) gets a
    new one for the next module."""
    session = _spark_session.get("session")
    if session is None or session.sparkContext._jsc is None:       # none yet, or stopped
        session = _spark_session["session"] = _start_spark()
    yield session


@pytest.fixture(scope="session")
def standalone(tmp_path_factory):
    """A real Spark standalone master and worker on 127.0.0.1 (tests/sparkcluster.py)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from sparkcluster import StandaloneCluster

    cluster = StandaloneCluster(str(tmp_path_factory.mktemp("spark-standalone"))).start()
    yield cluster
    cluster.stop()
