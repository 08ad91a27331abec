"""Helpers shared by the transfer tests (fixtures are in conftest.py)."""
from __future__ import annotations

import os
import queue
import random
import select
import socket
import threading
import time
from typing import IO, Callable

from faults import fileio
from transfer import SupplierServer

SECRET = b"5e8a1f47c90d3b26e4a7f01c8d5b92e6"


def write_part(directory: str, p: int, size: int, seed: int = 0) -> bytes:
    block = random.Random(seed * 1000003 + p).randbytes(min(size, 1 << 20))
    # big files: one random MiB, each copy stamped with its position so chunks differ
    data = b"".join(i.to_bytes(8, "little") + block[8:] for i in range(size >> 20)) + block[:size & 0xFFFFF] \
        if size > len(block) else block
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"part-{p}.bin"), "wb") as f:
        f.write(data)
    return data


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def peer_of(srv: SupplierServer) -> str:
    return "%s:%s" % srv.address


class Proxy:
    """A real TCP relay between demander and supplier that can rewrite the supplier's
    bytes (``mangle(data) -> data``) or cut the connection after ``cut_after`` bytes."""

    def __init__(self, target: tuple[str, int], mangle: Callable[[bytes], bytes] | None = None,
                 cut_after: int | None = None, hold: int = 0) -> None:
        self.target, self.mangle, self.cut_after, self.hold = target, mangle, cut_after, hold
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = self.sock.getsockname()
        self.forwarded = 0
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def peer(self) -> str:
        return "%s:%s" % self.address

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            s = socket.create_connection(self.target)
            threading.Thread(target=self._up, args=(c, s), daemon=True).start()
            threading.Thread(target=self._down, args=(s, c), daemon=True).start()

    @staticmethod
    def _up(c: socket.socket, s: socket.socket) -> None:
        """Demander -> supplier. Reads the demander until it closes, even after the
        supplier side is gone: closing a socket with unread bytes sends a RST, and a RST
        makes the demander's kernel drop data it has not read yet (not what we test)."""
        try:
            while True:
                data = c.recv(1 << 16)
                if not data:
                    break
                try:
                    s.sendall(data)
                except OSError:
                    pass
        except OSError:
            pass
        finally:
            for x in (c, s):
                x.close()

    def _down(self, s: socket.socket, c: socket.socket) -> None:
        """Supplier -> demander, mangled or cut; ends with a clean FIN to the demander."""
        carry = b""      # held-back tail, so a pattern split across two reads is still seen
        try:
            while True:
                s.settimeout(0.05 if carry else None)
                try:
                    data = s.recv(1 << 16)
                except socket.timeout:
                    c.sendall(carry)          # nothing more is coming for now: flush the tail
                    carry = b""
                    continue
                if not data:
                    break
                if self.mangle:
                    data = self.mangle(carry + data)
                    cut = max(0, len(data) - self.hold)
                    data, carry = data[:cut], data[cut:]
                if self.cut_after is not None and self.forwarded + len(data) >= self.cut_after:
                    c.sendall(data[:self.cut_after - self.forwarded])
                    self.forwarded = self.cut_after
                    carry = b""
                    break
                self.forwarded += len(data)
                c.sendall(data)
            if carry:
                c.sendall(carry)
        except OSError:
            pass
        finally:
            try:
                c.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()


class WriteSizes(fileio.FileLayer):
    """The real file layer, recording the length of every ``pwrite`` (``sizes``)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        self.sizes.append(len(data))
        return super().pwrite(fd, data, offset)


def disk_filler(directory: str, after: int, size: int) -> Callable:
    """A fetch progress callback: once ``after`` bytes are received, another writer
    takes ``size`` bytes of ``directory``'s filesystem (the disk fills mid-transfer)."""
    filler = os.path.join(directory, "filler")

    def fill(ev) -> None:
        if ev.stage == "receive" and ev.done >= after and not os.path.exists(filler):
            try:
                with open(filler, "wb") as f:
                    f.write(b"\0" * size)
            except OSError:
                pass
    return fill


# -- servers against hostile peers (test_hostile_peers.py, tests/node/test_rpc_hostile.py)
def wait_until(cond: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _closed_by_peer(s: socket.socket, wait: float) -> bool:
    """True when the server closes ``s`` within ``wait`` seconds (EOF or reset)."""
    ready, _, _ = select.select([s], [], [], wait)
    if not ready:
        return False
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return True
            if not select.select([s], [], [], wait)[0]:
                return False
    except OSError:
        return True


def drip(address: tuple[str, int], data: bytes, every: float = 0.3) -> tuple[bool, float]:
    """Send ``data`` to a new connection one byte every ``every`` seconds (each read on
    the server is quick, the whole is not) until the server closes it: (closed, seconds)."""
    s = socket.create_connection(address)
    try:
        t0 = time.monotonic()
        for b in data:
            try:
                s.send(bytes([b]))
            except OSError:
                return True, time.monotonic() - t0
            if _closed_by_peer(s, every):
                return True, time.monotonic() - t0
        return False, time.monotonic() - t0
    finally:
        s.close()


def log_lines(stream: IO[str]) -> queue.Queue:
    """A child's output, line by line, as it comes (None at its end)."""
    q: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in stream:
            q.put(line)
        q.put(None)
    threading.Thread(target=pump, daemon=True).start()
    return q


def expect_line(q: queue.Queue, text: str, seconds: float, seen: list[str]) -> str:
    """The next line of ``q`` with ``text`` in it (those before it are added to ``seen``)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            line = q.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if text in line:
            return line
    raise AssertionError(f"no line with {text!r} in {seconds} s; stderr so far:\n{''.join(seen)}")
