"""A transfer still works when its sockets are numbered above FD_SETSIZE (1,024).

A node holding tens of thousands of partitions has more files open than that, and
select(2) refuses such an fd ("filedescriptor out of range in select()"): the
transports wait with poll(2) instead. The test fills the low fd numbers, so every
socket, pipe and file the supplier and the demander open gets a number above 1,024.
"""
from __future__ import annotations

import contextlib
import os
import resource
from typing import Iterator

import pytest

from transfer import Demander, DirectoryStorage, Limits, SupplierServer

from transfer_helpers import SECRET, peer_of, read, write_part

FD_SETSIZE = 1024
MB = 1 << 20


@contextlib.contextmanager
def _low_fds_taken(above: int) -> Iterator[None]:
    """Hold open fds up to ``above`` (the soft RLIMIT_NOFILE raised as needed), so
    the next fd opened gets a higher number; everything restored after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = above + 512                       # room for the transfer's own files
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {need}: cannot open fds above "
                    f"{above} here")
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    held: list[int] = []
    try:
        while True:
            fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            held.append(fd)
            if fd >= above:
                break
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("splice", [True, False])
def test_transfer_with_sockets_numbered_above_fd_setsize(src, dst, splice: bool) -> None:
    data = write_part(src, 3, 6 * MB + 17)
    with _low_fds_taken(FD_SETSIZE + 8):
        probe = os.dup(0)
        os.close(probe)
        assert probe > FD_SETSIZE
        # A slow rate keeps the supplier's send buffer full (sendfile then waits for
        # room) and the demander's socket often empty (it waits for bytes): both waits
        # and the supplier's check for acknowledgements run on high fds.
        srv = SupplierServer(DirectoryStorage(src), SECRET, limits=Limits(2, rate=24e6),
                             timeout=10).start()
        try:
            res = Demander(DirectoryStorage(dst), peer_of(srv), SECRET, timeout=10,
                           chunk_size=MB, splice=splice).fetch(3)
        finally:
            srv.stop()
    assert res.verified and res.bytes == len(data)
    assert read(os.path.join(dst, "part-3.bin")) == data
