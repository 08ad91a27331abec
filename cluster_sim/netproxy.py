"""A loopback TCP proxy for network faults on one link (demander -> supplier).

- ``delay(s)``: every forwarded piece waits ``s`` seconds (a slow link);
- ``cut()``: close every open connection now and refuse new ones (accept, then close)
  until ``heal()`` — a broken link;
- ``cut_after(n, heal_after)``: cut once ``n`` more bytes went downstream —
  "mid-transfer", placed by bytes so it lands inside a transfer however fast the
  machine is — and heal ``heal_after`` seconds later;
- ``stall()``: stop forwarding but keep connections open (a black hole: the peer
  sees a timeout, not a reset) until ``heal()``;
- ``block(pids)`` / ``unblock()``: cut only the connections that processes ``pids``
  opened (now and new ones) -- one proxy in front of a node's RPC port serves every
  peer, and this cuts the link from one peer while the others (and the harness) still
  get through. On loopback every source address is 127.0.0.1, so the source process
  is found by its socket: ``/proc/net/tcp`` gives the inode of the client end,
  ``/proc/<pid>/fd`` which process holds it (Linux; root or the same user).

Threads, not asyncio: two pumps per connection, a handful of connections per run.
"""
from __future__ import annotations

import os
import socket
import threading
import time


class Proxy:
    def __init__(self, target: tuple[str, int], host: str = "127.0.0.1", port: int = 0) -> None:
        self.target = target
        self._srv = socket.create_server((host, port))
        self.port = self._srv.getsockname()[1]
        self.address = f"{host}:{self.port}"
        self._lock = threading.Lock()
        self._conns: list[tuple[socket.socket, socket.socket]] = []
        self._cut = False
        self._open = threading.Event()       # cleared while stalled
        self._open.set()
        self._delay = 0.0
        self._cut_after: int | None = None
        self._heal_after: float | None = None
        self._stop = False
        self.downstream = 0                  # bytes target -> client
        self.upstream = 0
        self.cuts = 0
        self.refused = 0
        self._blocked: frozenset[int] = frozenset()

    def start(self) -> Proxy:
        threading.Thread(target=self._accept, name="ferry-sim-proxy", daemon=True).start()
        return self

    # -- faults ----------------------------------------------------------------------------
    def delay(self, seconds: float) -> None:
        self._delay = seconds

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            self.cuts += 1
            conns, self._conns = self._conns, []
        for a, b in conns:
            _close(a)
            _close(b)

    def cut_after(self, nbytes: int, heal_after: float | None = None) -> None:
        """Cut once ``nbytes`` more went downstream; heal ``heal_after`` s later."""
        with self._lock:
            self._cut_after = self.downstream + nbytes
            self._heal_after = heal_after

    def stall(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        """End a cut or a stall (a pending ``cut_after`` stays armed)."""
        with self._lock:
            self._cut = False
        self._open.set()

    def block(self, pids: set[int]) -> None:
        """Cut the connections of processes ``pids`` and refuse their new ones until
        :meth:`unblock` (connections of other processes are untouched)."""
        with self._lock:
            self._blocked = frozenset(pids)
            conns = list(self._conns)
        mine = [(a, b) for a, b in conns if source_pid(a, self.port, pids) is not None]
        with self._lock:
            self._conns = [c for c in self._conns if c not in mine]
            self.cuts += bool(mine)
        for a, b in mine:
            _close(a)
            _close(b)

    def unblock(self) -> None:
        with self._lock:
            self._blocked = frozenset()

    def stop(self) -> None:
        self._stop = True
        _close(self._srv)
        self.cut()
        self._open.set()

    # -- plumbing --------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self._srv.accept()
            except OSError:
                return
            with self._lock:
                refuse, blocked = self._cut, self._blocked
            if not refuse and blocked:
                refuse = source_pid(client, self.port, blocked) is not None
            if refuse:
                self.refused += 1
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._conns.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, down: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                self._open.wait()
                if self._delay:
                    time.sleep(self._delay)
                with self._lock:
                    if down:
                        self.downstream += len(data)
                        trip = self._cut_after is not None and self.downstream >= self._cut_after
                    else:
                        self.upstream += len(data)
                        trip = False
                if trip:
                    self._cut_after = None
                    self.cut()
                    if self._heal_after is not None:
                        threading.Timer(self._heal_after, self.heal).start()
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _close(src)
            _close(dst)


def source_pid(accepted: socket.socket, port: int, pids: set[int] | frozenset[int]) -> int | None:
    """Which of ``pids`` holds the client end of ``accepted`` (a connection to our
    ``port`` on loopback), or None."""
    try:
        peer_port = accepted.getpeername()[1]
    except OSError:
        return None
    inode = _client_inode(peer_port, port)
    if inode is None:
        return None
    want = f"socket:[{inode}]"
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in names:
            try:
                if os.readlink(os.path.join(fd_dir, fd)) == want:
                    return pid
            except OSError:
                continue
    return None


def _client_inode(local_port: int, remote_port: int) -> str | None:
    """Inode of the TCP socket ``127.0.0.1:local_port -> *:remote_port``."""
    lp, rp = f":{local_port:04X}", f":{remote_port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    parts = line.split()
                    if len(parts) > 9 and parts[1].endswith(lp) and parts[2].endswith(rp):
                        return parts[9]
        except OSError:
            continue
    return None


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
