"""Versioned, checksummed control frames: the one place the wire framing is defined.

Reusable by any Ferry protocol (the node package registers its own frame types).

Layout (little-endian), 12-byte header then payload::

    0  2  magic    b"FY"
    2  1  version  PROTOCOL_VERSION
    3  1  type     a registered frame type (FrameType or a registered IntEnum)
    4  4  length   payload length, <= MAX_PAYLOAD
    8  4  crc      CRC32C of header bytes 0..8 followed by the payload

The payload is a msgpack map (``body``). Bulk file data never travels inside a frame:
a CHUNK frame announces ``length`` raw bytes that follow it on the stream, covered by
the chunk checksum of the MANIFEST instead (so the sender can use sendfile).

An ERROR frame carries ``{"code": ErrorCode, "message": str}``; it is the answer to
every protocol violation, so the peer learns why instead of seeing a dropped stream.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import struct
import threading
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Iterable, Protocol

from faults.crc import crc32c
import msgpack

from .errors import FrameError, PeerClosed, RemoteError

log = logging.getLogger("ferry.transfer")

MAGIC = b"FY"
PROTOCOL_VERSION = 3   # 3: frames after the handshake carry a MAC; 2: checksums in CHUNK frames
HEADER = struct.Struct("<2sBBII")
HEADER_SIZE = HEADER.size
# Control frames are small; the largest is a MANIFEST (8 bytes per chunk, at most
# MAX_CHUNKS chunks). 1 MiB bounds what a hostile peer can make us buffer.
MAX_PAYLOAD = 1 << 20


class FrameType(IntEnum):
    # authentication (transfer.auth), reused by every node-to-node connection
    HELLO = 1
    CHALLENGE = 2
    RESPONSE = 3
    AUTH_OK = 4
    # transfer
    DEMAND = 10
    QUEUED = 11
    MANIFEST = 12
    ACCEPT = 13
    CHUNK = 14
    PREIMAGE = 15
    END = 16
    RESEND = 17
    APPLIED = 18
    RECEIVED = 19
    BASE = 20        # delta fetch: the demander's page digests
    RANGE = 21       # delta fetch: raw pages follow
    # any protocol
    ERROR = 63


class ErrorCode(IntEnum):
    PROTOCOL = 1        # malformed frame or message
    VERSION = 2         # unsupported protocol version
    AUTH = 3            # handshake failed or missing
    UNKNOWN_TYPE = 4    # frame type not known here
    TOO_LARGE = 5       # frame over MAX_PAYLOAD
    BAD_NAME = 6        # cache/partition name refused (path tricks, NUL ...)
    NOT_HELD = 7        # the supplier does not hold that partition
    NO_SPACE = 8        # the demander has no room
    SOURCE_CHANGED = 9  # the file changed at the source during the send
    CHECKSUM = 10       # a chunk kept arriving corrupted
    BUSY = 11           # supplier shutting down / overloaded
    INTERNAL = 12       # unexpected failure on the sender of the ERROR
    ABORTED = 13        # the peer gave up (e.g. install failed)


# Frame types a decoder accepts; other protocols add theirs with register_types().
_known_types: set[int] = {int(t) for t in FrameType}


def register_types(types: Iterable[int]) -> None:
    """Let another protocol (e.g. the node's) use its own frame types over this framing.
    Values must not collide with FrameType."""
    for t in types:
        if not 0 <= int(t) <= 255:
            raise ValueError(f"frame type {t} out of range 0..255")
        if int(t) in {int(x) for x in FrameType}:
            raise ValueError(f"frame type {int(t)} is reserved by transfer.frames.FrameType")
        _known_types.add(int(t))


@dataclass(frozen=True)
class Frame:
    type: int
    body: dict[str, Any] = field(default_factory=dict)


def encode(ftype: int, body: dict[str, Any] | None = None) -> bytes:
    payload: bytes = msgpack.packb(body or {}, use_bin_type=True)
    if len(payload) > MAX_PAYLOAD:
        raise FrameError(ErrorCode.TOO_LARGE,
                         f"frame type {ftype} payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
    head = HEADER.pack(MAGIC, PROTOCOL_VERSION, int(ftype), len(payload), 0)[:8]
    crc = crc32c(payload, crc32c(head))
    return head + struct.pack("<I", crc) + payload


def decode_header(head: bytes, limit: int = MAX_PAYLOAD) -> tuple[int, int, int]:
    """Validate a 12-byte header (payload at most ``limit``); return (type, payload length, crc)."""
    if len(head) < HEADER_SIZE:
        raise FrameError(ErrorCode.PROTOCOL, f"short frame header ({len(head)} of {HEADER_SIZE} bytes)")
    magic, version, ftype, length, crc = HEADER.unpack_from(head)
    if magic != MAGIC:
        raise FrameError(ErrorCode.PROTOCOL, f"bad frame magic {magic!r} (not a Ferry peer?)")
    if version != PROTOCOL_VERSION:
        raise FrameError(ErrorCode.VERSION,
                         f"protocol version {version} not supported (this side speaks {PROTOCOL_VERSION})")
    if ftype not in _known_types:
        raise FrameError(ErrorCode.UNKNOWN_TYPE, f"unknown frame type {ftype}")
    if length > limit:
        raise FrameError(ErrorCode.TOO_LARGE, f"frame of {length} bytes exceeds the maximum {limit}")
    return ftype, length, crc


def decode_payload(head: bytes, ftype: int, crc: int, payload: bytes) -> Frame:
    if crc32c(payload, crc32c(head[:8])) != crc:
        raise FrameError(ErrorCode.PROTOCOL, f"frame type {ftype} fails its checksum (corrupted on the wire)")
    try:
        body = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    except Exception as e:  # noqa: BLE001 - msgpack raises several unrelated types for garbage; re-raised
        raise FrameError(ErrorCode.PROTOCOL, f"frame type {ftype} payload is not msgpack: {e}") from None
    if not isinstance(body, dict):
        raise FrameError(ErrorCode.PROTOCOL, f"frame type {ftype} payload is not a map")
    return Frame(ftype, body)


def decode(buf: bytes) -> tuple[Frame, int] | None:
    """Decode one frame from the start of ``buf``: (frame, bytes consumed), or None when
    ``buf`` holds only part of a frame. Raises FrameError for anything malformed."""
    if len(buf) < HEADER_SIZE:
        if buf and not MAGIC.startswith(bytes(buf[:2])):
            raise FrameError(ErrorCode.PROTOCOL, f"bad frame magic {bytes(buf[:2])!r}")
        return None
    ftype, length, crc = decode_header(bytes(buf[:HEADER_SIZE]))
    if len(buf) < HEADER_SIZE + length:
        return None
    payload = bytes(buf[HEADER_SIZE:HEADER_SIZE + length])
    return decode_payload(bytes(buf[:HEADER_SIZE]), ftype, crc, payload), HEADER_SIZE + length


class Stream(Protocol):
    """What framing needs from a transport (see transfer.transport)."""

    def send(self, data: bytes | memoryview) -> None: ...
    def recv_exact(self, n: int) -> bytes: ...


TAG_SIZE = 16


class Sealer:
    """The MAC of every frame after the handshake (``conn.sealer``): HMAC-SHA256,
    truncated to 16 bytes, under a key of this direction derived from the session key
    the handshake agreed (transfer.auth), over a sequence number and the frame's bytes.
    A frame changed, injected, dropped, replayed or reordered on the wire fails it.
    The sequence is per direction and counts frames, so a tag and the send it covers
    happen under one lock (several threads may write one connection)."""

    def __init__(self, session_key: bytes, client: bool) -> None:
        k_c = hmac.new(session_key, b"ferry-frames client->server", hashlib.sha256).digest()
        k_s = hmac.new(session_key, b"ferry-frames server->client", hashlib.sha256).digest()
        self._out, self._in = (k_c, k_s) if client else (k_s, k_c)
        self._seq_out = self._seq_in = 0
        self.lock = threading.Lock()

    def tag(self, data: bytes) -> bytes:
        """(lock held) the tag of the next frame sent."""
        seq, self._seq_out = self._seq_out, self._seq_out + 1
        return hmac.new(self._out, seq.to_bytes(8, "little") + data, hashlib.sha256).digest()[:TAG_SIZE]

    def data_key(self, outgoing: bool, label: bytes) -> bytes:
        """A one-time Poly1305 key for raw data of this session (transfer.datamac):
        the sender's direction key (``outgoing`` on the sending side, not on the
        receiving one) over ``label``, which names the data uniquely."""
        k = self._out if outgoing else self._in
        return hmac.new(k, b"ferry-data\0" + label, hashlib.sha256).digest()

    def check(self, head: bytes, payload: bytes, tag: bytes) -> bool:
        seq, self._seq_in = self._seq_in, self._seq_in + 1
        want = hmac.new(self._in, seq.to_bytes(8, "little") + head + payload, hashlib.sha256).digest()
        return hmac.compare_digest(want[:TAG_SIZE], tag)


def send_frame(conn: Stream, data: bytes) -> None:
    """Send one encoded frame, with its MAC once the connection is sealed."""
    sealer: Sealer | None = getattr(conn, "sealer", None)
    if sealer is None:
        conn.send(data)
        return
    with sealer.lock:
        conn.send(data + sealer.tag(data))


def write_frame(conn: Stream, ftype: int, body: dict[str, Any] | None = None) -> None:
    send_frame(conn, encode(ftype, body))


def read_frame(conn: Stream, *, expect: Iterable[int] | None = None,
               limit: int = MAX_PAYLOAD) -> Frame:
    """Read one frame. An ERROR frame raises RemoteError; a frame of a type not in
    ``expect`` raises FrameError(PROTOCOL) naming what was expected. ``limit`` lowers
    the payload maximum (the handshake reads only small frames from strangers)."""
    head = conn.recv_exact(HEADER_SIZE)
    ftype, length, crc = decode_header(head, limit)
    sealer: Sealer | None = getattr(conn, "sealer", None)
    try:
        payload = conn.recv_exact(length)
        tag = conn.recv_exact(TAG_SIZE) if sealer is not None else b""
    except PeerClosed as e:
        raise PeerClosed(f"peer stopped in the middle of a frame of type {ftype} "
                         f"({length} byte payload): {e.reason}") from None
    if sealer is not None and not sealer.check(head, payload, tag):
        raise FrameError(ErrorCode.AUTH, f"frame type {ftype} fails its MAC: changed, injected or "
                         "replayed on the wire (or a peer of another protocol version)")
    frame = decode_payload(head, ftype, crc, payload)
    if ftype == FrameType.ERROR:
        code, msg = frame.body.get("code"), frame.body.get("message")
        raise RemoteError(int(code) if isinstance(code, int) else ErrorCode.PROTOCOL,
                          f"peer reported error {_code_name(code)}: {msg}")
    if expect is not None:
        allowed = set(int(t) for t in expect)
        if ftype not in allowed:
            names = ", ".join(_type_name(t) for t in sorted(allowed))
            raise FrameError(ErrorCode.PROTOCOL, f"unexpected frame {_type_name(ftype)} (expected {names})")
    return frame


def send_error(conn: Stream, code: int, message: str) -> None:
    """Best-effort ERROR frame: the peer may already be gone, which is no new failure."""
    try:
        write_frame(conn, FrameType.ERROR, {"code": int(code), "message": message[:4000]})
    except Exception as e:  # noqa: BLE001 - best effort over any transport; the caller reports the failure
        log.debug("ERROR frame (%s) not sent: %r", message[:200], e)


def _type_name(t: int) -> str:
    try:
        return FrameType(t).name
    except ValueError:
        return str(t)


def _code_name(c: object) -> str:
    try:
        return ErrorCode(c).name  # type: ignore[arg-type]
    except (ValueError, TypeError):
        return str(c)
