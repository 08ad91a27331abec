"""Container mode (testcontainers): where a Docker engine is reachable, each node
would run in its own container from the checkout. This machine has no Docker engine,
so only the probe exists: :func:`available` says whether the mode can run and why
not; :func:`require` raises a clear :class:`SimError` when it cannot."""
from __future__ import annotations

from .errors import SimError


def available() -> tuple[bool, str]:
    try:
        import docker  # testcontainers' client
    except ImportError:
        return False, "the docker client library (installed with testcontainers) is missing"
    try:
        docker.from_env(timeout=3).ping()
    except Exception as e:  # noqa: BLE001 - any failure means: no engine to talk to
        return False, f"no Docker engine reachable ({type(e).__name__}: {str(e)[:120]})"
    return True, ""


def require() -> None:
    ok, why = available()
    if not ok:
        raise SimError(f"container mode cannot run here: {why}")
    raise SimError("container mode: a Docker engine is present, but running nodes in "
                   "containers is not implemented yet (docs/harness.md)")
