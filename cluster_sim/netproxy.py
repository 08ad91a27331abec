"""A loopback TCP proxy for network faults on one link (demander -> supplier).

- ``delay(s)``: every forwarded piece waits ``s`` seconds (a slow link);
- ``cut()``: close every open connection now and refuse new ones (accept, then close)
  until ``heal()`` — a broken link;
- ``cut_after(n, heal_after)``: cut once ``n`` more bytes went downstream —
  "mid-transfer", placed by bytes so it lands inside a transfer however fast the
  machine is — and heal ``heal_after`` seconds later;
- ``stall()``: stop forwarding but keep connections open (a black hole: the peer
  sees a timeout, not a reset) until ``heal()``.

Threads, not asyncio: two pumps per connection, a handful of connections per run.
"""
from __future__ import annotations

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
                refuse = self._cut
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


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
