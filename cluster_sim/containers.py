"""Container mode's engine and image: where the Docker engine is, starting a private one
when none answers, and the image every node runs in.

- :func:`available` probes for an engine (``DOCKER_HOST`` or the default socket) and
  says why not.
- :meth:`Engine.find_or_start` returns that engine, or starts a private ``dockerd``
  with ``scripts/docker-up`` (root, ``docker.io`` installed; its state in one folder
  under /tmp, no change to the host's network) that :meth:`Engine.stop` removes again.
  When neither works it raises :class:`SimSkipped` with the reason.
- :meth:`Engine.image` is ``scripts/ferry-image``'s image (Debian minbase, built here once
  per content hash and cached), checked once per engine by :func:`check_image`: the
  host's interpreter, venv and checkout, bind-mounted read-only at the same paths
  (:func:`node_mounts`), import Ferry and its C accelerators in it.

testcontainers drives the containers (:mod:`cluster_sim.containerprocs`). Its reaper
(Ryuk) is an image that cannot be pulled here, so it is off; the mode removes its
containers itself. Containers use host networking: nothing is published.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from .diskfull import SimSkipped
from .procs import ROOT

SCRIPTS = os.path.join(ROOT, "scripts")
IMAGE_ENV = "FERRY_NODE_IMAGE"        # a prebuilt image to use instead of scripts/ferry-image
# What a node imports that needs shared libraries from the image, and every C
# accelerator the host built (a node would fall back to the slower pure-Python path
# without a word if one failed to load)
SMOKE = """
import glob, importlib, os, sys
import ssl, sqlite3, hashlib, lmdb, ferry.cli, node.process, checkpoint, wal, indexes
for so in glob.glob(os.path.join(sys.argv[1], "*", "_*accel.*.so")):
    pkg, name = os.path.basename(os.path.dirname(so)), os.path.basename(so).split(".")[0]
    importlib.import_module(pkg + "." + name)
"""


_UNSET = object()


def configure_testcontainers() -> None:
    """Ryuk off (its image cannot be pulled) and the engine's own host as the address of
    containers (they use host networking). Before testcontainers reads its config."""
    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
    os.environ.setdefault("TESTCONTAINERS_CONNECTION_MODE", "docker_host")
    from testcontainers.core.config import testcontainers_config
    testcontainers_config.ryuk_disabled = True


def _ping(host: str | None) -> str:
    """"" when the engine at ``host`` (None: DOCKER_HOST or the default) answers, else why not."""
    try:
        import docker  # testcontainers' client
    except ImportError:
        return "the docker client library (installed with testcontainers) is missing"
    env = dict(os.environ) if host is None else {"DOCKER_HOST": host}
    try:
        client = docker.from_env(environment=env, timeout=5)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as e:  # noqa: BLE001 - any failure means: no engine to talk to
        where = host or os.environ.get("DOCKER_HOST") or "the default socket"
        return f"no Docker engine reachable at {where} ({type(e).__name__}: {str(e)[:120]})"
    return ""


def available() -> tuple[bool, str]:
    """(True, "") when an engine answers (``DOCKER_HOST`` or the default socket)."""
    why = _ping(None)
    return not why, why


@dataclass
class Engine:
    """A Docker engine that answers at ``host``; ``dir`` is set when we started it."""
    host: str
    dir: str | None = None
    _image: str | None = field(default=None, repr=False)
    _saved: Any = field(default=_UNSET, repr=False)   # DOCKER_HOST before activate()

    @classmethod
    def find_or_start(cls) -> Engine:
        """The engine at ``DOCKER_HOST`` / the default socket, else a private one started
        with scripts/docker-up. Raises :class:`SimSkipped` naming both reasons."""
        why = _ping(None)
        if not why:
            return cls(os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock")
        r = subprocess.run([os.path.join(SCRIPTS, "docker-up")], capture_output=True, text=True,
                           timeout=60)
        if r.returncode != 0:
            raise SimSkipped(f"container mode: {why}; and no private engine could start: "
                             f"{r.stderr.strip()[-400:] or f'docker-up exit {r.returncode}'}")
        env = dict(line.removeprefix("export ").split("=", 1)
                   for line in r.stdout.splitlines() if "=" in line)
        engine = cls(env["DOCKER_HOST"], env["FERRY_DOCKER_DIR"])
        if (late := _ping(engine.host)):
            engine.stop()
            raise SimSkipped(f"container mode: the private engine started but {late}")
        return engine

    def activate(self) -> None:
        """Make this the engine of every docker client of the process (testcontainers
        makes its own from the environment); :meth:`stop` puts the old value back."""
        if os.environ.get("DOCKER_HOST") != self.host:
            self._saved = os.environ.get("DOCKER_HOST")
            os.environ["DOCKER_HOST"] = self.host

    def env(self) -> dict[str, str]:
        """The environment of a docker client or script that talks to this engine."""
        return {**os.environ, "DOCKER_HOST": self.host}

    def client(self) -> Any:
        """A docker SDK client of this engine (the caller closes it)."""
        import docker
        return docker.from_env(environment={"DOCKER_HOST": self.host}, timeout=60)

    def image(self) -> str:
        """The node image (built or loaded by scripts/ferry-image once), checked to run
        the host's interpreter and checkout. Raises SimSkipped when it cannot be had."""
        if self._image is None:
            image = os.environ.get(IMAGE_ENV)
            if not image:
                r = subprocess.run([os.path.join(SCRIPTS, "ferry-image")], capture_output=True,
                                   text=True, env=self.env(), timeout=600)
                if r.returncode != 0 or not r.stdout.strip():
                    raise SimSkipped("container mode: no node image: "
                                     + (r.stderr.strip()[-600:] or f"ferry-image exit {r.returncode}"))
                image = r.stdout.split()[-1]
            check_image(self, image)
            self._image = image
        return self._image

    def stop(self) -> None:
        """Stop the engine if we started it (scripts/docker-down: its containers, dockerd,
        its mounts and folder); an engine found running is left alone."""
        if self.dir is not None:
            subprocess.run([os.path.join(SCRIPTS, "docker-down"), self.dir], capture_output=True,
                           timeout=120)
            self.dir = None
        if self._saved is not _UNSET:
            if self._saved is None:
                os.environ.pop("DOCKER_HOST", None)
            else:
                os.environ["DOCKER_HOST"] = self._saved
            self._saved = _UNSET


def node_mounts() -> list[tuple[str, str, str]]:
    """(host path, container path, mode) that make the host's Ferry run in the image:
    the interpreter's prefix, the venv and the checkout, read-only at the same paths (a
    path inside another one is covered by it)."""
    paths = sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, ROOT)})
    out: list[str] = []
    for p in paths:
        if not any(p == q or p.startswith(q + os.sep) for q in out):
            out.append(p)
    # the venv's bin/python is a symlink into the prefix: both are there at the same paths
    return [(p, p, "ro") for p in out]


def check_image(engine: Engine, image: str) -> None:
    """Run the host's interpreter in ``image`` and import what a node imports; on failure
    name the shared libraries the image lacks (ldd of the failing modules)."""
    client = engine.client()
    volumes = {h: {"bind": c, "mode": m} for h, c, m in node_mounts()}
    env = {"PYTHONPATH": ROOT, "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        try:
            client.containers.run(image, [sys.executable, "-c", SMOKE, ROOT], volumes=volumes,
                                  environment=env, network_mode="host", remove=True,
                                  stderr=True, stdout=True)
            return
        except Exception as e:  # noqa: BLE001 - ContainerError, ImageNotFound, APIError
            failed = str(getattr(e, "stderr", b"") or e)[-600:]
        libdirs = " ".join(sorted({os.path.dirname(os.path.realpath(sys.executable)),
                                   os.path.join(sys.base_prefix, "lib"), sys.prefix, ROOT}))
        script = (f"find {libdirs} -name '*.so*' -type f 2>/dev/null | while read f; do "
                  "ldd \"$f\" 2>/dev/null | grep -q 'not found' && echo \"$f: $(ldd \"$f\" | "
                  "grep 'not found' | cut -d' ' -f1 | tr -d '\\t' | tr '\\n' ' ')\"; done; true")
        try:
            missing = client.containers.run(image, ["sh", "-c", script], volumes=volumes,
                                            network_mode="host", remove=True).decode()[-1500:]
        except Exception as e:  # noqa: BLE001
            missing = f"(ldd failed too: {e})"
        raise SimSkipped(f"container mode: the host's Python does not run in {image}: {failed}\n"
                         f"shared libraries missing in the image:\n{missing}")
    finally:
        client.close()
