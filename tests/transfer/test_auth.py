from __future__ import annotations

import os
import socket
import threading

import pytest

from transfer import auth, frames
from transfer.errors import AuthError, RemoteError
from transfer.frames import ErrorCode, FrameType
from transfer.transport import SocketConn

GOOD = b"0f6b2d94c1e87a35b9e04d7c2a61f8e3"   # random: weak secrets are refused


class Recorder(SocketConn):
    """A real socket that also records what this side sent (for the replay test)."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        super().__init__(sock, peer)
        self.sent: list[bytes] = []

    def send(self, data) -> None:
        self.sent.append(bytes(data))
        super().send(data)


def _pair():
    a, b = socket.socketpair()
    return Recorder(a, "client"), Recorder(b, "server")


def _run_server(conn, secret, out: dict) -> threading.Thread:
    def go() -> None:
        try:
            out["role"] = auth.server_handshake(conn, secret)
        except AuthError as e:
            out["error"] = e
    t = threading.Thread(target=go)
    t.start()
    return t


def test_mutual_handshake_ok() -> None:
    c, s = _pair()
    out: dict = {}
    t = _run_server(s, GOOD, out)
    auth.client_handshake(c, GOOD, role="node")
    t.join(5)
    assert out == {"role": "node"}


@pytest.mark.parametrize("client_secret,server_secret", [(GOOD, GOOD[::-1]), (GOOD[::-1], GOOD)])
def test_wrong_secret_refused_on_both_sides(client_secret: bytes, server_secret: bytes) -> None:
    c, s = _pair()
    out: dict = {}
    t = _run_server(s, server_secret, out)
    with pytest.raises(AuthError) as ei:
        auth.client_handshake(c, client_secret)
    t.join(5)
    assert "secret" in str(ei.value) and ei.value.stage == "handshake"
    assert isinstance(out.get("error"), AuthError)
    assert "secret" in str(out["error"]) or "refused" in str(out["error"]) or "aborted" in str(out["error"])


def test_replayed_handshake_refused() -> None:
    # Record a good client's frames, then replay them verbatim against a new session.
    c, s = _pair()
    out: dict = {}
    t = _run_server(s, GOOD, out)
    auth.client_handshake(c, GOOD)
    t.join(5)
    hello, response = c.sent[0], c.sent[1]
    c2, s2 = _pair()
    out2: dict = {}
    t2 = _run_server(s2, GOOD, out2)
    c2.sock.sendall(hello)
    frames.read_frame(c2, expect=[FrameType.CHALLENGE])   # a fresh nonce, unknown to the attacker
    c2.sock.sendall(response)
    with pytest.raises(RemoteError) as ei:
        frames.read_frame(c2)
    t2.join(5)
    assert ei.value.code == ErrorCode.AUTH
    assert "replayed" in str(out2["error"])


def test_no_handshake_refused_nothing_served() -> None:
    c, s = _pair()
    out: dict = {}
    t = _run_server(s, GOOD, out)
    frames.write_frame(c, FrameType.DEMAND, {"cache": "default", "partition": 0})
    with pytest.raises(RemoteError, match="authentication required") as ei:
        frames.read_frame(c)
    t.join(5)
    assert ei.value.code == ErrorCode.AUTH
    assert "before authenticating" in str(out["error"])


def test_malformed_hello_refused() -> None:
    c, s = _pair()
    out: dict = {}
    t = _run_server(s, GOOD, out)
    frames.write_frame(c, FrameType.HELLO, {"nonce": b"short", "role": "x"})
    with pytest.raises(RemoteError, match="32 bytes"):
        frames.read_frame(c)
    t.join(5)
    assert isinstance(out["error"], AuthError)


def test_load_secret(tmp_path, monkeypatch) -> None:
    p = tmp_path / "s"
    p.write_bytes(GOOD + b"\n")
    p.chmod(0o600)
    assert auth.load_secret(str(p)) == GOOD
    p.chmod(0o644)
    with pytest.raises(AuthError, match="chmod 600"):
        auth.load_secret(str(p))
    with pytest.raises(AuthError, match="cannot read secret file"):
        auth.load_secret(str(tmp_path / "missing"))
    monkeypatch.setenv("FERRY_SECRET", GOOD.decode())
    assert auth.load_secret(None) == GOOD
    monkeypatch.setenv("FERRY_SECRET", "short")
    with pytest.raises(AuthError, match="at least"):
        auth.load_secret(None)
    monkeypatch.delenv("FERRY_SECRET")
    with pytest.raises(AuthError, match="no cluster secret"):
        auth.load_secret(None)


def _special(kind: str, path) -> None:
    if kind == "FIFO":
        os.mkfifo(path, 0o600)
    elif kind == "directory":
        os.mkdir(path, 0o700)
    elif kind == "too big":
        path.write_bytes(GOOD * 5000)
        path.chmod(0o600)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind,word", [("FIFO", "FIFO"), ("directory", "directory"),
                                       ("too big", "larger than")])
def test_load_secret_refuses_special_files_at_once(tmp_path, kind, word) -> None:
    """A FIFO as secret file used to block the process for ever (open waits for a writer)."""
    p = tmp_path / "s"
    _special(kind, p)
    out: dict = {}

    def load() -> None:
        try:
            auth.load_secret(str(p))
        except AuthError as e:
            out["error"] = e
    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "load_secret blocked"
    assert word in str(out["error"]), out


def test_load_secret_follows_a_link_to_a_regular_file(tmp_path) -> None:
    """Mounted secrets (Kubernetes ...) are symlinks: those are fine."""
    real = tmp_path / "real"
    real.write_bytes(GOOD + b"\n")
    real.chmod(0o600)
    os.symlink(real, tmp_path / "link")
    assert auth.load_secret(str(tmp_path / "link")) == GOOD
