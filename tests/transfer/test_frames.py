from __future__ import annotations

import socket
import struct

import crc32c
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transfer import frames
from transfer.errors import FrameError, PeerClosed, RemoteError
from transfer.frames import HEADER_SIZE, ErrorCode, FrameType, decode, encode
from transfer.transport import SocketConn


def _raw(ftype: int = FrameType.DEMAND, payload: bytes = b"\x80", version: int = frames.PROTOCOL_VERSION,
         magic: bytes = b"FY", length: int | None = None, crc: int | None = None) -> bytes:
    head = struct.pack("<2sBBI", magic, version, ftype, len(payload) if length is None else length)
    c = crc32c.crc32c(payload, crc32c.crc32c(head)) if crc is None else crc
    return head + struct.pack("<I", c) + payload


def test_roundtrip() -> None:
    buf = encode(FrameType.MANIFEST, {"a": 1, "b": b"xy"}) + encode(FrameType.END, {})
    f1, n1 = decode(buf)
    f2, n2 = decode(buf[n1:])
    assert (f1.type, f1.body) == (FrameType.MANIFEST, {"a": 1, "b": b"xy"})
    assert (f2.type, f2.body, n1 + n2) == (FrameType.END, {}, len(buf))


def test_partial_frame_is_incomplete_not_an_error() -> None:
    buf = encode(FrameType.DEMAND, {"x": 1})
    for cut in range(len(buf)):
        assert decode(buf[:cut]) is None


BAD = [
    ("bad magic", _raw(magic=b"GET"[:2]), ErrorCode.PROTOCOL, "magic"),
    ("wrong version", _raw(version=9), ErrorCode.VERSION, "version 9"),
    ("unknown type", _raw(ftype=200), ErrorCode.UNKNOWN_TYPE, "unknown frame type 200"),
    ("oversized", _raw(length=frames.MAX_PAYLOAD + 1), ErrorCode.TOO_LARGE, "exceeds"),
    ("bad checksum", _raw(crc=1234), ErrorCode.PROTOCOL, "checksum"),
    ("not msgpack", _raw(payload=b"\xc1\xc1"), ErrorCode.PROTOCOL, "not msgpack"),
    ("not a map", _raw(payload=msgpack.packb([1, 2])), ErrorCode.PROTOCOL, "not a map"),
]


@pytest.mark.parametrize("name,buf,code,text", BAD, ids=[b[0] for b in BAD])
def test_bad_frames_table(name: str, buf: bytes, code: int, text: str) -> None:
    with pytest.raises(FrameError, match=text) as ei:
        decode(buf)
    assert ei.value.code == code


def test_encode_refuses_oversized() -> None:
    with pytest.raises(FrameError) as ei:
        encode(FrameType.MANIFEST, {"x": b"\0" * (frames.MAX_PAYLOAD + 1)})
    assert ei.value.code == ErrorCode.TOO_LARGE


def test_read_frame_over_socket_errors_and_truncation() -> None:
    a, b = socket.socketpair()
    ca, cb = SocketConn(a, "a"), SocketConn(b, "b")
    frames.send_error(ca, ErrorCode.NOT_HELD, "no such partition")
    with pytest.raises(RemoteError, match="NOT_HELD: no such partition") as ei:
        frames.read_frame(cb)
    assert ei.value.code == ErrorCode.NOT_HELD
    frames.write_frame(ca, FrameType.END, {})
    with pytest.raises(FrameError, match="unexpected frame END"):
        frames.read_frame(cb, expect=[FrameType.MANIFEST])
    # the peer stops in the middle of a frame
    full = encode(FrameType.MANIFEST, {"k": b"v" * 100})
    a.sendall(full[:HEADER_SIZE + 10])
    a.close()
    with pytest.raises(PeerClosed, match="middle of a frame"):
        frames.read_frame(cb)
    b.close()


def test_register_types_for_other_protocols() -> None:
    with pytest.raises(ValueError, match="reserved"):
        frames.register_types([int(FrameType.DEMAND)])
    frames.register_types([150])
    f, _ = decode(encode(150, {"node": 1}))
    assert f.type == 150 and f.body == {"node": 1}


def _check_decoder(buf: bytes) -> None:
    try:
        out = decode(buf)
    except FrameError as e:
        assert e.code in set(ErrorCode)
        return
    if out is not None:
        frame, n = out
        assert 0 < n <= len(buf) and isinstance(frame.body, dict)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes(buf: bytes) -> None:
    _check_decoder(buf)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(list(FrameType)), st.dictionaries(st.text(max_size=5), st.integers() | st.binary(max_size=20),
                                                         max_size=4),
       st.lists(st.tuples(st.integers(0, 300), st.integers(0, 255)), max_size=6), st.integers(0, 400))
def test_fuzz_mutated_frames(ftype, body, flips, cut) -> None:
    try:
        buf = bytearray(encode(ftype, body))
    except (OverflowError, TypeError):
        return
    original = bytes(buf)
    for pos, val in flips:
        if pos < len(buf):
            buf[pos] = val
    buf = buf[:cut] if cut < len(buf) else buf
    _check_decoder(bytes(buf))
    if bytes(buf) == original:
        assert decode(bytes(buf))[0].body == body


def test_sealed_frames_refuse_change_replay_reordering_and_the_other_direction() -> None:
    key = b"k" * 32
    client, server = frames.Sealer(key, client=True), frames.Sealer(key, client=False)
    a = frames.encode(FrameType.RECEIVED, {"index": 1})
    b = frames.encode(FrameType.RECEIVED, {"index": 2})
    ta, tb = client.tag(a), client.tag(b)
    h = frames.HEADER_SIZE
    assert server.check(a[:h], a[h:], ta) and server.check(b[:h], b[h:], tb)
    # replayed (the sequence moved on), reordered, changed, reflected back, other key
    s2 = frames.Sealer(key, client=False)
    assert not s2.check(b[:h], b[h:], tb)                       # b first: out of order
    s3 = frames.Sealer(key, client=False)
    assert s3.check(a[:h], a[h:], ta) and not s3.check(a[:h], a[h:], ta)   # a twice
    s4 = frames.Sealer(key, client=False)
    bad = bytearray(a)
    bad[-1] ^= 1
    assert not s4.check(bytes(bad[:h]), bytes(bad[h:]), ta)
    c2 = frames.Sealer(key, client=True)
    assert not c2.check(a[:h], a[h:], frames.Sealer(key, client=True).tag(a))   # its own direction
    assert not frames.Sealer(b"x" * 32, client=False).check(a[:h], a[h:], frames.Sealer(key, client=True).tag(a))
