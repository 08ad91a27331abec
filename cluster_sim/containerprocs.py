"""A node process in its own container: :class:`ContainerProc` is a :class:`Proc` whose
every life is a new container (testcontainers' ``DockerContainer``), and whose
``popen`` is a :class:`ContainerLife`, a Popen look-alike over that container, so the
cluster driver, the runner and :class:`Proc` itself (stop, kill, crash detection) work
on it unchanged.

Each container: the node image, host networking (the node listens on its own port on
127.0.0.1, etcd stays on the host), its own PID namespace with docker's init (tini) as
PID 1 -- an armed crash point SIGKILLs its own process, which PID 1 of a namespace
could not do to itself --, the host's interpreter, venv and checkout read-only
(:func:`cluster_sim.containers.node_mounts`), the node's config and secret read-only,
its log and the crash trace (appended), and its data directory read-write: the node's
volume, on a loop device when its disk is throttled. Optional limits: memory, and
read/write bytes per second on the data device.

Exit statuses: the init reports a node killed by signal N as 128+N (and docker does
the same for the init itself), mapped back to -N as Popen reports it, so "ended by a
SIGKILL the harness did not send" means the same as for a plain process.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from .procs import ROOT, Proc, child_env

# what of the harness's environment reaches a node in a container (not the host's PATH,
# HOME or DOCKER_HOST: the container has its own)
PASS_ENV = ("FERRY_", "PYTHON", "LANG", "LC_", "TZ")
LABEL = "org.ferry.sim"                 # value: the run's tag (cleanup by label)


@dataclass(frozen=True)
class Box:
    """What every life of one node's container gets."""
    image: str
    tag: str                            # the run's tag: container names and labels
    mounts: tuple[tuple[str, str, str], ...]      # (host, container, "ro"/"rw")
    memory_mib: int = 0                 # 0: no limit
    device: str = ""                    # the data directory's block device (throttled)
    write_bps: int = 0
    read_bps: int = 0

    def kwargs(self) -> dict[str, Any]:
        """docker-py ``containers.create`` arguments beyond image, command and env."""
        kw: dict[str, Any] = {"network_mode": "host", "init": True, "labels": {LABEL: self.tag},
                              "working_dir": ROOT}
        if self.memory_mib:
            kw["mem_limit"] = kw["memswap_limit"] = f"{self.memory_mib}m"   # no swap either
        if self.device and self.write_bps:
            kw["device_write_bps"] = [{"Path": self.device, "Rate": self.write_bps}]
        if self.device and self.read_bps:
            kw["device_read_bps"] = [{"Path": self.device, "Rate": self.read_bps}]
        return kw


def container_env(armed: str | None, trace: str | None) -> dict[str, str]:
    env = {k: v for k, v in child_env(armed, trace).items() if k.startswith(PASS_ENV)}
    env["PATH"] = os.path.dirname(os.path.abspath(sys.executable)) + \
        ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    env["HOME"] = "/root"
    return env


def _status(code: int) -> int:
    """Docker's exit status -> Popen's returncode (killed by signal N: -N)."""
    return -(code - 128) if 128 < code < 128 + signal.NSIG else code


class ContainerLife:
    """Popen's interface over one container: poll, wait, returncode, pid, send_signal,
    terminate, kill. A thread waits for the container's exit (docker wait) and records
    its status, whether the kernel's OOM killer ended it, and removes it."""

    def __init__(self, tc: Any, host: str,
                 on_exit: Callable[[ContainerLife], None] | None = None) -> None:
        self.tc = tc                          # testcontainers' DockerContainer, started
        self.container = tc.get_wrapped_container()
        self.container.reload()
        self.init_pid: int = self.container.attrs["State"]["Pid"]
        self.returncode: int | None = None
        self.oom_killed = False
        self.paused = False
        self._done = threading.Event()
        self._host = host
        self._on_exit = on_exit
        threading.Thread(target=self._wait, name=f"wait-{self.container.name}", daemon=True).start()

    @property
    def name(self) -> str:
        return str(self.container.name)

    @property
    def pid(self) -> int:
        """The node process's host PID (the init's child), else the init's."""
        try:
            with open(f"/proc/{self.init_pid}/task/{self.init_pid}/children") as f:
                kids = f.read().split()
            return int(kids[0]) if kids else self.init_pid
        except OSError:
            return self.init_pid

    def _wait(self) -> None:
        import docker
        api = docker.APIClient(base_url=self._host, timeout=None)
        try:
            code = int(api.wait(self.container.id)["StatusCode"])
            try:
                self.oom_killed = bool(api.inspect_container(self.container.id)["State"]["OOMKilled"])
            except Exception:  # noqa: BLE001 - removed meanwhile: no verdict
                pass
            self.returncode = _status(code)
        except Exception:  # noqa: BLE001 - removed under us (release): it is gone
            self.returncode = -signal.SIGKILL if self.returncode is None else self.returncode
        finally:
            self._done.set()
            try:
                api.remove_container(self.container.id, force=True)
            except Exception:  # noqa: BLE001 - already removed
                pass
            api.close()
            self.tc.get_docker_client().client.close()
            if self._on_exit is not None:
                self._on_exit(self)

    def poll(self) -> int | None:
        return self.returncode if self._done.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.name, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Through docker to the init, which passes it on to the node (SIGKILL ends the
        init, and with it the whole PID namespace). A paused container is thawed
        first: docker refuses to signal a frozen one."""
        if self._done.is_set():
            return
        try:
            if self.paused:
                self.unpause()
            self.container.kill(signal=int(sig))
        except Exception:  # noqa: BLE001 - it exited meanwhile (409 not running)
            if not self._done.wait(2.0):
                raise

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def pause(self) -> None:
        """Freeze every process of the container (the cgroup freezer): it keeps its
        sockets, the kernel keeps accepting connections for it, it answers nothing."""
        self.container.pause()
        self.paused = True

    def unpause(self) -> None:
        self.container.unpause()
        self.paused = False

    def stats(self) -> dict[str, Any]:
        """One sample of docker's stats (memory, blkio) while it runs; {} when gone."""
        try:
            return dict(self.container.stats(stream=False, one_shot=True))
        except TypeError:       # an older docker SDK without one_shot
            return dict(self.container.stats(stream=False))
        except Exception:  # noqa: BLE001 - exited
            return {}


@dataclass
class ContainerProc(Proc):
    """A :class:`Proc` whose lives are containers of ``box`` on the engine at ``host``."""
    box: Box | None = None
    host: str = ""
    on_exit: Callable[[ContainerLife], None] | None = None
    popen: Any = None                   # a ContainerLife while it has lived
    history: list[ContainerLife] = field(default_factory=list)

    def start(self) -> ContainerProc:
        from testcontainers.core.container import DockerContainer

        from .containers import configure_testcontainers
        configure_testcontainers()          # no Ryuk: its image cannot be pulled here
        assert self.box is not None
        armed = self.crash if self.lives == 0 else None
        with open(self.log, "ab") as log:
            log.write(f"\n=== life {self.lives + 1}{' FERRY_CRASH=' + armed if armed else ''}"
                      f" (container)\n".encode())
        # the node's output appended to its log file, as a plain process's is
        cmd = ["sh", "-c", 'exec "$@" >>"$0" 2>&1', self.log, *self.argv]
        tc = (DockerContainer(self.box.image)
              .with_name(f"fsim-{self.box.tag}-{self.name}-{self.lives + 1}")
              .with_command(cmd)
              .with_envs(**container_env(armed, self.trace))
              .with_kwargs(**self.box.kwargs()))
        for h, c, mode in self.box.mounts:
            tc.with_volume_mapping(h, c, mode)
        tc.start()
        self.popen = ContainerLife(tc, self.host, self.on_exit)
        self.history.append(self.popen)
        self.lives += 1
        self._killed_by_us = False
        return self
