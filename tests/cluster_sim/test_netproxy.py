"""The loopback proxy forwards, delays, cuts (now or after N bytes) and heals."""
from __future__ import annotations

import os
import socket
import threading

import pytest

from cluster_sim import Proxy


@pytest.fixture
def echo():
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=lambda c=c: _echo(c), daemon=True).start()
    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()
    srv.close()


def _echo(c: socket.socket) -> None:
    try:
        while data := c.recv(65536):
            c.sendall(data)
    except OSError:
        pass
    finally:
        c.close()


def _roundtrip(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        got = b""
        while len(got) < len(data):
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        return got


def test_forward_cut_heal(echo) -> None:
    px = Proxy(echo).start()
    try:
        assert _roundtrip(px.port, b"hello" * 1000) == b"hello" * 1000
        px.cut()
        assert _roundtrip(px.port, b"x" * 10) == b""       # refused while cut
        assert px.refused >= 1
        px.heal()
        px.delay(0.01)
        assert _roundtrip(px.port, b"again") == b"again"
    finally:
        px.stop()


def test_cut_after_bytes_breaks_a_stream_midway(echo) -> None:
    px = Proxy(echo).start()
    try:
        px.cut_after(100_000)
        got = _roundtrip(px.port, b"y" * 400_000)
        assert 0 < len(got) < 400_000 and px.cuts == 1
    finally:
        px.stop()


def test_block_cuts_only_the_named_process(echo) -> None:
    px = Proxy(echo).start()
    try:
        held = socket.create_connection(("127.0.0.1", px.port), timeout=5)
        held.sendall(b"a")
        assert held.recv(10) == b"a"
        px.block({os.getpid() + 10_000_000})            # another process: we pass
        assert _roundtrip(px.port, b"pass") == b"pass"
        px.block({os.getpid()})                          # us: our open connection is cut ...
        held.settimeout(5)
        assert held.recv(10) == b""
        assert _roundtrip(px.port, b"x") == b""          # ... and new ones refused
        px.unblock()
        assert _roundtrip(px.port, b"back") == b"back"
        held.close()
    finally:
        px.stop()
