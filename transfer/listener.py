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
  handshake (``Conn.set_deadline``), not a timeout that restarts with every byte.
"""
from __future__ import annotations

import errno
import logging
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


class HandshakeGate:
    """At most ``limit`` connections between accept and the end of their handshake."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_handshakes must be at least 1, got {limit}")
        self.limit = limit
        self._pending = 0
        self._lock = threading.Lock()
        self.refused = 0
        self.report = Every()

    @property
    def pending(self) -> int:
        return self._pending

    def enter(self) -> bool:
        with self._lock:
            if self._pending >= self.limit:
                self.refused += 1
                return False
            self._pending += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self._pending -= 1


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
    lets a foreground server run signal handlers and notice ``stop``."""
    sock.settimeout(poll)
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
        except Exception as e:       # e.g. no thread could be started: drop this one only
            conn.close()
            if report.due():
                log.error("%s: could not serve %s: %r; dropped it, still accepting", name, peer, e)
