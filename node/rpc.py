"""The node's TCP server: one thread per connection, the handshake first, then
REQUEST/REPLY frames (see :mod:`node.wire`). Accepting is transfer.listener's loop:
it outlives transient accept() failures, caps the connections still authenticating
(in total and per peer host) and gives each one deadline for its whole handshake.
Every connection, authenticated or not, also counts in the process's connection
budget (``transfer.listener.process_budget``: a share of RLIMIT_NOFILE, in total and
per peer host), so no flood of connections can take the descriptors the storage
needs; a connection over any limit is answered ERROR BUSY and closed at once.

With ``tls`` (transfer.tls) each connection is mutual TLS instead of the secret's
handshake: the peer's role (node or client) and name come from its certificate, a
client certificate gets the client methods only (the dispatcher's rule), and a node
certificate's id must match every node id a request claims to come from (``claims``:
method -> the argument naming the calling node, e.g. ``replicate``'s ``primary``).

Failures are contained per request: a handler error becomes an error REPLY; a
malformed REQUEST (not a map, unknown method, bad arguments) becomes a ``bad_request``
REPLY; a frame that breaks the framing gets an ERROR frame and only that connection
is closed. The server keeps serving every other connection.
"""
from __future__ import annotations

import logging
import socket
import threading
from typing import Any, Callable, Mapping

from faults.latch import report_refusal
from transfer import frames
from transfer.errors import FrameError, PeerClosed, TransferError
from transfer import auth
from transfer import tls as _tls
from transfer.listener import ConnectionBudget, HandshakeGate, accept_loop, peer_host, process_budget, refuse
from transfer.transport import Conn, SocketConn

from .config import parse_address
from .errors import AuthFailed, BadRequest, NodeError, Unavailable
from .wire import NodeFrame, authenticate_incoming, error_body

log = logging.getLogger("ferry.node.rpc")

Dispatch = Callable[[str, dict[str, Any], str], Any]   # (method, args, role) -> result


class RpcServer:
    """``handshake_timeout`` bounds the whole handshake (not each read), and at most
    ``max_handshakes`` connections may be in it at once, at most
    ``max_handshakes_per_peer`` from one host; more are answered ERROR BUSY and closed
    (transfer.listener). Authenticated connections then idle up to ``idle_timeout``
    between requests. Every connection holds a place in ``budget`` (the process's by
    default) until it closes. The handshake key is derived here, once, not by the
    first peer's handshake."""

    def __init__(self, listen: str, secret: bytes, dispatch: Dispatch, *,
                 idle_timeout: float = 300.0, handshake_timeout: float = 10.0,
                 max_handshakes: int = 64, max_handshakes_per_peer: int = 16,
                 budget: ConnectionBudget | None = None, tls: _tls.TlsContexts | None = None,
                 claims: Mapping[str, str] | None = None) -> None:
        host, port = parse_address(listen)
        self.secret = secret
        self.tls = tls
        self.claims = dict(claims or {})
        if tls is None:
            auth.handshake_key(secret)
        self.dispatch = dispatch
        self.idle_timeout = idle_timeout
        self.handshake_timeout = handshake_timeout
        self.gate = HandshakeGate(max_handshakes, per_peer=max_handshakes_per_peer, budget=None)
        self.budget = budget if budget is not None else process_budget()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError as e:
            self.sock.close()
            raise NodeError(f"cannot listen on {listen}: {e.strerror}; is another process using it?") from None
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._conns: set[Conn] = set()
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._accept, name="rpc-accept", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _accept(self) -> None:
        # Transient accept() failures (out of file descriptors ...) are waited out: this
        # thread used to return on the first one, and the node never served RPC again.
        accept_loop(self.sock, self._stop, self._accepted, log=log, name="rpc")

    def _refuse(self, s: socket.socket, peer: str, why: str) -> None:
        if self.gate.report.due():
            log.warning("stage=auth refused %s: %s; %d refused so far", peer, why,
                        self.gate.refused + self.budget.refused)
        refuse(s, f"{why}; retry")

    def _accepted(self, s: socket.socket, peer: str) -> None:
        host = peer_host(peer)
        why = self.budget.take(host)
        if why:
            self._refuse(s, peer, why)
            return
        if not self.gate.enter(peer):
            self.budget.give(host)
            self._refuse(s, peer, self.gate.why)
            return
        conn = SocketConn(s, peer)
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(conn,), name=f"rpc-{conn.peer}",
                             daemon=True).start()
        except BaseException:
            self.gate.leave(peer)
            self.budget.give(host)
            raise

    def _serve(self, tcp: SocketConn) -> None:
        conn: Conn = tcp
        with self._lock:
            self._conns.add(conn)
        try:
            conn.set_timeout(self.handshake_timeout)
            who: _tls.Peer | None = None
            try:
                # one deadline for the whole handshake: a peer dripping a byte at a time
                # (or sending nothing) is dropped after handshake_timeout
                if self.tls is not None:
                    try:
                        conn = self.tls.accept(tcp.sock, tcp.peer, deadline=self.handshake_timeout)
                    except _tls.TlsCut as e:
                        raise Unavailable(e.reason) from None
                    except _tls.TlsError as e:
                        raise AuthFailed(e.reason) from None
                    with self._lock:
                        self._conns.discard(tcp)
                        self._conns.add(conn)
                    who = conn.peer_id
                    role = who.role
                else:
                    role = authenticate_incoming(conn, self.secret, deadline=self.handshake_timeout)
            except AuthFailed as e:
                log.warning("stage=auth refused %s: %s", conn.peer, e)
                return
            except (Unavailable, TransferError, OSError) as e:   # gone mid-handshake, or the server stops
                if not self._stop.is_set():
                    log.info("stage=auth %s left during the handshake: %s", conn.peer, e)
                return
            finally:
                self.gate.leave(conn.peer)
            conn.set_timeout(self.idle_timeout)
            while not self._stop.is_set():
                try:
                    fr = frames.read_frame(conn, expect=[NodeFrame.REQUEST])
                except PeerClosed:
                    return
                except FrameError as e:
                    log.warning("stage=rpc bad frame from %s: %s", conn.peer, e)
                    frames.send_error(conn, e.code, e.reason)
                    return
                except TransferError as e:
                    log.warning("stage=rpc connection from %s: %s", conn.peer, e)
                    return
                except OSError as e:
                    # the server is stopping (stop() closed this socket under the read:
                    # EBADF) or the connection broke: end this connection quietly
                    if not self._stop.is_set():
                        log.info("stage=rpc connection from %s ended: %s", conn.peer, e)
                    return
                body = self._handle(fr.body, role, who)
                try:
                    frames.write_frame(conn, NodeFrame.REPLY, body)
                except FrameError as e:  # the result itself is too big for one frame
                    frames.write_frame(conn, NodeFrame.REPLY, {"id": fr.body.get("id"), "ok": False,
                                                               "e": error_body(NodeError(str(e)))})
                except (TransferError, OSError):
                    return
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()
            self.budget.give(peer_host(conn.peer))

    def _handle(self, req: dict[str, Any], role: str, who: _tls.Peer | None = None) -> dict[str, Any]:
        rid = req.get("id")
        try:
            method, args = req.get("m"), req.get("a", {})
            if not isinstance(method, str) or not isinstance(args, dict) or not isinstance(rid, int):
                raise BadRequest("request must be {id: int, m: str, a: map}")
            if who is not None and who.role == _tls.NODE and method in self.claims:
                claimed = args.get(self.claims[method])
                if claimed != who.name:
                    raise AuthFailed(f"{method} claims to come from node {claimed!r}, but the "
                                     f"caller's certificate names node {who.name!r}; refused")
            return {"id": rid, "ok": True, "r": self.dispatch(method, args, role)}
        except NodeError as e:
            return {"id": rid, "ok": False, "e": error_body(e)}
        except TypeError as e:  # wrong or missing arguments for the method
            return {"id": rid, "ok": False, "e": error_body(BadRequest(f"bad arguments: {e}"))}
        except Exception as e:  # noqa: BLE001 - the caller gets an error reply, the log the cause
            # A full disk, a read-only file system, no descriptors left: the message
            # says what and where, and one WARNING a minute per cause says it in the
            # log (faults/latch.py), not a traceback per refused request.
            if not report_refusal(e):
                log.exception("stage=rpc handler %r failed", req.get("m"))
            return {"id": rid, "ok": False, "e": error_body(e)}

    def stop(self) -> None:
        self._stop.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)    # wakes a blocked accept() at once on Linux
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            c.close()
