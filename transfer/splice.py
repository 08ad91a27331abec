"""Zero-copy receive: socket -> pipe -> file with ``os.splice`` (Linux, Python 3.10+).

``recv_into`` + ``pwrite`` copies every byte twice in the demander (kernel socket
buffer -> user buffer -> page cache); splicing moves the socket's pages into a pipe
by reference and copies them once, from the pipe into the temp file's page cache.
The chunk is then hashed from the page cache (transfer.pipeline.ChunkSink), so the
checksum covers what actually landed in the file, and a chunk is only recorded as
verified after that hash matches, exactly as on the copying path.

Measured on loopback (docs/benchmarks.md), the one-pass copy that checks each chunk
in its receive buffer (transfer.receive) costs less CPU than splicing and then reading
the chunk back to hash it, so splice is used only when asked (``Demander(splice=True)``)
and where it can be: a plain socket (an SSH channel must decrypt in user space),
Linux with ``os.splice``, and the real file layer (a swapped-in ``faults.fileio``
layer must see every write, so tests and the crash harness get the copying path).
"""
from __future__ import annotations

import fcntl
import os
import select
import sys
from typing import Callable

from .errors import PeerClosed, TransferError
from .transport import wait_fd

# The pipe holds what one splice moves: 1 MiB (the unprivileged maximum by default,
# /proc/sys/fs/pipe-max-size) makes one pair of syscalls per MiB instead of per 64 KiB.
PIPE_SIZE = 1 << 20
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def available() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "splice")


class SpliceReceiver:
    """Moves exactly ``length`` bytes from a connected socket to a file offset.

    ``sock_fd`` may be non-blocking (a Python socket with a timeout is): we wait with
    poll for at most ``timeout`` seconds, as the socket's own recv would."""

    def __init__(self, sock_fd: int, timeout: float | None, peer: str) -> None:
        self.sock_fd, self.timeout, self.peer = sock_fd, timeout, peer
        self._r, self._w = os.pipe()
        try:
            self.pipe_size = fcntl.fcntl(self._w, F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:          # a lower pipe-max-size: keep the default 64 KiB
            self.pipe_size = 64 << 10

    def receive(self, fd: int, offset: int, length: int,
                on_disk_error: Callable[[OSError, int], BaseException]) -> None:
        """Socket -> file at ``offset``. A failed file write (ENOSPC ...) is raised as
        ``on_disk_error(exc, bytes_left)``; the pipe may then hold bytes, so the
        receiver must be closed (the transfer is over anyway)."""
        left = length
        while left:
            n = self._from_socket(min(left, self.pipe_size))
            k = 0
            while k < n:
                try:
                    m = os.splice(self._r, fd, n - k, offset_dst=offset + k)
                except OSError as e:
                    raise on_disk_error(e, left - k) from e
                if m == 0:       # never seen: the pipe holds n - k bytes; do not spin
                    raise TransferError(f"splice into the temp file moved 0 of {n - k} bytes "
                                        f"(offset {offset + k}); fetch again to resume")
                k += m
            offset += n
            left -= n

    def _from_socket(self, want: int) -> int:
        while True:
            try:
                n = os.splice(self.sock_fd, self._w, want)
            except BlockingIOError:
                if not wait_fd(self.sock_fd, select.POLLIN, self.timeout):
                    raise PeerClosed(f"timed out waiting for {self.peer}") from None
                continue
            except (ConnectionResetError, BrokenPipeError) as e:
                raise PeerClosed(f"connection reset by {self.peer}: {e}") from None
            if n == 0:
                raise PeerClosed(f"connection closed by {self.peer} in the middle of chunk data")
            return n

    def close(self) -> None:
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._r = self._w = -1
