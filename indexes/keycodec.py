"""Order-preserving encoding of index values and the layout of one LMDB entry key.

This module is the only place that writes or parses index keys (docs/indexes.md has
the same rules in prose). LMDB compares keys as unsigned bytes (memcmp, then length),
so an encoding that preserves order turns a range of values into a range of keys.

Value encoding, one tag byte then a body; the tag fixes the order between types::

    0x10 null                      (no body)
    0x18 false, 0x19 true          (no body)
    0x20 number                    8 bytes ordered float64 + 2 bytes int correction
    0x30 string (UTF-8)            escaped body + terminator
    0x38 bytes (msgpack bin)       escaped body + terminator

so null < false < true < every number < every string < every byte string.

Numbers: ints and floats share one tag so that 1 < 1.5 < 2 and ``1 == 1.0``. The body
is the float64 nearest to the value with its bits made sortable (negative: all bits
inverted; positive: sign bit set), then ``value - int(float64)`` as a big-endian u16
biased by 0x8000. That correction is 0 for every float and for ints of magnitude up to
2**53; above that it orders ints that round to the same float64 (|correction| <= 2048
for ints in [-2**63, 2**64), the range accepted). -0.0 is stored as 0.0; NaN is refused.

Strings and bytes: 0x00 in the body becomes 0x00 0xFF; the body ends with 0x00 0x01.
A prefix therefore sorts before its extensions and the encoding is self-delimiting,
so ``encoded value + primary key`` can be split again. A body longer than
``LONG_BODY`` bytes is cut there (never inside an escape pair or a UTF-8
character) and ends with
0x00 0x02 + xxh3-128 of the whole value: long values sort by their first
``LONG_BODY`` bytes, then by hash (their only imprecise order), and stay exact for
lookups.

Entry key (one LMDB key per (index, value, primary key))::

    u16 BE index id | encoded value | primary key

When that exceeds LMDB's key limit the primary key is replaced by its xxh3-128. An
entry whose key holds a hash carries its full value and primary key in the LMDB data
as msgpack ``[value, primary_key]``; every other entry has empty data.
"""
from __future__ import annotations

import math
import struct

import msgpack
import xxhash

from .errors import UnencodableValue

TAG_NULL = 0x10
TAG_FALSE = 0x18
TAG_TRUE = 0x19
TAG_NUMBER = 0x20
TAG_STRING = 0x30
TAG_BYTES = 0x38

# Long enough that real-world names, emails and ids are never cut; short enough that
# index id + value leaves > 280 bytes of LMDB's 511-byte key for the primary key.
LONG_BODY = 200
HASH_LEN = 16
END = b"\x00\x01"
LONG_END = b"\x00\x02"

INT_MIN = -(1 << 63)
INT_MAX = (1 << 64) - 1
_SIGN = 1 << 63
_ALL = (1 << 64) - 1
_BIAS = 0x8000

_U16 = struct.Struct(">H")
_NUM = struct.Struct(">QH")
_DBL = struct.Struct(">d")
_U64 = struct.Struct(">Q")

_NULL = bytes([TAG_NULL])
_FALSE = bytes([TAG_FALSE])
_TRUE = bytes([TAG_TRUE])
_STR = bytes([TAG_STRING])
_BYT = bytes([TAG_BYTES])


def _num(f: float, correction: int) -> bytes:
    if f == 0.0:
        f = 0.0                       # -0.0 == 0.0: one key for both
    bits = _U64.unpack(_DBL.pack(f))[0]
    bits = (bits ^ _ALL) if bits & _SIGN else (bits | _SIGN)
    return bytes([TAG_NUMBER]) + _NUM.pack(bits, correction + _BIAS)


def _text(tag: bytes, raw: bytes) -> bytes:
    body = raw.replace(b"\x00", b"\x00\xff")
    if len(body) <= LONG_BODY:
        return tag + body + END
    end = LONG_BODY
    if tag == _STR:     # cut on a character boundary, so the prefix decodes
        while end > 0 and 0x80 <= body[end] <= 0xBF:
            end -= 1
    cut = body[:end]
    # Every escaped 0x00 is followed by 0xFF, so a cut ending in 0x00 split a pair.
    if cut.endswith(b"\x00"):
        cut = cut[:-1]
    return tag + cut + LONG_END + xxhash.xxh3_128_digest(raw)


def encode_value(v: object) -> bytes:
    """The order-preserving encoding of one scalar; UnencodableValue otherwise."""
    t = type(v)
    if t is str:
        return _text(_STR, v.encode("utf-8", "surrogatepass"))  # type: ignore[attr-defined]
    if t is int:
        if not INT_MIN <= v <= INT_MAX:  # type: ignore[operator]
            raise UnencodableValue(f"integer {v} is outside [-2**63, 2**64)")
        f = float(v)                      # type: ignore[arg-type]
        return _num(f, v - int(f))        # type: ignore[operator]
    if t is float:
        if math.isnan(v):                 # type: ignore[arg-type]
            raise UnencodableValue("NaN has no order")
        return _num(v, 0)                 # type: ignore[arg-type]
    if v is None:
        return _NULL
    if t is bool:
        return _TRUE if v else _FALSE
    if t is bytes or t is bytearray or t is memoryview:
        return _text(_BYT, bytes(v))      # type: ignore[call-overload]
    if isinstance(v, bool):
        return _TRUE if v else _FALSE
    if isinstance(v, int):
        return encode_value(int(v))
    if isinstance(v, float):
        return encode_value(float(v))
    if isinstance(v, str):
        return encode_value(str(v))
    raise UnencodableValue(f"a {type(v).__name__} cannot be indexed (only null, bool, "
                           "numbers, strings and bytes)")


def is_long(enc: bytes) -> bool:
    """True when ``enc`` (a whole encoded value) holds a hash instead of the full body."""
    return enc[0] in (TAG_STRING, TAG_BYTES) and enc[-HASH_LEN - 2:-HASH_LEN] == LONG_END


def decode_value(buf: bytes, pos: int = 0) -> tuple[object, int]:
    """Decode the value starting at ``buf[pos]``; return it and the position after it.
    A long (hashed) value decodes to its first LONG_BODY bytes only."""
    tag = buf[pos]
    if tag == TAG_NULL:
        return None, pos + 1
    if tag == TAG_FALSE:
        return False, pos + 1
    if tag == TAG_TRUE:
        return True, pos + 1
    if tag == TAG_NUMBER:
        bits, corr = _NUM.unpack_from(buf, pos + 1)
        bits = (bits ^ _SIGN) if bits & _SIGN else (bits ^ _ALL)
        f = _DBL.unpack(_U64.pack(bits))[0]
        corr -= _BIAS
        if corr or (f.is_integer() and abs(f) <= INT_MAX):
            return int(f) + corr, pos + 1 + _NUM.size
        return f, pos + 1 + _NUM.size
    if tag in (TAG_STRING, TAG_BYTES):
        i = pos + 1
        while True:
            z = buf.index(b"\x00", i)
            nxt = buf[z + 1]
            if nxt == 0xFF:
                i = z + 2
                continue
            raw = buf[pos + 1:z].replace(b"\x00\xff", b"\x00")
            end = z + 2 + (HASH_LEN if nxt == 0x02 else 0)
            if nxt not in (0x01, 0x02):
                raise ValueError(f"bad string terminator 0x00 0x{nxt:02x} at {z}")
            return (raw.decode("utf-8", "surrogatepass") if tag == TAG_STRING else raw), end
    raise ValueError(f"unknown value tag 0x{tag:02x} at {pos}")


def index_prefix(index_id: int) -> bytes:
    return _U16.pack(index_id)


def entry(index_id: int, enc: bytes, value: object, pk: bytes,
          max_key: int) -> tuple[bytes, bytes]:
    """The LMDB (key, data) of one index entry."""
    head = _U16.pack(index_id) + enc
    if len(head) + len(pk) <= max_key and not is_long(enc):
        return head + pk, b""
    suffix = pk if len(head) + len(pk) <= max_key else xxhash.xxh3_128_digest(pk)
    return head + suffix, msgpack.packb([value, pk], use_bin_type=True)


def parse_entry(key: bytes, data: bytes) -> tuple[int, object, bytes]:
    """(index id, value, primary key) of one stored entry."""
    index_id = _U16.unpack_from(key)[0]
    if data:
        value, pk = msgpack.unpackb(data, raw=False)
        return index_id, value, bytes(pk)
    value, end = decode_value(key, 2)
    return index_id, value, key[end:]


def split_key(key: bytes) -> tuple[int, bytes, bytes]:
    """(index id, encoded value, primary-key suffix) of a stored key, without decoding."""
    _, end = decode_value(key, 2)
    return _U16.unpack_from(key)[0], key[2:end], key[end:]
