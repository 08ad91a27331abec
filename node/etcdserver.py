"""A local etcd for the embedded default: the demo, ``LocalCluster``, the tests and the
harness each start one in their work folder and stop it at the end.

Real clusters run their own etcd and point ``--control-plane`` at it; this module only
spawns Debian's ``etcd`` binary (package ``etcd-server``) on loopback. One member by
default; ``EtcdCluster(n=3)`` starts a three-member cluster whose members can be killed
and restarted one by one (the harness's ``etcd-member-loss`` scenario).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request

from .errors import ConfigError, Unavailable

INSTALL_HINT = ("install it: `apt-get install etcd-server etcd-client` on Debian/Ubuntu "
                "(scripts/system-deps does this as root), or put an etcd 3.4+ binary on PATH "
                "or in $FERRY_ETCD")


def etcd_binary() -> str:
    """Path of the etcd binary, or ConfigError saying how to install one."""
    cand = os.environ.get("FERRY_ETCD") or shutil.which("etcd") or "/usr/bin/etcd"
    if os.path.isfile(cand) and os.access(cand, os.X_OK):
        return cand
    raise ConfigError(f"no etcd binary found (Ferry's control plane runs on etcd); {INSTALL_HINT}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdMember:
    def __init__(self, root: str, name: str, client_port: int, peer_port: int) -> None:
        self.name = name
        self.dir = os.path.join(root, name)
        self.client_port, self.peer_port = client_port, peer_port
        self.url = f"http://127.0.0.1:{client_port}"
        self.peer_url = f"http://127.0.0.1:{peer_port}"
        self.log = os.path.join(root, f"{name}.log")
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self, initial_cluster: str, state: str) -> list[str]:
        return [etcd_binary(), "--name", self.name, "--data-dir", self.dir,
                "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
                "--initial-cluster", initial_cluster, "--initial-cluster-state", state,
                "--initial-cluster-token", "ferry-local",
                # loopback: a short heartbeat lets a 2 s lease TTL work and elections be quick
                "--heartbeat-interval", "50", "--election-timeout", "500",
                "--logger", "zap", "--log-outputs", self.log, "--log-level", "warn",
                # the control state is small; keep etcd from growing its db without bound
                "--auto-compaction-mode", "revision", "--auto-compaction-retention", "10000",
                "--quota-backend-bytes", str(1 << 30)]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


class EtcdCluster:
    """``n`` etcd members on loopback under ``root``; ``endpoints`` for the nodes."""

    def __init__(self, root: str, n: int = 1) -> None:
        self.root = os.path.abspath(root)
        os.makedirs(self.root, exist_ok=True)
        self.members = [EtcdMember(self.root, f"etcd{i + 1}", _free_port(), _free_port())
                        for i in range(n)]
        self.initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        self._started: set[str] = set()

    @property
    def endpoints(self) -> list[str]:
        return [m.url for m in self.members]

    def start(self, timeout: float = 30.0) -> "EtcdCluster":
        for m in self.members:
            self.start_member(m, wait=False)
        self.wait_healthy(timeout)
        return self

    def start_member(self, m: EtcdMember, wait: bool = True) -> None:
        state = "existing" if m.name in self._started or os.path.isdir(m.dir) else "new"
        logf = open(m.log + ".stderr", "ab")
        try:
            m.proc = subprocess.Popen(m.argv(self.initial, state), stdout=logf, stderr=logf,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            logf.close()
        self._started.add(m.name)
        if wait:
            self.wait_healthy(30.0, members=[m])

    def wait_healthy(self, timeout: float, members: list[EtcdMember] | None = None) -> None:
        deadline = time.monotonic() + timeout
        for m in members or self.members:
            while True:
                if m.proc is not None and m.proc.poll() is not None:
                    raise Unavailable(f"etcd member {m.name} exited {m.proc.returncode}; "
                                      f"see {m.log} and {m.log}.stderr")
                try:
                    with urllib.request.urlopen(m.url + "/health", timeout=1.0) as r:
                        if b'"true"' in r.read():
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise Unavailable(f"etcd member {m.name} at {m.url} not healthy after "
                                      f"{timeout:.0f}s; see {m.log}")
                time.sleep(0.05)

    def kill(self, i: int = 0) -> None:
        self.members[i].kill()

    def restart(self, i: int = 0) -> None:
        self.start_member(self.members[i], wait=False)
        if len(self.members) == 1 or sum(x.alive() for x in self.members) > len(self.members) // 2:
            self.wait_healthy(30.0, members=[self.members[i]])

    def stop(self) -> None:
        for m in self.members:
            m.stop()

    def __enter__(self) -> "EtcdCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["EtcdCluster", "EtcdMember", "etcd_binary", "INSTALL_HINT"]
