"""The Docker engine of the container tests (test_containers.py, test_multihost.py): the
one at DOCKER_HOST or the default socket (`.ci/run` starts one with scripts/docker-up),
else a private one this session starts and stops (root, docker.io installed). Where
none can start, the tests that ask for it skip with the reason."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from cluster_sim.containers import Engine
from cluster_sim.diskfull import SimSkipped


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[Engine]:
    try:
        engine = Engine.find_or_start()
    except SimSkipped as e:
        pytest.skip(str(e))
    try:
        try:
            engine.image()           # built or loaded once, and checked to run Ferry
        except SimSkipped as e:
            pytest.skip(str(e))
        engine.activate()
        yield engine
    finally:
        engine.stop()
