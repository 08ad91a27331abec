"""Listening ports for processes started on loopback (local clusters, the harness,
etcd members, tests).

A port is picked now and listened on later by another process, so it must not be
taken in between. Asking the kernel for port 0 gives a port from its ephemeral
range, the same range every outgoing connection takes its local port from: on a busy
machine a client connection can take the port before the new process listens on it
("Address already in use"). Ports are therefore picked at random *below* the
ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``), where the kernel never
hands ports out on its own, and checked free by binding them once. A process never
hands out the same port twice.
"""
from __future__ import annotations

import random
import socket
import threading

# Below this, ports belong to well-known services (etcd 2379/2380, Spark 7077, ...).
LOWEST = 10000
_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"

_given: set[int] = set()
_lock = threading.Lock()
_random = random.SystemRandom()


def ephemeral_range(path: str = _RANGE_FILE) -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections."""
    try:
        with open(path) as f:
            lo, hi = (int(x) for x in f.read().split()[:2])
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999   # Linux's default


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that nothing listens on or connects from now and that the
    kernel will not give to an outgoing connection. Falls back to the kernel's choice
    when the range below the ephemeral one is too small or full."""
    lo, _ = ephemeral_range()
    with _lock:
        if lo - LOWEST >= 1000:
            for _ in range(200):
                port = _random.randrange(LOWEST, lo)
                if port not in _given and _bindable(host, port):
                    _given.add(port)
                    return port
        while True:
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
            if port not in _given:
                _given.add(port)
                return port
