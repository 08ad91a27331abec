"""The node's RPC port against hostile or unlucky clients (node.rpc.RpcServer with a
trivial dispatch; no node behind it).

- accept() failing with EMFILE used to end the accept thread silently: the process
  lived on and never served RPC again (a real process with RLIMIT_NOFILE lowered);
- unauthenticated connections are capped, the rest answered BUSY;
- one byte every 0.3 s no longer keeps a connection past the handshake deadline;
- a FIFO as secret file no longer blocks the node's start;
- hypothesis: garbage, mutated handshakes and REQUEST frames against the live server.
"""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from node.errors import AuthFailed
from node.rpc import RpcServer
from node.wire import Channel, NodeFrame, load_secret
from transfer import frames
from transfer.errors import RemoteError
from transfer.frames import ErrorCode, FrameType
from transfer.transport import SocketConn

from nodeharness import free_port
from transfer_helpers import drip, expect_line, log_lines, wait_until
from wire_fuzz import HANDSHAKE_BODIES, body_for, exchange, names, streams, values

SECRET = b"5e8a1f47c90d3b26e4a7f01c8d5b92e6"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.timeout(120)


def _echo(method: str, args: dict, role: str) -> dict:
    if method == "boom":
        raise RuntimeError("handler failed")
    return {"m": method, "a": args, "role": role}


@pytest.fixture
def rpc():
    srv = None
    for _ in range(5):                    # a free port can be taken between probe and bind
        try:
            srv = RpcServer(f"127.0.0.1:{free_port()}", SECRET, _echo, handshake_timeout=3.0,
                            max_handshakes=8)
            break
        except Exception:
            continue
    assert srv is not None
    srv.start()
    yield srv
    srv.stop()


def _call(port: int, **args) -> dict:
    ch = Channel(f"127.0.0.1:{port}", SECRET, role="client", timeout=5)
    try:
        return ch.call("echo", **args)
    finally:
        ch.close()


def _rpc_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("rpc-127.")}


def test_unauthenticated_connections_are_capped(rpc) -> None:
    # threads of connections that earlier tests in this process left winding down are
    # not this server's: count only the ones that appear here
    before = _rpc_threads()
    idle = [socket.create_connection(("127.0.0.1", rpc.port)) for _ in range(8)]
    try:
        assert wait_until(lambda: rpc.gate.pending == 8)
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", rpc.port), timeout=5)
            with pytest.raises(RemoteError) as ei:
                frames.read_frame(SocketConn(s))
            assert ei.value.code == ErrorCode.BUSY
            s.close()
        assert len(_rpc_threads() - before) <= 8
    finally:
        for s in idle:
            s.close()
    assert wait_until(lambda: rpc.gate.pending == 0)
    assert _call(rpc.port, x=1)["a"] == {"x": 1}


def test_whole_handshake_has_one_deadline() -> None:
    srv = RpcServer(f"127.0.0.1:{free_port()}", SECRET, _echo, handshake_timeout=1.0)
    srv.start()
    try:
        hello = frames.encode(FrameType.HELLO, {"nonce": b"n" * 32, "role": "client"})
        closed, took = drip(("127.0.0.1", srv.port), hello, 0.3)   # one byte every 0.3 s
        assert closed and took < 2.5
        assert _call(srv.port, y=2)["a"] == {"y": 2}
    finally:
        srv.stop()


@pytest.mark.parametrize("kind", ["FIFO", "directory"])
def test_load_secret_refuses_special_files_at_once(tmp_path, kind) -> None:
    p = tmp_path / "secret"
    os.mkfifo(p, 0o600) if kind == "FIFO" else os.mkdir(p, 0o700)
    out: dict = {}

    def load() -> None:
        try:
            load_secret(str(p))
        except AuthFailed as e:
            out["error"] = e
    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "load_secret blocked on the secret file"
    assert kind in str(out["error"])


# -- running out of file descriptors (a real process) --------------------------------
SERVER = r"""
import logging, os, socket, sys, time
sys.path.insert(0, sys.argv[1])
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
from node.rpc import RpcServer
from node.listen_ports import free_port
port = free_port()
srv = RpcServer(f"127.0.0.1:{port}", sys.argv[2].encode(), lambda m, a, r: {"m": m})
srv.start()
probe = os.open(os.devnull, os.O_RDONLY)    # the lowest free descriptor
os.close(probe)
import resource
resource.setrlimit(resource.RLIMIT_NOFILE, (probe + 6, probe + 6))   # room for a few connections
print(port, flush=True)
while True:
    time.sleep(1)
"""


def test_rpc_survives_running_out_of_file_descriptors(tmp_path) -> None:
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([sys.executable, "-c", SERVER, ROOT, SECRET.decode()], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    idle: list[socket.socket] = []
    seen: list[str] = []
    try:
        port = int(proc.stdout.readline())
        q = log_lines(proc.stderr)
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        time.sleep(2)                 # accept() fails with EMFILE meanwhile, again and again
        assert proc.poll() is None
        for s in idle:
            s.close()
        idle = []
        ch = Channel(f"127.0.0.1:{port}", SECRET, role="client", timeout=10)
        assert ch.call("ping") == {"m": "ping"}        # it serves RPC again
        ch.close()
        expect_line(q, "accepting connections again", 10, seen)
        assert sum("accept() failed" in ln for ln in seen) == 1, "".join(seen)   # logged once
    finally:
        for s in idle:
            s.close()
        proc.kill()
        proc.wait(10)


# -- fuzz --------------------------------------------------------------------------------
FUZZ = settings(max_examples=80, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
RPC_SENDS = {FrameType.CHALLENGE, FrameType.AUTH_OK, FrameType.ERROR, NodeFrame.REPLY}
REQUEST_BODIES = {NodeFrame.REQUEST: body_for({"id": st.integers(-5, 2**64 - 1), "m": names | st.just("boom"),
                                               "a": st.dictionaries(st.text(max_size=6), values, max_size=4)})}


def _check(back, rid_ok: bool = True) -> None:
    for fr in back:
        assert fr.type in RPC_SENDS, fr
        if fr.type == FrameType.ERROR:
            assert fr.body["code"] in set(ErrorCode), fr
        if fr.type == NodeFrame.REPLY:
            assert isinstance(fr.body.get("ok"), bool), fr
            if not fr.body["ok"]:
                assert isinstance(fr.body["e"]["code"], str) and isinstance(fr.body["e"]["message"], str)


def _serving_after(rpc, caplog) -> None:
    assert wait_until(lambda: rpc.gate.pending == 0)
    assert _call(rpc.port, z=3)["a"] == {"z": 3}
    unexpected = [r.getMessage() for r in caplog.records
                  if r.exc_info and "handler 'boom' failed" not in r.getMessage()]
    assert unexpected == []


def test_fuzz_before_the_handshake(rpc, caplog) -> None:
    @FUZZ
    @given(streams(list(HANDSHAKE_BODIES) + [NodeFrame.REQUEST, FrameType.ERROR], HANDSHAKE_BODIES))
    def one(payload: bytes) -> None:
        _check(exchange(("127.0.0.1", rpc.port), payload))

    with caplog.at_level(logging.WARNING):
        one()
    _serving_after(rpc, caplog)


def test_fuzz_requests(rpc, caplog) -> None:
    """Authenticated, then REQUEST frames (and anything else): every well-framed REQUEST
    gets a REPLY, a broken frame an ERROR and the close."""
    seen: set[int] = set()

    @FUZZ
    @example(frames.encode(NodeFrame.REQUEST, {"id": 1, "m": "echo", "a": {"k": [1, b"x"]}})
             + frames.encode(NodeFrame.REQUEST, {"id": 2, "m": "boom", "a": {}}))
    @given(streams([NodeFrame.REQUEST, NodeFrame.REQUEST, NodeFrame.REPLY, FrameType.HELLO], REQUEST_BODIES))
    def one(payload: bytes) -> None:
        back = exchange(("127.0.0.1", rpc.port), payload, secret=SECRET, role="client")
        _check(back)
        seen.update(fr.type for fr in back)

    with caplog.at_level(logging.WARNING):
        one()
    assert {NodeFrame.REPLY, FrameType.ERROR} <= seen
    _serving_after(rpc, caplog)
