"""The connection limits one by one, on real sockets: the metrics server's total and
per-host caps and its deadline, the RPC server's per-host handshake cap and its
connection budget (authenticated connections count until they close), and the
process budget's size."""
from __future__ import annotations

import resource
import socket
import time
import urllib.request

import pytest

from node.metrics import Metrics, MetricsServer
from node.rpc import RpcServer
from node.wire import Channel
from transfer import frames, listener
from transfer.errors import RemoteError
from transfer.frames import ErrorCode
from transfer.listener import ConnectionBudget, HandshakeGate

from nodeharness import free_port

SECRET = b"d2a97c41e6b03f58a1c7e94d20b6f35e"
OTHER = "127.0.0.2"          # another peer host on loopback
pytestmark = pytest.mark.timeout(60)


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), source_address=(source, 0), timeout=5)
    return s


def read_all(s: socket.socket, timeout: float = 5.0) -> bytes:
    s.settimeout(timeout)
    out = b""
    while True:
        b = s.recv(65536)
        if not b:
            return out
        out += b


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


@pytest.fixture
def metrics_server():
    port = free_port()
    srv = MetricsServer(f"127.0.0.1:{port}", Metrics(), max_connections=6, per_peer=3, deadline=1.0,
                        budget=ConnectionBudget(100, 100))
    yield srv, port
    srv.shutdown()


def test_metrics_per_peer_cap_refuses_with_503_and_others_still_scrape(metrics_server) -> None:
    srv, port = metrics_server
    idle = [connect(port, OTHER) for _ in range(3)]
    time.sleep(0.3)
    over = connect(port, OTHER)
    answer = read_all(over)
    assert answer.startswith(b"HTTP/1.0 503") and f"from {OTHER} (3)".encode() in answer, answer
    assert "ferry_node_updates_total" in scrape(port)          # another host is served
    for s in idle + [over]:
        s.close()


def test_metrics_total_cap(metrics_server) -> None:
    srv, port = metrics_server
    idle = [connect(port, OTHER) for _ in range(3)] + [connect(port, "127.0.0.3") for _ in range(3)]
    time.sleep(0.3)
    answer = read_all(connect(port, "127.0.0.4"))
    assert answer.startswith(b"HTTP/1.0 503") and b"too many metrics connections (6)" in answer, answer
    for s in idle:
        s.close()


def test_metrics_idle_and_trickling_connections_closed_at_the_deadline(metrics_server) -> None:
    srv, port = metrics_server
    idle = connect(port)
    drip = connect(port)
    t0 = time.monotonic()
    drip.sendall(b"GET /met")
    time.sleep(0.6)
    drip.sendall(b"rics HTTP/1.0\r\n")       # still incomplete; each byte within the read timeout
    assert read_all(idle) == b"" and read_all(drip) == b""
    assert time.monotonic() - t0 < 3.0
    # and their places are free again
    deadline = time.monotonic() + 3
    while srv.httpd._open and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not srv.httpd._open
    assert "ferry_node_updates_total" in scrape(port)


def test_metrics_connections_count_in_the_process_budget() -> None:
    port = free_port()
    budget = ConnectionBudget(2, 2)
    srv = MetricsServer(f"127.0.0.1:{port}", Metrics(), budget=budget)
    try:
        idle = [connect(port) for _ in range(2)]
        time.sleep(0.3)
        assert budget.open == 2
        assert b"too many open connections (2)" in read_all(connect(port))
        for s in idle:
            s.close()
        deadline = time.monotonic() + 5
        while budget.open and time.monotonic() < deadline:
            time.sleep(0.05)
        assert budget.open == 0
        assert "ferry_node_updates_total" in scrape(port)
    finally:
        srv.shutdown()


def rpc(budget: ConnectionBudget, **kw) -> RpcServer:
    srv = RpcServer(f"127.0.0.1:{free_port()}", SECRET, lambda m, a, r: {"m": m}, budget=budget, **kw)
    srv.start()
    return srv


def busy(s: socket.socket) -> str:
    """The message of the ERROR BUSY the server answered ``s`` with."""
    s.settimeout(5)
    with pytest.raises(RemoteError) as ei:
        frames.read_frame(frames_conn(s))
    assert ei.value.code == ErrorCode.BUSY
    return str(ei.value)


def frames_conn(s: socket.socket):
    from transfer.transport import SocketConn
    return SocketConn(s, "server")


def test_rpc_per_peer_handshake_cap() -> None:
    srv = rpc(ConnectionBudget(100, 100), max_handshakes_per_peer=2, handshake_timeout=5)
    try:
        idle = [connect(srv.port, OTHER) for _ in range(2)]
        time.sleep(0.3)
        assert f"too many connections from {OTHER} waiting to authenticate (2)" in busy(connect(srv.port, OTHER))
        ch = Channel(f"127.0.0.1:{srv.port}", SECRET, role="client", timeout=5)   # another host
        assert ch.call("ping") == {"m": "ping"}
        ch.close()
        for s in idle:
            s.close()
    finally:
        srv.stop()


def test_rpc_budget_counts_authenticated_connections_until_they_close() -> None:
    budget = ConnectionBudget(3, 3)
    srv = rpc(budget)
    try:
        chans = [Channel(f"127.0.0.1:{srv.port}", SECRET, role="client", timeout=5) for _ in range(3)]
        for ch in chans:
            assert ch.call("ping") == {"m": "ping"}
        assert budget.open == 3
        assert "too many open connections (3)" in busy(connect(srv.port))
        chans.pop().close()
        deadline = time.monotonic() + 5
        while budget.open > 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        ch = Channel(f"127.0.0.1:{srv.port}", SECRET, role="client", timeout=5)
        assert ch.call("ping") == {"m": "ping"}
        for c in chans + [ch]:
            c.close()
    finally:
        srv.stop()
    deadline = time.monotonic() + 5
    while budget.open and time.monotonic() < deadline:
        time.sleep(0.05)
    assert budget.open == 0


def test_rpc_idle_unauthenticated_connection_closed_at_the_deadline() -> None:
    budget = ConnectionBudget(100, 100)
    srv = rpc(budget, handshake_timeout=1.0)
    try:
        s = connect(srv.port, OTHER)
        t0 = time.monotonic()
        assert read_all(s) == b""
        assert time.monotonic() - t0 < 3.0
        deadline = time.monotonic() + 3
        while budget.open and time.monotonic() < deadline:
            time.sleep(0.05)
        assert budget.open == 0 and srv.gate.pending == 0
    finally:
        srv.stop()


def test_budget_per_host_and_total() -> None:
    b = ConnectionBudget(3, 2)
    assert b.take("a") is None and b.take("a") is None
    assert b.take("a") == "too many connections from a (2)"
    assert b.take("b") is None
    assert b.take("c") == "too many open connections (3)"
    b.give("a")
    assert b.take("c") is None and b.held("a") == 1 and b.open == 3
    assert b.take("") == "too many open connections (3)"      # unknown host: the total only
    with pytest.raises(ValueError, match="at least 1"):
        ConnectionBudget(0, 1)


def test_gate_without_peer_counts_in_the_budget_total_only() -> None:
    b = ConnectionBudget(3, 1)
    g = HandshakeGate(10, budget=b)
    assert all(g.enter() for _ in range(3))            # per_peer 1 does not apply to ""
    assert not g.enter() and "too many open connections" in g.why
    g.leave()
    assert b.open == 2 and g.pending == 2
    with pytest.raises(ValueError, match="max_handshakes_per_peer"):
        HandshakeGate(4, per_peer=0)


def test_process_budget_is_a_share_of_the_descriptor_limit() -> None:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    want = max(listener.MIN_CONNECTIONS, int(soft * listener.CONNECTION_SHARE))
    assert listener.connection_limit() == want
    budget = listener.process_budget()
    assert budget is listener.process_budget()
    assert budget.total <= max(listener.MIN_CONNECTIONS, soft // 2)
