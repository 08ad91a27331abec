"""Multi-host mode: each node in its own network namespace (``ip netns``), linked to
the host by a veth pair on its own /30; the host routes between them (ip_forward on
for the run, restored after). Nodes then talk over real interfaces with real
addresses, not loopback. Needs root and a kernel that permits namespaces:
:func:`permitted` says why not when it cannot run.

Used through :func:`cluster_sim.run`'s ``net=`` (``prefix`` runs a process in its
namespace, ``host`` is the address it listens on).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import uuid

from .errors import SimError

FORWARD = "/proc/sys/net/ipv4/ip_forward"


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if r.returncode != 0:
        raise SimError(f"ip {' '.join(args)}: {r.stderr.strip()}")


def permitted() -> tuple[bool, str]:
    """(True, "") when namespaces + veth can be made here; else (False, why)."""
    if shutil.which("ip") is None:
        return False, "the 'ip' command (iproute2) is not installed"
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    name = "fsimprobe" + uuid.uuid4().hex[:6]
    try:
        _ip("netns", "add", name)
        try:
            _ip("link", "add", name[:12] + "h", "type", "veth", "peer", "name", name[:12] + "n")
            _ip("link", "del", name[:12] + "h")
        finally:
            _ip("netns", "del", name)
    except SimError as e:
        return False, f"this machine does not permit namespaces/veth: {e}"
    return True, ""


class Netns:
    """Namespaces for ``nodes``; a context manager that removes them at exit."""

    def __init__(self, nodes: list[str]) -> None:
        self.tag = uuid.uuid4().hex[:4]
        self.index = {n: i + 1 for i, n in enumerate(nodes)}
        self._forward: str | None = None

    def ns(self, node: str) -> str:
        return f"fsim{self.tag}{self.index[node]}"

    def host(self, node: str) -> str:
        return f"10.77.{self.index[node]}.2"

    def gateway(self, node: str) -> str:
        """The host's end of the node's veth: what the node reaches the host on (the
        run's etcd listens on the host's loopback; a proxy here forwards to it)."""
        return f"10.77.{self.index[node]}.1"

    def prefix(self, node: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns(node)]

    def __enter__(self) -> Netns:
        with open(FORWARD) as f:
            self._forward = f.read().strip()
        with open(FORWARD, "w") as f:
            f.write("1")
        try:
            for node, i in self.index.items():
                ns, hv, nv = self.ns(node), f"fsh{self.tag}{i}", f"fsn{self.tag}{i}"
                _ip("netns", "add", ns)
                _ip("link", "add", hv, "type", "veth", "peer", "name", nv)
                _ip("link", "set", nv, "netns", ns)
                _ip("addr", "add", f"10.77.{i}.1/30", "dev", hv)
                _ip("link", "set", hv, "up")
                _ip("-n", ns, "addr", "add", f"10.77.{i}.2/30", "dev", nv)
                _ip("-n", ns, "link", "set", nv, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "route", "add", "default", "via", f"10.77.{i}.1")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for node in self.index:
            subprocess.run(["ip", "netns", "del", self.ns(node)], capture_output=True, timeout=10)
        if self._forward is not None:
            with open(FORWARD, "w") as f:
                f.write(self._forward)
