"""SocketConn.recv_piece: bulk data read as it comes into one buffer; bytes read past
what was asked (the next frame) come first from every later read, so frames after a
chunk are never lost, split or reordered."""
from __future__ import annotations

import os
import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transfer import Demander, DirectoryStorage, SupplierServer, frames
from transfer.connpool import ConnPool
from transfer.errors import PeerClosed
from transfer.frames import FrameType
from transfer.transport import SocketConn

from transfer_helpers import SECRET, peer_of, read, write_part


def _pair() -> tuple[SocketConn, socket.socket]:
    a, b = socket.socketpair()
    a.settimeout(5)
    return SocketConn(a, "test"), b


def test_bytes_read_past_a_piece_come_first_from_later_reads() -> None:
    conn, peer = _pair()
    data = os.urandom(1000)
    frame = frames.encode(FrameType.END, {"chunks_sent": 1})
    peer.sendall(data + frame)          # one send: the chunk's bytes and the next frame
    got = bytearray()
    while len(got) < len(data):
        piece = conn.recv_piece(len(data) - len(got))
        assert piece, "the peer did not close"
        got += piece
    assert bytes(got) == data
    assert conn.pending() == len(frame)          # the frame was read ahead ...
    assert conn.readable()                       # ... so a read will not block
    f = frames.read_frame(conn, expect=[FrameType.END])    # ... and comes first
    assert f.type == FrameType.END and f.body == {"chunks_sent": 1}
    assert conn.pending() == 0
    peer.close()
    assert conn.recv_piece(10) == b""            # then the peer's close, as an empty piece
    conn.close()


def test_a_piece_never_exceeds_its_limit_and_a_close_mid_data_is_seen() -> None:
    conn, peer = _pair()
    peer.sendall(b"x" * 300)
    peer.close()
    sizes = []
    while True:
        piece = conn.recv_piece(64)
        if not piece:
            break
        assert len(piece) <= 64
        sizes.append(len(piece))
    assert sum(sizes) == 300
    with pytest.raises(PeerClosed):
        conn.recv_exact(1)
    conn.close()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=70_000), min_size=1, max_size=6),
       st.lists(st.integers(1, 100_000), min_size=1, max_size=8))
def test_pieces_and_exact_reads_interleaved_return_the_stream_in_order(
        parts: list[bytes], limits: list[int]) -> None:
    """Whatever the piece limits and however the reads mix, the bytes come back
    exactly as sent."""
    conn, peer = _pair()
    stream = b"".join(parts)
    sender = threading.Thread(target=lambda: (peer.sendall(stream), peer.shutdown(socket.SHUT_WR)))
    sender.start()
    out = bytearray()
    i = 0
    while len(out) < len(stream):
        want = min(limits[i % len(limits)], len(stream) - len(out))
        if i % 3 == 2:
            out += conn.recv_exact(want)          # a frame header's read, between pieces
        else:
            piece = conn.recv_piece(want)
            assert 0 < len(piece) <= want
            out += piece
        i += 1
    sender.join()
    assert bytes(out) == stream
    assert conn.recv_piece(1) == b""
    conn.close()
    peer.close()


def test_dropping_the_buffer_keeps_bytes_read_ahead() -> None:
    """A connection kept between fetches holds no read buffer, and loses nothing."""
    conn, peer = _pair()
    peer.sendall(b"a" * 100 + b"next frame")
    assert bytes(conn.recv_piece(100)) == b"a" * 100
    assert conn.pending() == len(b"next frame")
    conn.drop_read_buffer()
    assert conn._rbuf is None
    assert conn.recv_exact(len(b"next frame")) == b"next frame"
    conn.close()
    peer.close()


def test_a_fetch_leaves_its_kept_connection_without_a_read_buffer(src, dst) -> None:
    """A node keeps one idle connection per supplier between fetches: none of them
    holds a read buffer, and the next fetch over it reads as before."""
    data = {p: write_part(src, p, size) for p, size in ((1, 9 << 20), (2, 5000))}
    pool = ConnPool()
    with SupplierServer(DirectoryStorage(src), SECRET).start() as srv:
        for p in (1, 2):
            Demander(DirectoryStorage(dst), peer_of(srv), SECRET, timeout=10, reuse=True,
                     pool=pool, chunk_size=1 << 20).fetch(p)
            assert read(os.path.join(dst, f"part-{p}.bin")) == data[p]
            kept = [k for idle in pool._idle.values() for k in idle]
            assert len(kept) == 1
            assert kept[0].conn.pending() == 0 and kept[0].conn._rbuf is None
        assert pool.reused == 1
        pool.close_idle()
