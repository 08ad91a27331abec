"""Index definitions and the step from a stored value to its index entries.

A definition names an index, the field path into the value's document, whether the
index is unique, the expected type (optional) and the bad-value policy. Values are
documents: JSON objects (UTF-8) by default, msgpack maps with ``codec="msgpack"``.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import msgpack

from .errors import BadDocument, IndexDefinitionError

try:  # orjson parses a 100-byte document ~5x faster than json; optional.
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None  # type: ignore[assignment]  # checked for None before each use

# orjson accepts a subset of what json accepts and parses it identically, so a
# document it parses needs no second opinion (see _json_loads); None without orjson.
fast_json_loads: Callable[[bytes], Any] | None = _orjson.loads if _orjson is not None else None

ON_BAD = ("skip", "refuse")
TYPES = (None, "int", "number", "str", "bool", "bytes")
CODECS = ("json", "msgpack")
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
MISSING = object()
"""What :func:`field_value` gives for a path the document does not have."""


def _no_constants(name: str) -> Any:
    # NaN/Infinity are not JSON; refusing them keeps json and orjson in agreement.
    raise ValueError(f"{name} is not valid JSON")


def _json_loads(raw: bytes) -> Any:
    if _orjson is not None:
        try:
            return _orjson.loads(raw)
        except _orjson.JSONDecodeError:
            pass  # orjson is stricter (ints > 64 bit, surrogates); json decides
    try:
        return json.loads(raw, parse_constant=_no_constants)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise BadDocument(f"not a valid JSON document ({e})") from None


def _msgpack_loads(raw: bytes) -> Any:
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as e:  # noqa: BLE001 - msgpack raises several unrelated types for bad input; re-raised
        raise BadDocument(f"not a valid msgpack document ({type(e).__name__}: {e})") from None


def document_decoder(codec: str) -> Callable[[bytes], Any]:
    if codec == "json":
        return _json_loads
    if codec == "msgpack":
        return _msgpack_loads
    raise IndexDefinitionError(f"unknown document codec {codec!r}; use one of {CODECS}")


@dataclass(frozen=True)
class IndexDefinition:
    """One secondary index.

    ``field``: a dotted path (``"address.city"``; a numeric segment indexes a list) or
    a tuple of segments when a name holds a dot. ``on_bad``: what a value that is not
    a document, lacks the field, or has a type the index does not take does:
    ``"skip"`` (not indexed, counted) or ``"refuse"`` (``apply`` raises
    :class:`BadValueError` and changes nothing). ``type``: ``None`` takes any scalar
    (null, bool, number, string, bytes); otherwise one of int, number, str, bool, bytes.
    """

    name: str
    field: str | tuple[str, ...]
    unique: bool = False
    on_bad: str = "skip"
    type: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise IndexDefinitionError(f"index name {self.name!r}: use 1-64 of A-Z a-z 0-9 _ . -")
        # Normalised to a tuple so that a definition equals its stored copy.
        if isinstance(self.field, str):
            object.__setattr__(self, "field", tuple(self.field.split(".")))
        elif isinstance(self.field, list):
            object.__setattr__(self, "field", tuple(self.field))
        if not self.path or any(not isinstance(s, str) or not s for s in self.path):
            raise IndexDefinitionError(f"index {self.name!r}: field path {self.field!r} is empty")
        if self.on_bad not in ON_BAD:
            raise IndexDefinitionError(f"index {self.name!r}: on_bad must be one of {ON_BAD}")
        if self.type not in TYPES:
            raise IndexDefinitionError(f"index {self.name!r}: type must be one of {TYPES}")

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.field)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "field": list(self.path), "unique": self.unique,
                "on_bad": self.on_bad, "type": self.type}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> IndexDefinition:
        try:
            return cls(d["name"], d["field"], bool(d.get("unique", False)),
                       d.get("on_bad", "skip"), d.get("type"))
        except (KeyError, TypeError) as e:
            raise IndexDefinitionError(f"index definition {d!r} is malformed: {e}") from None

    @classmethod
    def parse(cls, spec: str) -> IndexDefinition:
        """``name=field.path[:unique][:refuse][:type=T]`` (the CLI's --def)."""
        name, eq, rest = spec.partition("=")
        if not eq:
            raise IndexDefinitionError(f"--def {spec!r}: expected name=field.path[:options]")
        field, *opts = rest.split(":")
        kw: dict[str, Any] = {}
        for o in opts:
            if o == "unique":
                kw["unique"] = True
            elif o in ON_BAD:
                kw["on_bad"] = o
            elif o.startswith("type="):
                kw["type"] = o[5:]
            else:
                raise IndexDefinitionError(f"--def {spec!r}: unknown option {o!r} "
                                           "(unique, skip, refuse, type=T)")
        return cls(name.strip(), field.strip(), **kw)


class Entry(NamedTuple):
    index: IndexDefinition  # type: ignore[assignment]  # the field shadows tuple.index
    key: bytes        # LMDB key
    data: bytes       # LMDB data (empty unless the key holds a hash)
    head: int         # len(index id + encoded value): key[:head] is the lookup prefix
    value: object


class Bad(NamedTuple):
    index: IndexDefinition  # type: ignore[assignment]  # the field shadows tuple.index
    reason: str


def type_ok(want: str | None, v: object) -> bool:
    t = type(v)
    if want is None:
        return True
    if want == "int":
        return t is int
    if want == "number":
        return t is int or t is float
    if want == "str":
        return t is str
    if want == "bool":
        return t is bool
    return t is bytes


def field_value(doc: Any, path: tuple[str, ...]) -> object:
    """The value at ``path`` in ``doc``, or the :data:`MISSING` sentinel."""
    v = doc
    for seg in path:
        if type(v) is dict:
            v = v.get(seg, MISSING)
        elif type(v) is list and seg.isdigit() and int(seg) < len(v):
            v = v[int(seg)]
        else:
            return MISSING
        if v is MISSING:
            return v
    return v
