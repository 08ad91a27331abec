"""What a failed call says about its request (node/wire.py): a handshake the network
cut is a retryable connection error (``unavailable``, ``refused``), not ``AuthFailed``;
a wrong secret still is ``AuthFailed``; a reply lost after the request left is
``unknown``; error replies carry the outcome across the wire.

Real sockets on loopback: a real RpcServer, and small servers that cut the handshake
(close after the HELLO, reset with SO_LINGER 0, never answer) or drop the reply.
"""
from __future__ import annotations

import socket
import struct
import threading
from typing import Callable, Iterator

import pytest

from node.client import Client
from node.cluster_map import ClusterMap, Member
from node.config import CacheConfig
from node.errors import REFUSED, UNKNOWN, AuthFailed, NodeError, Unavailable
from node.rpc import RpcServer
from node.wire import Channel, error_body, raise_remote
from transfer import frames

from nodeharness import free_port, write_secret

SECRET = b"5e8a1f47c90d3b26e4a7f01c8d5b92e6"
pytestmark = pytest.mark.timeout(60)


class Cutter:
    """A TCP server that accepts and then does ``how`` to each connection."""

    def __init__(self, how: Callable[[socket.socket], None]) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.how = how
        self.accepted = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                s, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._one, args=(s,), daemon=True).start()

    def _one(self, s: socket.socket) -> None:
        try:
            self.how(s)
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()


def close_after_hello(s: socket.socket) -> None:
    s.recv(4096)
    s.close()


def reset_after_hello(s: socket.socket) -> None:
    s.recv(4096)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def silent(s: socket.socket) -> None:
    s.recv(4096)
    threading.Event().wait(5)
    s.close()


@pytest.fixture
def cutter(request) -> Iterator[Cutter]:
    c = Cutter(request.param)
    yield c
    c.close()


def _dispatch(method: str, args: dict, role: str) -> object:
    if method == "get_map":
        return MAP.to_wire()
    if method == "boom":
        raise RuntimeError("midway")
    return {"m": method}


@pytest.fixture
def rpc() -> Iterator[RpcServer]:
    srv = RpcServer(f"127.0.0.1:{free_port()}", SECRET, _dispatch, handshake_timeout=3.0)
    srv.start()
    yield srv
    srv.stop()


MAP = ClusterMap({"default": CacheConfig(name="default", partitions=4, backups=1)})


@pytest.mark.parametrize("cutter", [close_after_hello, reset_after_hello, silent], indirect=True)
def test_a_handshake_the_network_cuts_is_a_retryable_connection_error(cutter: Cutter) -> None:
    with pytest.raises(NodeError) as ei:
        Channel(cutter.address, SECRET, role="client", timeout=1.0)
    e = ei.value
    assert not isinstance(e, AuthFailed), f"a cut handshake raised AuthFailed: {e}"
    assert isinstance(e, Unavailable) and e.retry and e.outcome == REFUSED
    assert "cut" in str(e)


def test_a_wrong_secret_is_still_auth_failed(rpc: RpcServer) -> None:
    with pytest.raises(AuthFailed):
        Channel(f"127.0.0.1:{rpc.port}", b"another-secret-0123456789abcdefgh", role="client")
    ch = Channel(f"127.0.0.1:{rpc.port}", SECRET, role="client")     # the right one works
    assert ch.call("ping") == {"m": "ping"}
    ch.close()


@pytest.mark.parametrize("cutter", [reset_after_hello], indirect=True)
def test_the_client_tries_the_next_seed_after_a_cut_handshake(cutter: Cutter, rpc: RpcServer,
                                                               tmp_path) -> None:
    """Before, a cut handshake on the first seed raised AuthFailed from refresh() at
    once, and the client never asked the second seed."""
    global MAP
    MAP = ClusterMap({"default": CacheConfig(name="default", partitions=4, backups=1)})
    MAP.members["n1"] = Member("n1", f"127.0.0.1:{rpc.port}", order=1)
    secret = write_secret(str(tmp_path / "secret"), SECRET.decode())
    with Client([cutter.address, f"127.0.0.1:{rpc.port}"], secret_file=secret, timeout=5) as c:
        m = c.refresh()
    assert cutter.accepted >= 1 and "n1" in m.members


def test_a_reply_lost_after_the_request_left_is_unknown() -> None:
    """The server authenticates, reads the request and closes without a reply."""
    from transfer import auth
    from transfer.transport import SocketConn

    def serve(s: socket.socket) -> None:
        conn = SocketConn(s, "test")
        auth.server_handshake(conn, SECRET)
        frames.read_frame(conn)
        s.close()
    srv = Cutter(serve)
    try:
        ch = Channel(srv.address, SECRET, role="client", timeout=2.0)
        with pytest.raises(Unavailable) as ei:
            ch.call("put", cache="default", key=b"k", value=b"v")
        assert ei.value.outcome == UNKNOWN and ei.value.retry
    finally:
        srv.close()


def test_error_replies_carry_the_outcome(rpc: RpcServer) -> None:
    assert error_body(Unavailable("x"))["outcome"] == REFUSED
    assert error_body(Unavailable("x").maybe_applied())["outcome"] == UNKNOWN
    assert error_body(RuntimeError("x"))["outcome"] == UNKNOWN
    for body, want in (({"code": "unavailable", "message": "m", "outcome": "refused"}, REFUSED),
                       ({"code": "unavailable", "message": "m", "outcome": "unknown"}, UNKNOWN),
                       ({"code": "not_primary", "message": "m", "outcome": "refused"}, REFUSED),
                       ({"code": "unavailable", "message": "m"}, UNKNOWN)):   # an older peer
        with pytest.raises(NodeError) as ei:
            raise_remote(body)
        assert ei.value.outcome == want
    ch = Channel(f"127.0.0.1:{rpc.port}", SECRET, role="client")
    with pytest.raises(NodeError) as ei:
        ch.call("boom")                     # a handler that failed midway: unknown
    assert ei.value.code == "internal" and ei.value.outcome == UNKNOWN
    ch.close()
