"""The handshake key is derived from the secret with scrypt: one recorded exchange (or
the CHALLENGE any stranger gets for a HELLO) lets an attacker check a guess of the
secret only by paying the derivation, and a process pays it once per secret."""
from __future__ import annotations

import hashlib
import hmac
import socket
import threading
import time

import pytest

from transfer import auth, frames
from transfer.errors import AuthError, RemoteError
from transfer.frames import ErrorCode, FrameType
from transfer.transport import SocketConn

SECRET = b"c41f9a0e7d2b58e63a9f1c0d4b7e25a8"


def record_exchange(secret: bytes) -> tuple[dict, dict]:
    """A complete, successful handshake over a socket pair; returns the HELLO and the
    CHALLENGE bodies as they crossed the wire."""
    a, b = socket.socketpair()
    client, server = SocketConn(a, "client"), SocketConn(b, "server")
    seen: dict[str, dict] = {}
    real_read = frames.read_frame

    def spy(conn, *args, **kw):
        fr = real_read(conn, *args, **kw)
        seen[FrameType(fr.type).name] = dict(fr.body)
        return fr

    out: dict = {}

    def serve() -> None:
        out["role"] = auth.server_handshake(server, secret)

    t = threading.Thread(target=serve)
    orig = auth.read_frame
    auth.read_frame = spy             # both sides read through the spy: the wire's frames
    try:
        t.start()
        auth.client_handshake(client, secret, role="node")
        t.join(10)
    finally:
        auth.read_frame = orig
        client.close()
        server.close()
    assert out == {"role": "node"}
    return seen["HELLO"], seen["CHALLENGE"]


def guess_matches(guess: bytes, hello: dict, challenge: dict) -> bool:
    """The attacker's offline check of one guess against a recorded exchange."""
    key = auth.derive_key(guess)
    want = hmac.new(key, b"ferry-server\0" + hello["nonce"] + challenge["nonce"] + hello["role"].encode(),
                    hashlib.sha256).digest()
    return hmac.compare_digest(want, challenge["mac"])


def test_recorded_exchange_needs_the_kdf_for_every_guess() -> None:
    hello, challenge = record_exchange(SECRET)
    assert hello["kdf"] == challenge["kdf"] == auth.KDF_ID
    # the right guess is confirmed, a wrong one is not
    assert guess_matches(SECRET, hello, challenge)
    assert not guess_matches(SECRET[::-1], hello, challenge)
    # the fast check (HMAC under the secret itself, what the exchange allowed before)
    # no longer confirms even the right secret: there is no shortcut around the KDF
    fast = hmac.new(SECRET, b"ferry-server\0" + hello["nonce"] + challenge["nonce"] + b"node",
                    hashlib.sha256).digest()
    assert fast != challenge["mac"]
    # and one guess costs the KDF: >= 16 MiB by its parameters, tens of ms of CPU
    assert 128 * auth.KDF_N * auth.KDF_R >= 16 << 20
    t0 = time.process_time()
    guess_matches(b"another guess, not cached anywhere", hello, challenge)
    cost = time.process_time() - t0
    assert cost >= 0.03, f"one guess cost only {cost * 1000:.1f} ms of CPU"


def test_key_derived_once_per_process_not_per_connection(monkeypatch) -> None:
    calls: list[bytes] = []
    real = auth.derive_key

    def counting(secret: bytes) -> bytes:
        calls.append(secret)
        return real(secret)
    monkeypatch.setattr(auth, "derive_key", counting)
    fresh = b"7a03e9c5d18f42b6e0c97d3a5f1b8e24"
    auth._keys.pop(fresh, None)
    for _ in range(10):
        a, b = socket.socketpair()
        out: dict = {}
        t = threading.Thread(target=lambda o=out, sock=b: o.update(
            role=auth.server_handshake(SocketConn(sock, "s"), fresh)))
        t.start()
        auth.client_handshake(SocketConn(a, "c"), fresh, role="client")
        t.join(10)
        a.close()
        b.close()
        assert out == {"role": "client"}
    assert calls == [fresh]           # both sides, ten connections: one derivation


def test_concurrent_first_handshakes_share_one_derivation(monkeypatch) -> None:
    calls: list[bytes] = []
    real = auth.derive_key
    monkeypatch.setattr(auth, "derive_key", lambda s: calls.append(s) or real(s))
    fresh = b"e58b1d7f20a94c6e3b0d8f72a1c5e946"
    auth._keys.pop(fresh, None)
    keys: list[bytes] = []
    threads = [threading.Thread(target=lambda: keys.append(auth.handshake_key(fresh))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert calls == [fresh] and len(set(keys)) == 1 and len(keys) == 8


def test_server_refuses_another_key_derivation_by_name() -> None:
    a, b = socket.socketpair()
    c, s = SocketConn(a, "client"), SocketConn(b, "server")
    out: dict = {}

    def serve() -> None:
        try:
            auth.server_handshake(s, SECRET)
        except AuthError as e:
            out["error"] = e
    t = threading.Thread(target=serve)
    t.start()
    frames.write_frame(c, FrameType.HELLO, {"nonce": b"n" * 32, "role": "node", "kdf": "argon2id:m=64M"})
    with pytest.raises(RemoteError, match="same Ferry version") as ei:
        frames.read_frame(c)
    t.join(10)
    assert ei.value.code == ErrorCode.AUTH
    assert "argon2id" in str(out["error"])


def test_client_names_a_server_without_key_derivation() -> None:
    """A server that answers with a CHALLENGE naming no KDF (an older Ferry, whose MAC
    is under the raw secret) gets a message saying so, not "wrong secret"."""
    a, b = socket.socketpair()
    c, s = SocketConn(a, "client"), SocketConn(b, "server")

    def old_server() -> None:
        hello = frames.read_frame(s)
        ns = b"s" * 32
        mac = hmac.new(SECRET, b"ferry-server\0" + hello.body["nonce"] + ns + b"node", hashlib.sha256).digest()
        frames.write_frame(s, FrameType.CHALLENGE, {"nonce": ns, "mac": mac})
        try:
            frames.read_frame(s)
        except RemoteError:
            pass
    t = threading.Thread(target=old_server)
    t.start()
    with pytest.raises(AuthError, match="derives the handshake key differently"):
        auth.client_handshake(c, SECRET, role="node")
    t.join(10)
