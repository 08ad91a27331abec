"""The transfer protocol's messages: one frozen dataclass per frame body, each with
``to_body()`` and a validating ``from_body()``. Nothing else parses these bodies.

Names are validated here, once: a cache name is ``[A-Za-z0-9_.-]{1,64}`` and not
``.``/``..``; a partition is an integer 0..2**31-1. Anything else (``../``, absolute
paths, NUL, strings where numbers belong) is refused with ErrorCode.BAD_NAME before
any storage is touched.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from .errors import BadName, FrameError
from .frames import ErrorCode, FrameType

CHECKSUM_ALGO = "xxh3_64"
MIN_CHUNK = 64 * 1024
MAX_CHUNK = 64 * 1024 * 1024
MAX_CHUNKS = (1 << 20) // 12 - 1024  # a DEMAND's held list (12 bytes a chunk) must fit one frame
MAX_PARTITION = 2**31 - 1
# A delta fetch's BASE list: at most this many page digests in all (16 bytes each: 64
# MiB for 16 GiB of 4 KiB pages), and per BASE frame (512 KiB of digests).
MAX_BASE_PAGES = 1 << 22
BASE_PER_FRAME = 1 << 15
MAX_RANGES = 1 << 22
_CACHE_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_HELD = struct.Struct("<IQ")


class Priority(IntEnum):
    """Lower runs first: restoring a lost copy beats an ordinary rebalance."""
    RECOVERY = 0
    REBALANCE = 1
    BACKGROUND = 2


def check_cache(name: object) -> str:
    if not isinstance(name, str) or not _CACHE_RE.fullmatch(name) or name in (".", ".."):
        raise BadName(f"cache name {name!r} refused: use 1-64 of A-Z a-z 0-9 _ . - (no paths)")
    return name


def check_partition(p: object) -> int:
    if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p <= MAX_PARTITION:
        raise BadName(f"partition {p!r} refused: must be an integer 0..{MAX_PARTITION}")
    return p


def _int(body: dict[str, Any], key: str, lo: int = 0, hi: int = 2**63 - 1) -> int:
    v = body.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise FrameError(ErrorCode.PROTOCOL, f"field {key!r} must be an integer {lo}..{hi}, got {v!r}")
    return v


def _bytes(body: dict[str, Any], key: str) -> bytes:
    v = body.get(key)
    if not isinstance(v, bytes):
        raise FrameError(ErrorCode.PROTOCOL, f"field {key!r} must be bytes")
    return v


def _mac(body: dict[str, Any]) -> bytes:
    v = body.get("mac", b"")
    if not isinstance(v, bytes) or len(v) not in (0, 16):
        raise FrameError(ErrorCode.PROTOCOL, "field 'mac' must be 16 bytes")
    return v


def check_chunk_size(n: int) -> int:
    if not MIN_CHUNK <= n <= MAX_CHUNK or n & (n - 1):
        raise FrameError(ErrorCode.PROTOCOL, f"chunk size {n} must be a power of two {MIN_CHUNK}..{MAX_CHUNK}")
    return n


@dataclass(frozen=True)
class Demand:
    cache: str
    partition: int
    priority: int = Priority.REBALANCE
    chunk_size: int = 1 << 20
    held: dict[int, int] = field(default_factory=dict)   # chunk index -> checksum
    # A delta fetch: the demander holds ``base_pages`` pages of ``base_page_size`` bytes
    # of an older copy; their digests follow in BASE frames. A delta is used only if at
    # most ``delta_limit`` permille of the snapshot's pages must travel.
    base_pages: int = 0
    base_page_size: int = 0
    delta_limit: int = 500

    TYPE = FrameType.DEMAND

    def to_body(self) -> dict[str, Any]:
        held = b"".join(_HELD.pack(i, s) for i, s in sorted(self.held.items()))
        body: dict[str, Any] = {"cache": self.cache, "partition": self.partition,
                                "priority": int(self.priority), "chunk_size": self.chunk_size,
                                "held": held}
        if self.base_pages:
            body.update(base_pages=self.base_pages, base_page_size=self.base_page_size,
                        delta_limit=self.delta_limit)
        return body

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> "Demand":
        try:
            cache = check_cache(body.get("cache"))
            partition = check_partition(body.get("partition"))
        except BadName as e:
            raise FrameError(ErrorCode.BAD_NAME, e.reason) from None
        raw = _bytes(body, "held")
        if len(raw) % _HELD.size or len(raw) // _HELD.size > MAX_CHUNKS:
            raise FrameError(ErrorCode.PROTOCOL, "DEMAND held list is malformed")
        held = {i: s for i, s in _HELD.iter_unpack(raw)}
        base = _int(body, "base_pages", 0, MAX_BASE_PAGES) if "base_pages" in body else 0
        base_ps = _int(body, "base_page_size", 1, 1 << 24) if base else 0
        limit = _int(body, "delta_limit", 0, 1000) if base else 500
        if base and held:
            raise FrameError(ErrorCode.PROTOCOL, "DEMAND offers both held chunks and a delta base")
        return cls(cache, partition, _int(body, "priority", 0, 255),
                   check_chunk_size(_int(body, "chunk_size")), held, base, base_ps, limit)


@dataclass(frozen=True)
class Base:
    """Demander -> supplier after a DEMAND with ``base_pages``: the digests
    (transfer.delta, 16 bytes each) of its base's pages ``first ..``, in order; the
    frames cover pages 0 .. base_pages - 1 exactly."""
    first: int
    digests: bytes

    TYPE = FrameType.BASE

    def to_body(self) -> dict[str, Any]:
        return {"first": self.first, "digests": self.digests}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> "Base":
        raw = _bytes(body, "digests")
        if not raw or len(raw) % 16 or len(raw) // 16 > BASE_PER_FRAME:
            raise FrameError(ErrorCode.PROTOCOL, f"BASE frame of {len(raw)} digest bytes: "
                             f"1..{BASE_PER_FRAME} digests of 16 bytes")
        return cls(_int(body, "first", 0, MAX_BASE_PAGES), raw)


@dataclass(frozen=True)
class Range:
    """Supplier -> demander in a delta fetch: ``pages`` raw pages from page ``first``
    follow on the stream; ``checksum`` is their xxh3-64 as of C."""
    first: int
    pages: int
    checksum: int
    mac: bytes = b""          # Poly1305 of the pages at C (transfer.datamac), sealed sessions

    TYPE = FrameType.RANGE

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"first": self.first, "pages": self.pages, "sum": self.checksum}
        if self.mac:
            body["mac"] = self.mac
        return body

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> "Range":
        return cls(_int(body, "first", 0, 2**32 - 1), _int(body, "pages", 1, 1 << 16),
                   _int(body, "sum", 0, 2**64 - 1), _mac(body))


@dataclass(frozen=True)
class Manifest:
    """What the supplier sends before the data. Version 2 carries no checksum per
    chunk: each chunk's checksum travels in its CHUNK frame, so the supplier hashes a
    chunk while the previous one is on the wire instead of reading the whole file
    before the first byte. ``skip`` lists the chunks the demander offered in its DEMAND
    whose checksum the supplier confirmed at C: those are not sent."""
    counter: int          # snapshot update counter C
    size: int             # bytes the demander ends up with (page_count * page_size for page files)
    page_size: int
    page_count: int
    chunk_size: int
    skip: frozenset[int] = frozenset()
    algo: str = CHECKSUM_ALGO
    # A delta fetch (the DEMAND offered a base): ``ranges`` RANGE frames carrying
    # ``delta_pages`` pages follow instead of CHUNKs, and ``root`` (16 bytes) is the
    # digest of the snapshot's page digests at C (transfer.delta). ``delta_refused``
    # says why a base was offered but the whole file follows.
    delta: bool = False
    ranges: int = 0
    delta_pages: int = 0
    root: bytes = b""
    delta_refused: str = ""

    TYPE = FrameType.MANIFEST

    @property
    def chunk_count(self) -> int:
        return -(-self.size // self.chunk_size)

    def chunk_span(self, index: int) -> tuple[int, int]:
        off = index * self.chunk_size
        return off, min(self.chunk_size, self.size - off)

    def to_body(self) -> dict[str, Any]:
        skip = sorted(self.skip)
        body: dict[str, Any] = {
            "counter": self.counter, "size": self.size, "page_size": self.page_size,
            "page_count": self.page_count, "chunk_size": self.chunk_size, "algo": self.algo,
            "skip": struct.pack(f"<{len(skip)}I", *skip)}
        if self.delta:
            body.update(delta=True, ranges=self.ranges, delta_pages=self.delta_pages, root=self.root)
        if self.delta_refused:
            body["delta_refused"] = self.delta_refused
        return body

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> "Manifest":
        size = _int(body, "size")
        chunk = check_chunk_size(_int(body, "chunk_size"))
        n = -(-size // chunk)
        if n > MAX_CHUNKS:
            raise FrameError(ErrorCode.PROTOCOL, f"MANIFEST of {n} chunks exceeds the maximum {MAX_CHUNKS}")
        raw = _bytes(body, "skip")
        if len(raw) % 4:
            raise FrameError(ErrorCode.PROTOCOL, "MANIFEST skip list is malformed")
        skip = frozenset(struct.unpack(f"<{len(raw) // 4}I", raw))
        if any(i >= n for i in skip):
            raise FrameError(ErrorCode.PROTOCOL, f"MANIFEST skips a chunk beyond its {n} chunks")
        if body.get("algo") != CHECKSUM_ALGO:
            raise FrameError(ErrorCode.PROTOCOL, f"MANIFEST checksum algorithm {body.get('algo')!r} "
                             f"not supported (this side uses {CHECKSUM_ALGO})")
        page_size, page_count = _int(body, "page_size", 1, 1 << 24), _int(body, "page_count")
        refused = body.get("delta_refused", "")
        if not isinstance(refused, str) or len(refused) > 1000:
            raise FrameError(ErrorCode.PROTOCOL, "MANIFEST delta_refused must be a short string")
        if not body.get("delta"):
            return cls(_int(body, "counter"), size, page_size, page_count, chunk, skip,
                       delta_refused=refused)
        if body.get("delta") is not True or skip or size != page_size * page_count:
            raise FrameError(ErrorCode.PROTOCOL, "a delta MANIFEST needs a page file "
                             "(size = pages x page size) and no skip list")
        root = _bytes(body, "root")
        pages = _int(body, "delta_pages", 0, page_count)
        ranges = _int(body, "ranges", 0, min(pages, MAX_RANGES))
        if len(root) != 16 or (ranges == 0) != (pages == 0):
            raise FrameError(ErrorCode.PROTOCOL, "delta MANIFEST root or range count is malformed")
        return cls(_int(body, "counter"), size, page_size, page_count, chunk, skip,
                   delta=True, ranges=ranges, delta_pages=pages, root=root)


@dataclass(frozen=True)
class Chunk:
    """Announces ``length`` raw bytes of chunk ``index`` that follow on the stream, and
    ``checksum``, their xxh3-64 as of the snapshot's counter C."""
    index: int
    length: int
    checksum: int
    mac: bytes = b""          # Poly1305 of the bytes at C (transfer.datamac), sealed sessions

    TYPE = FrameType.CHUNK

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"index": self.index, "length": self.length, "sum": self.checksum}
        if self.mac:
            body["mac"] = self.mac
        return body

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> "Chunk":
        return cls(_int(body, "index", 0, MAX_CHUNKS), _int(body, "length", 0, MAX_CHUNK),
                   _int(body, "sum", 0, 2**64 - 1), _mac(body))


@dataclass(frozen=True)
class Preimage:
    page: int
    data: bytes

    TYPE = FrameType.PREIMAGE

    def to_body(self) -> dict[str, Any]:
        return {"page": self.page, "data": self.data}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> "Preimage":
        return cls(_int(body, "page"), _bytes(body, "data"))


@dataclass(frozen=True)
class End:
    chunks_sent: int
    bytes_sent: int
    preimages: int

    TYPE = FrameType.END

    def to_body(self) -> dict[str, Any]:
        return {"chunks_sent": self.chunks_sent, "bytes_sent": self.bytes_sent, "preimages": self.preimages}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> "End":
        return cls(_int(body, "chunks_sent"), _int(body, "bytes_sent"), _int(body, "preimages"))


@dataclass(frozen=True)
class Resend:
    chunks: tuple[int, ...]

    TYPE = FrameType.RESEND

    def to_body(self) -> dict[str, Any]:
        return {"chunks": list(self.chunks)}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> "Resend":
        v = body.get("chunks")
        if not isinstance(v, list) or not v or len(v) > MAX_CHUNKS or \
                not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < MAX_CHUNKS for i in v):
            raise FrameError(ErrorCode.PROTOCOL, "RESEND needs a non-empty list of chunk indexes")
        # Each chunk once, in order: a 523-byte RESEND naming chunk 0 five hundred times
        # would otherwise make the supplier send it five hundred times.
        return cls(tuple(sorted(set(v))))


@dataclass(frozen=True)
class Queued:
    position: int

    TYPE = FrameType.QUEUED

    def to_body(self) -> dict[str, Any]:
        return {"position": self.position}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> "Queued":
        return cls(_int(body, "position"))


@dataclass(frozen=True)
class Received:
    """Demander -> supplier during the data stage: every chunk up to ``index`` that was
    sent has been read out of the socket. Only then may the supplier mark those bytes
    sent: sendfile queues references to page-cache pages, not copies, so bytes still
    in flight would show a page the checkpointer overwrites after sendfile returned."""
    index: int

    TYPE = FrameType.RECEIVED

    def to_body(self) -> dict[str, Any]:
        return {"index": self.index}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> "Received":
        return cls(_int(body, "index", 0, max(MAX_CHUNKS, MAX_RANGES)))
