"""node.wire.Pool does not reuse an idle channel the peer closed: after a peer restart
(same address), the first call goes out on a fresh channel and succeeds. Before, it
failed after it was sent ("connection closed ... after 0 of 12 expected bytes"), and a
primary whose replicate failed so dropped a healthy copy from the in-sync set."""
from __future__ import annotations

from node.rpc import RpcServer
from node.wire import Pool

from nodeharness import free_port

SECRET = b"5e8a1f47c90d3b26e4a7f01c8d5b92e6"


def _server(port: int) -> RpcServer:
    s = RpcServer(f"127.0.0.1:{port}", SECRET, lambda method, args, role: {"m": method, **args})
    s.start()
    return s


def test_a_pooled_channel_closed_by_a_restarted_peer_is_redialled():
    port = free_port()
    s = _server(port)
    pool = Pool(SECRET, role="node", timeout=5.0)
    try:
        assert pool.call(f"127.0.0.1:{port}", "ping", x=1) == {"m": "ping", "x": 1}
        s.stop()                         # closes every connection, the pooled one too
        s = _server(port)                # the peer is back at the same address
        assert pool.call(f"127.0.0.1:{port}", "ping", x=2) == {"m": "ping", "x": 2}
    finally:
        pool.close()
        s.stop()
