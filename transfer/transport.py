"""Transports: one small interface (send, recv_exact, recv_into, sendfile, close) with
a plain-socket backend (zero-copy sendfile) and a byte-channel backend for SSH
channels or anything socket-like that cannot sendfile.

Socket errors become transfer errors here, where they enter: a peer that goes away
is a :class:`PeerClosed`, never a bare ``ConnectionResetError`` further up.
"""
from __future__ import annotations

import logging
import os
import select
import socket
import time
from typing import TYPE_CHECKING, Any

from .errors import PeerClosed, PeerUnreachable, TransferError

log = logging.getLogger("ferry.transfer")

if TYPE_CHECKING:
    from .frames import Sealer

# Chunked fallback for sendfile: big enough to amortise Python overhead per call,
# small enough that a throttled sender does not burst far past its rate.
COPY_BLOCK = 256 * 1024
# SocketConn.recv_piece: bulk data is read into the start of one buffer of this size,
# whatever the socket holds (the raw receiver's loop), never into a chunk-sized buffer
# at a moving offset: on a VM whose last-level cache is small or shared, a copy into
# buffer lines that were written 4 MiB ago costs a cache miss per line (measured here,
# 1 GiB over loopback: 1.37 against 1.80 CPU-s of the receiver, checks included).
READ_AHEAD = 4 << 20
MIN_READ = 64 << 10
TCP_INFO = getattr(socket, "TCP_INFO", 11)
TCP_CLOSE_WAIT = 8      # tcpi_state once the peer's FIN has arrived (linux/tcp_states.h)


def wait_fd(fd: int, events: int, timeout: float | None) -> bool:
    """True when ``fd`` is ready for ``events`` (``select.POLLIN``/``POLLOUT``) within
    ``timeout`` seconds (None: no limit), or has an error or hang-up to report (the next
    I/O call then raises it). poll(2), never select(2): select cannot watch an fd
    numbered FD_SETSIZE (1,024) or above, and a node holding many partitions has more
    files open than that."""
    poller = select.poll()
    poller.register(fd, events)
    return bool(poller.poll(None if timeout is None else max(0.0, timeout) * 1000))


class Conn:
    """A connected byte stream. ``zero_copy`` says whether sendfile is really zero-copy."""

    zero_copy = False
    peer = "?"
    # set by the handshake (transfer.auth): every later frame carries a MAC
    sealer: "Sealer | None" = None

    def send(self, data: bytes | memoryview) -> None:
        raise NotImplementedError

    def recv_into(self, view: memoryview) -> int:
        """Read up to len(view) bytes; 0 means the peer closed."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    # The per-call timeout and the deadline over many calls (set_deadline). A transport
    # with timeouts implements _apply_timeout and calls _before_io before each read and
    # write; one without them ignores both.
    _timeout: float | None = None
    _deadline: float | None = None      # time.monotonic() by which I/O must end
    _deadline_s = 0.0

    def _apply_timeout(self, seconds: float | None) -> None:
        """Set the underlying stream's per-call timeout."""

    def set_timeout(self, seconds: float | None) -> None:
        self._timeout = seconds
        self._apply_timeout(seconds)

    def set_deadline(self, seconds: float | None) -> None:
        """Until cleared (None), every read and write must end within ``seconds`` from
        now in total: unlike the per-call timeout it does not restart with each byte,
        so a peer dripping one byte at a time cannot hold the connection (used for the
        whole handshake). Transports without one ignore it."""
        if seconds is None:
            self._deadline = None
            self._apply_timeout(self._timeout)
        else:
            self._deadline, self._deadline_s = time.monotonic() + seconds, seconds

    def _before_io(self) -> None:
        """Under a deadline: the time left becomes the timeout of the next call."""
        if self._deadline is None:
            return
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise self._deadline_passed()
        self._apply_timeout(left if self._timeout is None else min(left, self._timeout))

    def _timed_out(self, doing: str) -> PeerClosed:
        """A socket timeout while ``doing``: the deadline passed, or the peer went quiet."""
        if self._deadline is not None and time.monotonic() >= self._deadline:
            return self._deadline_passed()
        return PeerClosed(f"timed out {doing} {self.peer}")

    def _deadline_passed(self) -> PeerClosed:
        return PeerClosed(f"{self.peer} did not finish within {self._deadline_s:g} s (deadline)")

    def readable(self) -> bool:
        """True when bytes from the peer are waiting (so a read will not block)."""
        raise NotImplementedError

    def peer_closed(self) -> bool:
        """True when the peer has closed its end (we may still have its bytes to read)."""
        return False

    def recv_exact(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.recv_into(view[got:])
            if k == 0:
                raise PeerClosed(f"connection closed by {self.peer} after {got} of {n} expected bytes")
            got += k
        return bytes(buf)

    def recv_fill(self, view: memoryview) -> None:
        """Fill ``view`` completely (bulk data); PeerClosed if the stream ends first."""
        got = 0
        while got < len(view):
            k = self.recv_into(view[got:])
            if k == 0:
                raise PeerClosed(f"connection closed by {self.peer} after {got} of {len(view)} bytes of data")
            got += k

    def sendfile(self, fd: int, offset: int, count: int) -> int:
        """Send ``count`` bytes of ``fd`` from ``offset``; returns bytes sent (== count
        unless the file is shorter). This fallback copies through user space."""
        sent = 0
        while sent < count:
            block = os.pread(fd, min(COPY_BLOCK, count - sent), offset + sent)
            if not block:
                break
            self.send(block)
            sent += len(block)
        return sent


class SocketConn(Conn):
    """Plain TCP (or a socketpair in tests): file data by os.sendfile, kernel to kernel."""

    zero_copy = True

    def __init__(self, sock: socket.socket, peer: str | None = None) -> None:
        self.sock = sock
        try:
            self.peer = peer or "%s:%s" % sock.getpeername()[:2]
        except (OSError, TypeError):
            self.peer = peer or "local"
        self._timeout = sock.gettimeout()
        self._rbuf: memoryview | None = None     # recv_piece's buffer
        self._pend = memoryview(b"")             # bytes it read past what was asked

    def send(self, data: bytes | memoryview) -> None:
        try:
            self._before_io()
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError) as e:
            raise PeerClosed(f"connection to {self.peer} lost while sending: {e}") from None
        except socket.timeout:
            raise self._timed_out("sending to") from None

    def recv_into(self, view: memoryview) -> int:
        if self._pend:
            n = min(len(view), len(self._pend))
            view[:n] = self._pend[:n]
            self._pend = self._pend[n:]
            return n
        try:
            self._before_io()
            return self.sock.recv_into(view)
        except ConnectionResetError as e:
            raise PeerClosed(f"connection reset by {self.peer}: {e}") from None
        except socket.timeout:
            raise self._timed_out("waiting for") from None

    def recv_piece(self, limit: int) -> memoryview:
        """Up to ``limit`` (> 0) bytes of bulk data, as they come: what the socket
        holds, read into the start of this connection's buffer (READ_AHEAD). Bytes read
        past ``limit`` are kept and come first from every later read. The view is
        valid only until the next read on this connection; empty: the peer closed."""
        if self._pend:
            piece, self._pend = self._pend[:limit], self._pend[limit:]
            return piece
        want = max(MIN_READ, min(READ_AHEAD, limit))
        if self._rbuf is None or len(self._rbuf) < want:
            self._rbuf = memoryview(bytearray(want))    # grown; freed by drop_read_buffer
        n = self.recv_into(self._rbuf)
        k = min(n, limit)
        self._pend = self._rbuf[k:n]
        return self._rbuf[:k]

    def pending(self) -> int:
        """Bytes read from the socket and not yet consumed (recv_piece's read-ahead)."""
        return len(self._pend)

    def drop_read_buffer(self) -> None:
        """Free recv_piece's buffer (bytes read ahead are kept, copied): a connection
        kept idle between fetches, one per supplier, holds no 4 MiB each."""
        if self._pend:
            self._pend = memoryview(bytes(self._pend))
        self._rbuf = None

    def sendfile(self, fd: int, offset: int, count: int) -> int:
        sent = 0
        out = self.sock.fileno()
        timeout = self.sock.gettimeout()
        try:
            while sent < count:
                try:
                    n = os.sendfile(out, fd, offset + sent, count - sent)
                except BlockingIOError:
                    # A socket with a timeout is non-blocking at the fd level: wait
                    # for room in the send buffer, as socket.sendfile does.
                    if not wait_fd(out, select.POLLOUT, timeout):
                        raise PeerClosed(f"timed out sending to {self.peer}") from None
                    continue
                if n == 0:
                    break  # end of file: the caller sees sent < count
                sent += n
        except (BrokenPipeError, ConnectionResetError) as e:
            raise PeerClosed(f"connection to {self.peer} lost during sendfile: {e}") from None
        return sent

    def _apply_timeout(self, seconds: float | None) -> None:
        self.sock.settimeout(seconds)

    def readable(self) -> bool:
        return bool(self._pend) or wait_fd(self.sock.fileno(), select.POLLIN, 0)

    def peer_closed(self) -> bool:
        # A send to a peer that has closed makes its kernel answer with a RST, and the
        # RST makes ours drop the bytes we have not read yet: a demander that knows the
        # supplier died keeps reading what arrived instead of acknowledging into the void.
        try:
            info = self.sock.getsockopt(socket.IPPROTO_TCP, TCP_INFO, 8)
        except (OSError, AttributeError):
            return False
        return info[0] == TCP_CLOSE_WAIT

    def close(self) -> None:
        self._pend, self._rbuf = memoryview(b""), None
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class ChannelConn(Conn):
    """Any object with ``sendall``/``recv``/``close`` (a paramiko Channel): data in
    chunks through the channel, no zero-copy (encryption needs the bytes)."""

    def __init__(self, chan: Any, peer: str) -> None:
        self.chan = chan
        self.peer = peer

    def send(self, data: bytes | memoryview) -> None:
        self._before_io()
        try:
            self.chan.sendall(bytes(data) if isinstance(data, memoryview) else data)
        except socket.timeout:
            raise PeerClosed(f"timed out sending to {self.peer}") from None
        except (OSError, EOFError) as e:
            raise PeerClosed(f"channel to {self.peer} lost while sending: {e}") from None

    def recv_into(self, view: memoryview) -> int:
        self._before_io()
        try:
            data = self.chan.recv(len(view))
        except socket.timeout:
            raise PeerClosed(f"timed out waiting for {self.peer}") from None
        except (OSError, EOFError) as e:
            raise PeerClosed(f"channel to {self.peer} lost: {e}") from None
        view[:len(data)] = data
        return len(data)

    def _apply_timeout(self, seconds: float | None) -> None:
        self.chan.settimeout(seconds)

    def readable(self) -> bool:
        return bool(self.chan.recv_ready())

    def close(self) -> None:
        try:
            self.chan.close()
        except Exception as e:  # noqa: BLE001 - paramiko raises its own and socket errors; closing anyway
            log.debug("closing an SSH channel: %r", e)


def connect_tcp(host: str, port: int, *, timeout: float = 10.0) -> SocketConn:
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as e:
        raise PeerUnreachable(f"cannot connect to {host}:{port}: {e.strerror or e}",
                              peer=f"{host}:{port}") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return SocketConn(sock, f"{host}:{port}")


def parse_hostport(text: str, default_port: int | None = None) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep:
        if default_port is None:
            raise TransferError(f"peer {text!r} must be HOST:PORT")
        return text, default_port
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise TransferError(f"peer {text!r}: port must be a number 1..65535")
    return host.strip("[]") or "127.0.0.1", int(port)
