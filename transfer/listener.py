"""Accepting connections so that no peer, and no passing shortage, stops a server.

Shared by the transfer supplier and the node's RPC server (``node.rpc``):

- :func:`accept_loop` survives transient ``accept()`` errors. Out of file descriptors
  (EMFILE/ENFILE, e.g. many idle connections under a low ``ulimit -n``) or socket
  memory (ENOBUFS/ENOMEM) used to end the loop: the supplier re-raised, the RPC
  thread returned silently and the node never answered RPC again. Now the loop backs
  off (10 ms doubling to 1 s, so it does not spin while the backlog stays full), logs
  the first failure (then at most once a minute) and says when it accepts again. Only
  a listening socket that is itself gone ends it.
- :class:`HandshakeGate` caps the connections that have not authenticated yet (one
  thread each): over the cap a new connection is answered ERROR BUSY and closed at
  once, so idle or hostile clients cannot make a server start threads without bound.
  Each gated connection must finish its handshake within one deadline for the *whole*
  handshake (``Conn.set_deadline``), not a timeout that restarts with every byte. A
  gate can also cap the handshakes of one peer host (``per_peer``), so one address
  cannot take every slot.
- :class:`ConnectionBudget` caps the connections a process holds open from every
  listener together (RPC, metrics, the strangers of a supplier), in total and per
  peer host. :func:`process_budget` is sized from RLIMIT_NOFILE (CONNECTION_SHARE of
  it), so a flood of connections is refused while the rest of the descriptors stay
  for the storage (partition files, WAL, indexes, checkpoints).
"""
from __future__ import annotations

import errno
import logging
import resource
import socket
import threading
import time
from typing import Callable

from . import frames

# The listening socket is closed or broken: nothing to wait for.
_FATAL = {errno.EBADF, errno.EINVAL, errno.ENOTSOCK, errno.EOPNOTSUPP}
# A connection that died in the backlog: try the next one at once, nothing to report.
_QUIET = {errno.ECONNABORTED, errno.EPROTO, errno.EINTR, errno.EAGAIN, errno.EPERM}
_HINTS = {errno.EMFILE: "out of file descriptors for this process: raise `ulimit -n`",
          errno.ENFILE: "out of file descriptors system-wide: raise fs.file-max",
          errno.ENOBUFS: "out of socket memory", errno.ENOMEM: "out of memory"}
MIN_BACKOFF = 0.01
MAX_BACKOFF = 1.0
LOG_EVERY = 60.0          # seconds between two reports of the same kind of trouble
# Share of RLIMIT_NOFILE the connections of a process may hold, all listeners together;
# the rest is the storage's (checkpoint/files.py opens partition files within a quarter
# of the limit per cache) and the process's own outgoing connections.
CONNECTION_SHARE = 0.25
MIN_CONNECTIONS = 32
PER_PEER_SHARE = 0.5      # of the process budget, for any one peer host


class Every:
    """True at most once per ``seconds`` (the first time at once): log lines a peer
    can provoke must not flood the log."""

    def __init__(self, seconds: float = LOG_EVERY) -> None:
        self.seconds = seconds
        self._last = -float("inf")
        self._lock = threading.Lock()

    def due(self) -> bool:
        with self._lock:
            now = time.monotonic()
            if now - self._last >= self.seconds:
                self._last = now
                return True
            return False


def peer_host(peer: str) -> str:
    """The host part of a "host:port" peer (an IPv6 host keeps its colons)."""
    return peer.rsplit(":", 1)[0] if ":" in peer else peer


class ConnectionBudget:
    """At most ``total`` connections at once, and at most ``per_peer`` from one host
    (host "" is a caller that does not say: only the total applies). ``take`` says why
    not (or None, and the connection is counted until ``give``)."""

    def __init__(self, total: int, per_peer: int) -> None:
        if total < 1 or per_peer < 1:
            raise ValueError(f"connection limits must be at least 1, got total={total} per_peer={per_peer}")
        self.total, self.per_peer = total, per_peer
        self._open = 0
        self._by_host: dict[str, int] = {}
        self._lock = threading.Lock()
        self.refused = 0

    @property
    def open(self) -> int:
        return self._open

    def held(self, host: str) -> int:
        return self._by_host.get(host, 0)

    def take(self, host: str) -> str | None:
        with self._lock:
            n = self._by_host.get(host, 0)
            if self._open >= self.total:
                self.refused += 1
                return f"too many open connections ({self.total})"
            if host and n >= self.per_peer:
                self.refused += 1
                return f"too many connections from {host} ({self.per_peer})"
            self._open += 1
            self._by_host[host] = n + 1
            return None

    def give(self, host: str) -> None:
        with self._lock:
            self._open -= 1
            n = self._by_host.get(host, 0) - 1
            if n > 0:
                self._by_host[host] = n
            else:
                self._by_host.pop(host, None)


_process_budget: ConnectionBudget | None = None
_process_lock = threading.Lock()


def connection_limit(share: float = CONNECTION_SHARE) -> int:
    """``share`` of this process's soft RLIMIT_NOFILE (at least MIN_CONNECTIONS)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(MIN_CONNECTIONS, int(soft * share))


def process_budget() -> ConnectionBudget:
    """The budget every listener of this process shares, sized from RLIMIT_NOFILE at
    first use (a node raises its soft limit before it starts listening)."""
    global _process_budget
    with _process_lock:
        if _process_budget is None:
            total = connection_limit()
            _process_budget = ConnectionBudget(total, max(1, int(total * PER_PEER_SHARE)))
        return _process_budget


class HandshakeGate:
    """At most ``limit`` connections between accept and the end of their handshake, at
    most ``per_peer`` of them from one host (when ``enter`` is told the peer), each
    also counted in ``budget`` (the process's by default; None: not counted)."""

    _DEFAULT = object()

    def __init__(self, limit: int, *, per_peer: int | None = None,
                 budget: ConnectionBudget | None | object = _DEFAULT) -> None:
        if limit < 1:
            raise ValueError(f"max_handshakes must be at least 1, got {limit}")
        if per_peer is not None and per_peer < 1:
            raise ValueError(f"max_handshakes_per_peer must be at least 1, got {per_peer}")
        self.limit = limit
        self.per_peer = per_peer
        self.budget: ConnectionBudget | None = (
            process_budget() if budget is HandshakeGate._DEFAULT else budget)  # type: ignore[assignment]
        self._pending = 0
        self._by_host: dict[str, int] = {}
        self._lock = threading.Lock()
        self.refused = 0
        self.why = ""             # the reason of the last refusal
        self.report = Every()

    @property
    def pending(self) -> int:
        return self._pending

    def enter(self, peer: str | None = None) -> bool:
        host = peer_host(peer) if peer is not None else ""
        with self._lock:
            n = self._by_host.get(host, 0)
            if self._pending >= self.limit:
                why = f"too many connections waiting to authenticate ({self.limit})"
            elif peer is not None and self.per_peer is not None and n >= self.per_peer:
                why = f"too many connections from {host} waiting to authenticate ({self.per_peer})"
            else:
                why = (self.budget.take(host) or "") if self.budget is not None else ""
            if why:
                self.refused += 1
                self.why = why
                return False
            self._pending += 1
            self._by_host[host] = n + 1
            return True

    def leave(self, peer: str | None = None) -> None:
        host = peer_host(peer) if peer is not None else ""
        with self._lock:
            self._pending -= 1
            n = self._by_host.get(host, 0) - 1
            if n > 0:
                self._by_host[host] = n
            else:
                self._by_host.pop(host, None)
            if self.budget is not None:
                self.budget.give(host)


def refuse(sock: socket.socket, message: str) -> None:
    """Answer a connection we will not serve with ERROR BUSY and close it, without ever
    blocking the accept loop (a fresh socket's send buffer is empty)."""
    try:
        sock.setblocking(False)
        sock.send(frames.encode(frames.FrameType.ERROR, {"code": int(frames.ErrorCode.BUSY),
                                                          "message": message}))
    except OSError:
        pass
    finally:
        sock.close()


def accept_loop(sock: socket.socket, stop: threading.Event,
                handle: Callable[[socket.socket, str], None], *,
                log: logging.Logger, name: str, poll: float = 0.5) -> None:
    """Accept on ``sock`` until ``stop`` is set, passing each connection and its peer
    ("host:port") to ``handle``, which must not block. Waking every ``poll`` seconds
    lets a foreground server run signal handlers and notice ``stop``. A socket closed
    before the loop starts (a server stopped at once) ends it quietly."""
    try:
        sock.settimeout(poll)
    except OSError as e:
        if not stop.is_set():
            log.error("%s: the listening socket failed (%s); no longer accepting connections", name, e)
        return
    failures = 0
    backoff = MIN_BACKOFF
    report = Every()
    while not stop.is_set():
        try:
            conn, addr = sock.accept()
        except socket.timeout:
            continue
        except OSError as e:
            if stop.is_set():
                return
            if e.errno in _FATAL:
                log.error("%s: the listening socket failed (%s); no longer accepting connections", name, e)
                return
            if e.errno in _QUIET:
                continue
            failures += 1
            if report.due():
                log.error("%s: accept() failed: %s (%s); retrying with back-off, connections "
                          "wait in the backlog meanwhile", name, e.strerror or e,
                          _HINTS.get(e.errno or 0, "transient"))
            stop.wait(backoff)
            backoff = min(MAX_BACKOFF, backoff * 2)
            continue
        if failures:
            log.warning("%s: accepting connections again after %d failed accept() calls", name, failures)
            failures, backoff = 0, MIN_BACKOFF
        peer = "%s:%s" % addr[:2] if isinstance(addr, tuple) else str(addr)
        try:
            handle(conn, peer)
        except Exception as e:  # noqa: BLE001 - e.g. no thread could be started: drop this one only
            conn.close()
            if report.due():
                log.error("%s: could not serve %s: %r; dropped it, still accepting", name, peer, e)
