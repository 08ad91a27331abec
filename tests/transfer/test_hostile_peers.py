"""Ways a peer (or a shortage) used to stop a transfer server, each now survived.

- idle connections under a low ``ulimit -n``: accept() fails with EMFILE; the server
  backs off, logs once and accepts again once descriptors are free (a real
  ``ferry transfer serve`` process with RLIMIT_NOFILE lowered);
- many unauthenticated connections: capped (``max_handshakes``), the rest get BUSY;
- a peer dripping one byte at a time: one deadline for the whole handshake;
- oversized frames before authentication;
- a RESEND naming one chunk hundreds of times, or RESEND rounds without end.
"""
from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import threading
import time

import pytest

from transfer import Demander, DirectoryStorage, RemoteError, SupplierServer
from transfer import frames
from transfer.auth import client_handshake
from transfer.frames import ErrorCode, FrameType
from transfer.messages import Chunk, Demand, End, Manifest, Received
from transfer.transport import SocketConn, connect_tcp

from transfer_helpers import SECRET, drip, expect_line, log_lines, peer_of, read, wait_until, write_part

KB = 1 << 10
pytestmark = pytest.mark.timeout(120)


# -- connections that never authenticate -------------------------------------------
def test_unauthenticated_connections_are_capped(src, dst) -> None:
    data = write_part(src, 1, 5000)
    srv = SupplierServer(DirectoryStorage(src), SECRET, max_handshakes=4, handshake_timeout=30).start()
    idle: list[socket.socket] = []
    try:
        idle = [socket.create_connection(srv.address) for _ in range(4)]
        assert wait_until(lambda: srv.gate.pending == 4)
        # 50 more idle clients: each refused at once with BUSY, no thread started for it
        extra = [socket.create_connection(srv.address) for _ in range(50)]
        # this server's sessions only (a session thread is named for its peer; other
        # tests of this worker may still have sessions of their own servers ending)
        mine = {"ferry-supply-%s:%d" % s.getsockname()[:2] for s in idle + extra}
        for s in extra:
            s.settimeout(5)
            with pytest.raises(RemoteError) as ei:
                frames.read_frame(SocketConn(s))
            assert ei.value.code == ErrorCode.BUSY, ei.value
            s.close()
        sessions = [t for t in threading.enumerate() if t.name in mine]
        assert len(sessions) <= 4
        assert srv.gate.refused == 50
        for s in idle:
            s.close()
        assert wait_until(lambda: srv.gate.pending == 0)
        Demander(DirectoryStorage(dst), peer_of(srv), SECRET, timeout=10).fetch(1)
        assert read(os.path.join(dst, "part-1.bin")) == data
    finally:
        for s in idle:
            s.close()
        srv.stop()


def test_whole_handshake_has_one_deadline(src, dst) -> None:
    """One byte every 0.3 s used to keep the connection open as long as the peer
    liked (the timeout restarted with every byte)."""
    data = write_part(src, 1, 5000)
    srv = SupplierServer(DirectoryStorage(src), SECRET, handshake_timeout=1.0, timeout=10).start()
    try:
        hello = frames.encode(FrameType.HELLO, {"nonce": b"n" * 32, "role": "transfer"})
        closed, took = drip(srv.address, hello, 0.3)
        assert closed and took < 2.5, (closed, took)
        assert wait_until(lambda: srv.gate.pending == 0)
        Demander(DirectoryStorage(dst), peer_of(srv), SECRET, timeout=10).fetch(1)
        assert read(os.path.join(dst, "part-1.bin")) == data
    finally:
        srv.stop()


def test_oversized_frame_before_authentication_is_refused(server) -> None:
    """Before the secret is proved a peer may send only small frames (not 1 MiB each)."""
    conn = connect_tcp(*server.address)
    conn.send(frames.encode(FrameType.HELLO, {"nonce": b"n" * 32, "role": "t", "pad": b"x" * (64 * KB)}))
    with pytest.raises(RemoteError) as ei:
        frames.read_frame(conn)
    assert ei.value.code == ErrorCode.TOO_LARGE
    conn.close()


# -- bounded work per request --------------------------------------------------------
def _after_end(srv: SupplierServer, p: int, chunk: int = 64 * KB):
    """A raw demander that has received everything of partition ``p`` and its END."""
    conn = connect_tcp(*srv.address)
    client_handshake(conn, SECRET)
    frames.write_frame(conn, FrameType.DEMAND, Demand("default", p, 1, chunk, {}).to_body())
    m = Manifest.from_body(frames.read_frame(conn, expect=[FrameType.MANIFEST]).body)
    frames.write_frame(conn, FrameType.ACCEPT, {})
    for _ in range(m.chunk_count):
        ch = Chunk.from_body(frames.read_frame(conn, expect=[FrameType.CHUNK]).body)
        conn.recv_exact(ch.length)
    frames.write_frame(conn, FrameType.RECEIVED, Received(m.chunk_count - 1).to_body())
    End.from_body(frames.read_frame(conn, expect=[FrameType.END]).body)
    return conn, m


def _resend_round(conn, chunks: list[int]) -> tuple[list[int], End]:
    frames.write_frame(conn, FrameType.RESEND, {"chunks": chunks})
    got = []
    while True:
        fr = frames.read_frame(conn, expect=[FrameType.CHUNK, FrameType.END])
        if fr.type == FrameType.END:
            return got, End.from_body(fr.body)
        ch = Chunk.from_body(fr.body)
        conn.recv_exact(ch.length)
        got.append(ch.index)


def test_resend_naming_a_chunk_many_times_sends_it_once(server, src) -> None:
    write_part(src, 3, 256 * KB)
    conn, m = _after_end(server, 3)
    sent_before = server.stats.bytes_sent
    got, end = _resend_round(conn, [0] * 500 + [2, 2, 1])       # a 523-byte frame
    assert got == [0, 1, 2] and end.chunks_sent == 3 and end.bytes_sent == 3 * 64 * KB
    assert server.stats.bytes_sent - sent_before == 3 * 64 * KB
    frames.write_frame(conn, FrameType.APPLIED, {"ok": True})
    conn.close()


def test_resend_rounds_are_limited(server, src) -> None:
    from transfer.supplier import MAX_RESEND_ROUNDS
    write_part(src, 4, 128 * KB)
    conn, m = _after_end(server, 4)
    for _ in range(MAX_RESEND_ROUNDS):
        assert _resend_round(conn, [1])[0] == [1]
    with pytest.raises(RemoteError, match="RESEND rounds") as ei:
        _resend_round(conn, [1])
    assert ei.value.code == ErrorCode.PROTOCOL
    conn.close()


# -- running out of file descriptors (a real `ferry transfer serve` process) ---------
NOFILE = 24       # a few descriptors above what the server needs before any connection


def test_serve_survives_running_out_of_file_descriptors(src, dst, secret_file, py_env) -> None:
    data = write_part(src, 0, 100 * KB)
    proc = subprocess.Popen(
        [sys.executable, "-c", "from ferry.cli import main; main()", "transfer", "serve", "--dir", src,
         "--port", "0", "--secret-file", secret_file],
        env=py_env, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE)))
    idle: list[socket.socket] = []
    seen: list[str] = []
    try:
        q = log_lines(proc.stderr)
        line = expect_line(q, "serving ", 30, seen)
        host, port = line.rsplit(" ", 1)[1].strip().rsplit(":", 1)
        # More idle connections than the process has descriptors: they wait in the
        # backlog once accept() fails with EMFILE.
        idle = [socket.create_connection((host, int(port))) for _ in range(NOFILE + 8)]
        expect_line(q, "accept() failed", 15, seen)
        time.sleep(1.5)                      # it keeps failing meanwhile: still one line
        assert proc.poll() is None, "".join(seen)
        for s in idle:
            s.close()
        idle = []
        Demander(DirectoryStorage(dst), f"{host}:{port}", SECRET, timeout=15).fetch(0)
        assert read(os.path.join(dst, "part-0.bin")) == data
        expect_line(q, "accepting connections again", 10, seen)
        assert sum("accept() failed" in ln for ln in seen) == 1, "".join(seen)
        assert not any("Traceback" in ln for ln in seen), "".join(seen)
    finally:
        for s in idle:
            s.close()
        proc.terminate()
        proc.wait(10)
