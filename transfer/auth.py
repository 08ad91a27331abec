"""Mutual challenge-response authentication with the cluster secret (HMAC-SHA256).

Reusable by every Ferry connection (node-to-node, client-to-node): call
:func:`client_handshake` on the connecting side and :func:`server_handshake` on the
accepting side, right after connecting and before anything else is read or written.

::

    client -> HELLO     {"nonce": Nc, "role": r}
    server -> CHALLENGE {"nonce": Ns, "mac": HMAC(K, "ferry-server\\0" | Nc | Ns | r)}
    client    checks the server's mac (a server without K is refused here)
    client -> RESPONSE  {"mac": HMAC(K, "ferry-client\\0" | Ns | Nc | r)}
    server    checks the client's mac
    server -> AUTH_OK   {}

Both nonces are 32 fresh random bytes, so a recorded handshake replayed against either
side fails: the replayed mac covers the other side's old nonce. The two labels keep a
server's answer from being reflected back to it as a client response. The secret never
crosses the wire and never appears on a command line: :func:`load_secret` reads it from
a file or an environment variable.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat

from . import safefs
from .errors import AuthError, FrameError, PeerClosed, RemoteError, UnsafePath
from .frames import ErrorCode, FrameType, read_frame, send_error, write_frame
from .transport import Conn

NONCE_SIZE = 32
SECRET_ENV = "FERRY_SECRET"
MIN_SECRET = 16          # bytes; shorter secrets are guessable offline from one handshake
MAX_SECRET_FILE = 64 << 10   # a secret is a line; anything this big is the wrong file
# Frames a server reads before the peer has proved the secret are tiny (HELLO is about
# 80 bytes, RESPONSE about 50): strangers must not make it buffer a full 1 MiB frame.
HANDSHAKE_MAX_PAYLOAD = 4096
HANDSHAKE_DEADLINE = 10.0    # seconds for the whole handshake, however the bytes trickle in
_SERVER_LABEL = b"ferry-server\0"
_CLIENT_LABEL = b"ferry-client\0"


def load_secret(path: str | None = None, *, env: str = SECRET_ENV) -> bytes:
    """The cluster secret from ``path`` (whitespace stripped) or else ``$env``.

    The file must be a regular file (a symlink to one is fine: mounted secrets are
    links); a FIFO or device is refused at once instead of blocking the process, and
    its mode is checked on the file actually read."""
    if path:
        try:
            raw, st = safefs.read_small(path, MAX_SECRET_FILE, follow=True)
        except UnsafePath as e:
            raise AuthError(f"secret file {e.reason}; point --secret-file at the secret itself") from None
        except OSError as e:
            raise AuthError(f"cannot read secret file {path}: {e.strerror}") from None
        data = raw.strip()
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise AuthError(f"secret file {path} is readable by group/others (mode "
                            f"{stat.S_IMODE(st.st_mode):o}); chmod 600 it")
    elif os.environ.get(env):
        data = os.environ[env].encode().strip()
    else:
        raise AuthError(f"no cluster secret: pass --secret-file or set ${env}")
    if len(data) < MIN_SECRET:
        raise AuthError(f"cluster secret is {len(data)} bytes; use at least {MIN_SECRET}")
    return data


def _mac(secret: bytes, label: bytes, first: bytes, second: bytes, role: str) -> bytes:
    return hmac.new(secret, label + first + second + role.encode(), hashlib.sha256).digest()


def _nonce(body: dict, key: str) -> bytes:
    v = body.get(key)
    if not isinstance(v, bytes) or len(v) != NONCE_SIZE:
        raise FrameError(ErrorCode.PROTOCOL, f"handshake field {key!r} must be {NONCE_SIZE} bytes")
    return v


def client_handshake(conn: Conn, secret: bytes, *, role: str = "transfer") -> None:
    """Authenticate ``conn`` from the connecting side; raises AuthError on failure."""
    nc = secrets.token_bytes(NONCE_SIZE)
    try:
        write_frame(conn, FrameType.HELLO, {"nonce": nc, "role": role})
        ch = read_frame(conn, expect=[FrameType.CHALLENGE])
        ns = _nonce(ch.body, "nonce")
        mac = ch.body.get("mac")
        if not isinstance(mac, bytes) or not hmac.compare_digest(mac, _mac(secret, _SERVER_LABEL, nc, ns, role)):
            send_error(conn, ErrorCode.AUTH, "server failed to prove the cluster secret")
            raise AuthError(f"peer {conn.peer} does not know the cluster secret "
                            "(wrong secret on one side, or not a Ferry node of this cluster)",
                            stage="handshake", peer=conn.peer)
        write_frame(conn, FrameType.RESPONSE, {"mac": _mac(secret, _CLIENT_LABEL, ns, nc, role)})
        read_frame(conn, expect=[FrameType.AUTH_OK])
    except RemoteError as e:
        raise AuthError(f"authentication refused by {conn.peer}: {e.reason}",
                        stage="handshake", peer=conn.peer) from None
    except (FrameError, PeerClosed) as e:
        raise AuthError(f"handshake with {conn.peer} failed: {e.reason}",
                        stage="handshake", peer=conn.peer) from None


def server_handshake(conn: Conn, secret: bytes, *, deadline: float | None = HANDSHAKE_DEADLINE) -> str:
    """Authenticate the connecting peer; returns its role. On failure the peer gets an
    ERROR frame (code AUTH) and AuthError is raised; nothing else was read. The whole
    handshake must end within ``deadline`` seconds (None: only the per-read timeout),
    and its frames are at most HANDSHAKE_MAX_PAYLOAD bytes."""
    conn.set_deadline(deadline)
    try:
        return _server_handshake(conn, secret)
    finally:
        conn.set_deadline(None)


def _server_handshake(conn: Conn, secret: bytes) -> str:
    try:
        hello = read_frame(conn, limit=HANDSHAKE_MAX_PAYLOAD)
        if hello.type != FrameType.HELLO:
            send_error(conn, ErrorCode.AUTH, "authentication required: the first frame must be HELLO")
            raise AuthError(f"peer {conn.peer} sent frame type {hello.type} before authenticating",
                            stage="handshake", peer=conn.peer)
        nc = _nonce(hello.body, "nonce")
        role = hello.body.get("role")
        if not isinstance(role, str) or len(role) > 64:
            raise FrameError(ErrorCode.PROTOCOL, "handshake role must be a short string")
        ns = secrets.token_bytes(NONCE_SIZE)
        write_frame(conn, FrameType.CHALLENGE, {"nonce": ns, "mac": _mac(secret, _SERVER_LABEL, nc, ns, role)})
        resp = read_frame(conn, expect=[FrameType.RESPONSE], limit=HANDSHAKE_MAX_PAYLOAD)
        mac = resp.body.get("mac")
        if not isinstance(mac, bytes) or not hmac.compare_digest(mac, _mac(secret, _CLIENT_LABEL, ns, nc, role)):
            send_error(conn, ErrorCode.AUTH, "wrong cluster secret (or a replayed handshake)")
            raise AuthError(f"peer {conn.peer} failed authentication (wrong secret or replayed handshake)",
                            stage="handshake", peer=conn.peer)
        write_frame(conn, FrameType.AUTH_OK, {})
        return role
    except FrameError as e:
        send_error(conn, e.code, e.reason)
        raise AuthError(f"handshake with {conn.peer} failed: {e.reason}",
                        stage="handshake", peer=conn.peer) from None
    except RemoteError as e:
        raise AuthError(f"peer {conn.peer} aborted the handshake: {e.reason}",
                        stage="handshake", peer=conn.peer) from None
    except PeerClosed as e:
        raise AuthError(f"peer {conn.peer} left during the handshake: {e.reason}",
                        stage="handshake", peer=conn.peer) from None


__all__ = ["client_handshake", "server_handshake", "load_secret", "SECRET_ENV"]
