"""Hypothesis strategies for Ferry's wire formats and a client that throws them at a
live server (shared by tests/transfer/test_fuzz_wire.py and tests/node/test_rpc_hostile.py).

What a server must do with anything it is sent: answer with well-formed frames (an
ERROR, or whatever the protocol says next) or close, within a few seconds of the peer
closing its side, and go on serving others. :func:`exchange` checks the first part for
one connection; the tests check the second with a good client afterwards.
"""
from __future__ import annotations

import socket
import time
from typing import Any, Iterable

from hypothesis import strategies as st

from transfer import frames
from transfer.auth import client_handshake
from transfer.frames import FrameType
from transfer.transport import SocketConn

EDGE_INTS = [0, 1, -1, 2, 7, 255, 256, 65535, 64 << 10, 1 << 20, 4 << 20, 2**31 - 1, 2**31,
             2**32, 2**63 - 1, -2**63, 2**64 - 1]

ints = st.sampled_from(EDGE_INTS) | st.integers(-2**63, 2**64 - 1)
scalars = (st.none() | st.booleans() | ints | st.floats(allow_nan=False) | st.text(max_size=16)
           | st.binary(max_size=40))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
values_map = st.dictionaries(st.text(max_size=8), values, max_size=5)
names = st.sampled_from(["default", "c", "..", ".", "../etc", "/etc", "a\0b", "", "x" * 65]) | st.text(max_size=12)


def body_for(fields: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A body with each of ``fields`` (a strategy of plausible values) present or not,
    sometimes replaced by any value, plus now and then an unknown key."""
    return st.fixed_dictionaries({}, optional={k: v | values for k, v in fields.items()}) \
        .flatmap(lambda d: st.dictionaries(st.text(max_size=6), values, max_size=2).map(lambda x: {**x, **d}))


HANDSHAKE_BODIES = {
    FrameType.HELLO: body_for({"nonce": st.binary(min_size=30, max_size=34), "role": names}),
    FrameType.RESPONSE: body_for({"mac": st.binary(min_size=30, max_size=34)}),
}
TRANSFER_BODIES = {
    FrameType.DEMAND: body_for({"cache": names, "partition": ints, "priority": ints, "chunk_size": ints,
                                "held": st.binary(max_size=48)}),
    FrameType.ACCEPT: st.just({}),
    FrameType.RECEIVED: body_for({"index": ints}),
    FrameType.RESEND: body_for({"chunks": st.lists(ints, max_size=600)}),
    FrameType.APPLIED: body_for({"ok": st.booleans()}),
    FrameType.ERROR: body_for({"code": ints, "message": st.text(max_size=20)}),
}


def framed(types: Iterable[int], bodies: dict[int, st.SearchStrategy]) -> st.SearchStrategy[bytes]:
    """One well-framed frame (right magic, version, length and CRC) of one of ``types``
    or any type byte, with a body from ``bodies`` or any map."""
    types = list(types)

    def encode(t: int, body: dict[str, Any]) -> bytes:
        try:
            return frames.encode(t, body)
        except Exception:          # too big, or a value msgpack cannot carry
            return frames.encode(t, {})
    known = st.sampled_from(types).flatmap(lambda t: st.tuples(st.just(t), bodies.get(t, values_map)))
    anytype = st.tuples(st.integers(0, 255), values_map)
    return (known | anytype).map(lambda tb: encode(*tb))


def mutated(base: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """A frame with bytes overwritten, cut short or padded."""
    def apply(raw: bytes, flips: list[tuple[int, int]], cut: int, pad: bytes) -> bytes:
        buf = bytearray(raw)
        for pos, val in flips:
            if buf:
                buf[pos % len(buf)] = val
        return bytes(buf[:cut]) + pad if cut < len(buf) else bytes(buf) + pad
    return st.builds(apply, base, st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=4),
                     st.integers(0, 400), st.binary(max_size=8))


def streams(types: Iterable[int], bodies: dict[int, st.SearchStrategy]) -> st.SearchStrategy[bytes]:
    """What a hostile client sends on one connection: garbage, or 1-4 frames, some
    mutated."""
    one = framed(types, bodies)
    frame = one | mutated(one)
    return st.binary(max_size=300) | st.lists(frame, min_size=1, max_size=4).map(b"".join)


def exchange(address: tuple[str, int], payload: bytes | list[bytes], *, secret: bytes | None = None,
             role: str = "transfer", wait: float = 5.0, pause: float = 0.02) -> list[frames.Frame]:
    """Send ``payload`` (after a real handshake when ``secret`` is given), close our
    side, and read to the end. A list is sent part by part, reading the server's answer
    to each part (until it is quiet for ``pause`` s) before the next, as a client that
    follows the conversation would. Fails if the server neither closes within ``wait``
    s nor sends well-formed frames; returns those it sent (raw CHUNK data skipped)."""
    parts = [payload] if isinstance(payload, bytes) else payload
    s = socket.create_connection(address, timeout=wait)
    got = bytearray()
    sealed = False
    try:
        if secret is not None:
            conn = SocketConn(s)
            client_handshake(conn, secret, role=role)
            # an authenticated peer gone hostile: what it sends is sealed like any
            # frame (so the server's parsers behind the MAC are what is fuzzed)
            assert conn.sealer is not None
            parts = [seal(conn.sealer, part) for part in parts]
            sealed = True
        closed = False
        for k, part in enumerate(parts):
            try:
                s.sendall(part)
            except OSError:
                break                 # the server has answered and closed already
            if k < len(parts) - 1 and _read(s, got, pause, until_quiet=True):
                closed = True
                break
        if not closed:
            try:
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            assert _read(s, got, wait, until_quiet=False), \
                f"server neither closed nor finished answering within {wait} s"
    finally:
        s.close()
    return parse(bytes(got), sealed=sealed)


def seal(sealer: frames.Sealer, raw: bytes) -> bytes:
    """``raw`` with the MAC after each well-framed frame in it (its header's length
    fits what follows; its checksum or body may be bad); anything else stays as it is."""
    out = bytearray()
    pos = 0
    while pos + frames.HEADER_SIZE <= len(raw) and raw[pos:pos + 2] == frames.MAGIC:
        length = int.from_bytes(raw[pos + 4:pos + 8], "little")
        end = pos + frames.HEADER_SIZE + length
        if end > len(raw):
            break
        out += raw[pos:end] + sealer.tag(raw[pos:end])
        pos = end
    return bytes(out + raw[pos:])


def _read(s: socket.socket, got: bytearray, seconds: float, *, until_quiet: bool) -> bool:
    """Read into ``got``; True once the server has closed. ``until_quiet``: stop after
    ``seconds`` without a byte; else stop (False) ``seconds`` from now."""
    deadline = time.monotonic() + seconds
    while True:
        left = seconds if until_quiet else deadline - time.monotonic()
        if left <= 0:
            return False
        s.settimeout(left)
        try:
            b = s.recv(1 << 16)
        except socket.timeout:
            if until_quiet:
                return False
            continue
        except ConnectionResetError:
            return True               # closed with our bytes unread: a close all the same
        if not b:
            return True
        got += b


def parse(buf: bytes, *, sealed: bool = False) -> list[frames.Frame]:
    """The frames of a server's answer; raw CHUNK data skipped (``sealed``: each frame
    is followed by its MAC, skipped too). A cut-off tail (a reset connection) ends the
    list; a malformed frame fails."""
    out = []
    pos = 0
    while pos < len(buf):
        got = frames.decode(buf[pos:])
        if got is None:
            break
        fr, n = got
        out.append(fr)
        pos += n + (frames.TAG_SIZE if sealed else 0)
        if fr.type == FrameType.CHUNK:
            pos += int(fr.body.get("length", 0))
    return out
