"""The node's request/reply protocol over :mod:`transfer.frames`, authenticated by
:mod:`transfer.auth` (the same handshake as the transfer agents).

A connection starts with the mutual HMAC handshake (role ``node`` or ``client``), then
carries frames of two types registered here:

    REQUEST {"id": int, "m": method name, "a": {arguments}}
    REPLY   {"id": int, "ok": true, "r": result}
          | {"id": int, "ok": false, "e": {"code": str, "message": str, "hint": str|None}}

Keys and values travel as msgpack bin. One frame is at most ``frames.MAX_PAYLOAD``
(1 MiB), which bounds requests (see the size limits in docs/node.md) and batches.
A request that is not a well-formed REQUEST gets an error REPLY and the connection
stays usable; a frame that breaks the framing gets an ERROR frame and is closed.

An error REPLY also carries ``outcome``: ``refused`` (the request certainly had no
effect) or ``unknown`` (it may have had one). On the calling side a connection that
fails before the request is sent (the dial, the handshake, the send) is ``unavailable``
and ``refused``; one that fails while the reply is awaited is ``unavailable`` and
``unknown``. A handshake the network cut (reset, closed, timed out) is such a
connection failure, retried like any other; only a peer that fails or refuses the
proof of the secret is ``AuthFailed``.
"""
from __future__ import annotations

import logging
import threading
from enum import IntEnum
from typing import Any, Callable

from transfer import auth as _auth
from transfer import frames
from transfer import tls as _tls
from transfer.errors import FrameError, PeerClosed, RemoteError, TransferError
from transfer.transport import Conn, connect_tcp

from .config import parse_address
from .rpcapi import Requester
from .errors import (BY_CODE, UNKNOWN, AuthFailed, BadRequest, NodeError, RemoteFailure, TooLarge,
                     Unavailable)

log = logging.getLogger("ferry.node.rpc")


def as_bytes(x: object, what: str) -> bytes:
    if isinstance(x, bytes):
        return x
    if isinstance(x, str):
        return x.encode("utf-8")
    raise BadRequest(f"{what} must be bytes or str, not {type(x).__name__}")


class NodeFrame(IntEnum):
    REQUEST = 64
    REPLY = 65


frames.register_types(NodeFrame)
MAX_FRAME = frames.MAX_PAYLOAD


def load_secret(path: str | None) -> bytes:
    """The cluster secret (transfer.auth.load_secret: a regular file, never a FIFO that
    would block the node's start, not group/world readable), or AuthFailed."""
    try:
        return _auth.load_secret(path)
    except TransferError as e:
        raise AuthFailed(str(e)) from None


def _cut(e: TransferError) -> bool:
    """Did the network (or an overloaded peer) end this handshake, rather than a proof
    of the secret failing? transfer.auth wraps every failure in AuthError; what it
    wrapped is the exception's context: PeerClosed for a reset, a close or a timeout,
    an ERROR frame BUSY from a peer with too many handshakes in flight."""
    cause = e.__context__
    if isinstance(cause, PeerClosed):
        return True
    return isinstance(cause, RemoteError) and cause.code == frames.ErrorCode.BUSY


# The one place authentication happens; swapping the handshake means editing these two.
def authenticate_outgoing(conn: Conn, secret: bytes, role: str) -> None:
    """AuthFailed when the peer refused our proof or failed its own (a wrong secret on
    one side: retrying cannot help); Unavailable when the handshake was cut."""
    try:
        _auth.client_handshake(conn, secret, role=role)
    except TransferError as e:
        if _cut(e):
            raise Unavailable(f"handshake with {conn.peer} cut: {e.reason}") from None
        raise AuthFailed(str(e)) from None


def authenticate_incoming(conn: Conn, secret: bytes, *,
                          deadline: float | None = _auth.HANDSHAKE_DEADLINE) -> str:
    """The whole handshake must end within ``deadline`` seconds. AuthFailed for a peer
    that failed the proof, Unavailable for one that left (or timed out) midway."""
    try:
        return _auth.server_handshake(conn, secret, deadline=deadline)
    except TransferError as e:
        if _cut(e):
            raise Unavailable(str(e)) from None
        raise AuthFailed(str(e)) from None


def error_body(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, NodeError):
        return {"code": exc.code, "message": str(exc), "hint": getattr(exc, "hint", None),
                "outcome": exc.outcome}
    # a handler that failed unexpectedly may have done part of its work
    return {"code": "internal", "message": f"{type(exc).__name__}: {exc}", "hint": None,
            "outcome": UNKNOWN}


def raise_remote(e: dict[str, Any]) -> None:
    code, msg, hint = str(e.get("code")), str(e.get("message")), e.get("hint")
    cls = BY_CODE.get(code)
    err = cls(msg) if cls is not None and code not in ("not_primary",) else RemoteFailure(code, msg, hint)
    # a peer that does not say (an older node) may have applied it
    err.outcome = str(e.get("outcome") or UNKNOWN)
    raise err


def connect_tls(conn: Conn, tls: _tls.TlsContexts, timeout: float,
                expect: str | None = None) -> Conn:
    """``conn`` (a fresh TCP connection) as mutual TLS; the peer must be a node, the
    node ``expect`` when given. AuthFailed when a certificate is refused (either side),
    Unavailable when the network cut the handshake."""
    sock = getattr(conn, "sock", None)
    if sock is None:
        conn.close()
        raise AuthFailed(f"TLS needs a TCP connection to {conn.peer}")
    try:
        return tls.connect(sock, conn.peer, deadline=timeout, expect=expect)
    except _tls.TlsError as e:
        if isinstance(e, _tls.TlsCut):
            raise Unavailable(f"TLS handshake with {conn.peer} cut: {e.reason}") from None
        raise AuthFailed(e.reason) from None


class Channel:
    """One authenticated connection to a node; ``call`` is serialised by a lock. With
    ``tls`` the connection is mutual TLS (``expect``: the node id the peer's
    certificate must name), else the shared-secret handshake."""

    def __init__(self, address: str, secret: bytes, *, role: str = "node",
                 timeout: float = 10.0, tls: _tls.TlsContexts | None = None,
                 expect: str | None = None) -> None:
        host, port = parse_address(address)
        self.address = address
        try:
            conn: Conn = connect_tcp(host, port, timeout=timeout)
        except TransferError as e:
            raise Unavailable(f"node {address} unreachable: {e.reason}") from None
        try:
            conn.set_timeout(timeout)
            if tls is not None:
                conn = connect_tls(conn, tls, timeout, expect)
                conn.set_timeout(timeout)
            else:
                authenticate_outgoing(conn, secret, role)
        except BaseException:
            conn.close()
            raise
        self.conn = conn
        self._lock = threading.Lock()
        self._next = 1
        self.broken = False

    def call(self, method: str, /, timeout: float | None = None, **args: Any) -> Any:
        with self._lock:
            rid, self._next = self._next, self._next + 1
            try:
                data = frames.encode(NodeFrame.REQUEST, {"id": rid, "m": method, "a": args})
            except FrameError as e:
                # refused before anything was sent: the channel is fine, and retrying
                # (as for Unavailable) could never help
                raise TooLarge(f"{method} request does not fit in one frame ({e.reason}); nothing "
                               "was sent. A value may be at most the cluster's "
                               "limits.max_value_bytes (512 KiB by default)") from None
            try:
                if timeout is not None:
                    self.conn.set_timeout(timeout)
                frames.send_frame(self.conn, data)
            except TransferError as e:
                # not all of the frame left: the peer cannot have acted on it
                self.close()
                raise Unavailable(f"call {method} to {self.address} failed: {e.reason}") from None
            try:
                fr = frames.read_frame(self.conn, expect=[NodeFrame.REPLY])
            except TransferError as e:
                self.close()
                raise Unavailable(f"call {method} to {self.address} failed: {e.reason} (sent; "
                                  "its outcome is unknown)").maybe_applied() from None
        body = fr.body
        if body.get("id") != rid:
            self.close()
            raise Unavailable(f"reply out of order from {self.address}").maybe_applied()
        if body.get("ok"):
            return body.get("r")
        raise_remote(body.get("e") or {})

    def close(self) -> None:
        self.broken = True
        try:
            self.conn.close()
        except OSError as e:        # the socket's close: the channel is gone either way
            log.debug("stage=rpc closing a connection: %s", e)


def _dropped(ch: Channel) -> bool:
    """An idle channel whose peer has closed it (or sent something unasked): readable
    now, with nothing or EOF to read. urllib3 checks pooled connections the same way."""
    try:
        return ch.conn.readable()  # an idle request/reply channel has nothing to read unless closed
    except (OSError, ValueError):
        return True


TLS_ENV = ("FERRY_TLS_CA", "FERRY_TLS_CERT", "FERRY_TLS_KEY")
TLS_CRL_ENV = "FERRY_TLS_CRL"       # optional: the cluster CA's revocation list


def env_tls() -> _tls.TlsFiles | None:
    """A client's TLS files from ``$FERRY_TLS_CA``, ``$FERRY_TLS_CERT`` and
    ``$FERRY_TLS_KEY`` (the ``ferry cluster`` commands), and the revocation list of
    ``$FERRY_TLS_CRL`` when set; None when none is set; AuthFailed when only some are."""
    import os
    vals = [os.environ.get(k) or "" for k in TLS_ENV]
    if not any(vals):
        return None
    if not all(vals):
        missing = ", ".join(f"${k}" for k, v in zip(TLS_ENV, vals) if not v)
        raise AuthFailed(f"TLS needs all of ${', $'.join(TLS_ENV)}; {missing} not set")
    return _tls.TlsFiles(vals[0], vals[1], vals[2], os.environ.get(TLS_CRL_ENV) or None)


def client_pool(secret_file: str | None) -> "Pool":
    """The client pool of a ``ferry cluster`` command: mutual TLS when ``env_tls()``
    names certificates, else the cluster secret."""
    files = env_tls()
    if files is None:
        return Pool(load_secret(secret_file), role="client")
    try:
        return Pool(b"", role="client", tls=_tls.TlsContexts(files))
    except _tls.TlsError as e:
        raise AuthFailed(e.reason) from None


class Pool(Requester):
    """Cached channels by address; a broken channel is dropped and redialled, and an
    idle one the peer closed meanwhile is not reused. ``request(address, req)`` sends a
    typed request (node.rpcapi) and decodes its reply; ``call(address, method, **args)``
    is the untyped form underneath."""

    def __init__(self, secret: bytes, *, role: str = "node", timeout: float = 10.0,
                 tls: _tls.TlsContexts | None = None,
                 expect: Callable[[str], str | None] | None = None) -> None:
        """``tls``: mutual TLS instead of the secret; ``expect(address)``: the node id
        the certificate at that address must name (None: any node of the CA)."""
        self.secret, self.role, self.timeout = secret, role, timeout
        self.tls, self.expect = tls, expect
        self._free: dict[str, list[Channel]] = {}
        self._lock = threading.Lock()

    def call(self, address: str, method: str, /, timeout: float | None = None, **args: Any) -> Any:
        while True:
            with self._lock:
                free = self._free.setdefault(address, [])
                ch = free.pop() if free else None
            if ch is None or not _dropped(ch):
                break
            # the peer closed this idle channel (it restarted, or a link was cut and
            # healed): a request on it would fail after it was sent, and a replicate
            # failing so makes the primary drop a healthy copy from the in-sync set
            ch.close()
        if ch is None:
            ch = Channel(address, self.secret, role=self.role, timeout=timeout or self.timeout,
                         tls=self.tls, expect=self.expect(address) if self.expect else None)
        try:
            result = ch.call(method, timeout=timeout or self.timeout, **args)
        finally:
            if not ch.broken:
                with self._lock:
                    self._free.setdefault(address, []).append(ch)
        return result

    def close(self) -> None:
        with self._lock:
            chans = [c for lst in self._free.values() for c in lst]
            self._free.clear()
        for c in chans:
            c.close()
