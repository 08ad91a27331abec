"""The node's RPC methods, typed: one frozen request dataclass per method, the decoder
of its reply, and ONE table (:data:`METHODS`) of who may call what.

Every request class names its method (``METHOD``), gives the arguments of a REQUEST
frame (``to_wire()``: exactly the map node/wire.py sends, docs/node.md "Client
protocol") and reads them back (``from_wire(args)``), refusing an unknown argument, a
missing one, or one of the wrong type or range with :class:`~node.errors.BadRequest`
(``bad arguments for put: key must be bytes or str, not int``). What depends on the
node (does the cache exist, is the key within ``limits.max_key_bytes``) is checked by
the node's dispatch and handlers.

Replies that are maps are dataclasses too (:class:`PingReply`, :class:`Demanded`, ...);
the others are plain values of a precise type. A reply that does not decode raises
:class:`~node.errors.BadReply` naming the peer and the method: a forged or garbage
reply never reaches the caller as a half-read map.

:data:`METHODS` maps each method name to its request class, its reply decoder, the
roles that may call it (``client``, ``node``, ``validator``) and, for a node-only
method, the argument naming the calling node (checked against the caller's TLS
certificate by node/rpc.py). ``CLIENT_METHODS``, ``VALIDATOR_METHODS`` and
``NODE_CLAIMS`` (node/node.py) derive from it.

The ``validator`` role is a live validator's TLS certificate (``ferry://validator/NAME``,
``ferry validate --cluster``): ``ping``, ``get_map``, ``validate_fence`` and
``validate_unfence`` only. It writes nothing and calls no other node-only method (no
replicate, register, handoff, demand, unfence ...). With the shared secret a validator
authenticates as a node.

A caller sends a request with :meth:`Requester.request` (``Pool.request(address,
Put(...))``), which returns the decoded reply; ``Pool.call(address, name, **args)``
stays the untyped boundary for code that builds requests by name.
"""
from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable, ClassVar, Generic, Literal, Optional, Self, TypeVar, cast

from .acklatency import LatencyReport
from .cluster_map import ClusterMap
from .dedup import RequestId
from .errors import BadReply, BadRequest, NodeError
from .jsonvalue import JsonDoc, WireDoc

R = TypeVar("R")

CLIENT, NODE, VALIDATOR = "client", "node", "validator"
BOTH = frozenset({CLIENT, NODE})
NODES = frozenset({NODE})
READ_MAP = frozenset({CLIENT, NODE, VALIDATOR})    # the map and ping: every role
FENCERS = frozenset({NODE, VALIDATOR})             # a live validation's fence

MAX_PARTITION = 2**31 - 1
MAX_INT = 2**63 - 1
MAX_NAME = 1024             # characters of a cache, node, index, session name or address
MAX_BATCH = 1024            # items of one put_batch request (it must also fit one 1 MiB frame)
LINEARIZABLE, STALE = "linearizable", "stale"     # the read consistencies of ``get``
REPLICATE_ANSWERS = ("applied", "buffered", "resync", "absent")
ReplicateAnswer = Literal["applied", "buffered", "resync", "absent"]
JoinAnswer = Literal["ok", "resync"]
Update = tuple[bytes, "bytes | None", int]        # key, value (None: remove), counter
Row = tuple[object, bytes]                        # an index value and its key


class Invalid(ValueError):
    """One field that does not decode: the message says what it must be."""


# -- field checks: each returns the decoded value or raises Invalid ------------------------
Check = Callable[[object], Any]


def _kind(v: object) -> str:
    return type(v).__name__


def _int(lo: int = 0, hi: int = MAX_INT) -> Check:
    def check(v: object) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise Invalid(f"must be an integer {lo}..{hi}, not {v!r}"[:200])
        return v
    return check


def _number(v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise Invalid(f"must be a number >= 0, not {v!r}"[:200])
    return float(v)


def _bool(v: object) -> bool:
    if not isinstance(v, bool):
        raise Invalid(f"must be true or false, not {_kind(v)}")
    return v


def _name(v: object) -> str:
    if not isinstance(v, str) or not 0 < len(v) <= MAX_NAME:
        raise Invalid(f"must be a string of 1..{MAX_NAME} characters, not {_kind(v)}"
                      if not isinstance(v, str) else f"must be 1..{MAX_NAME} characters, not {len(v)}")
    return v


def _text(v: object) -> str:
    if not isinstance(v, str):
        raise Invalid(f"must be a string, not {_kind(v)}")
    return v


def _data(v: object) -> bytes:
    """bytes, or str (encoded as UTF-8): keys and values."""
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8")
    raise Invalid(f"must be bytes or str, not {_kind(v)}")


def _optional(check: Check) -> Check:
    def opt(v: object) -> object:
        return None if v is None else check(v)
    return opt


def _any(v: object) -> object:
    """An index value: whatever msgpack decodes; the index refuses what it cannot hold."""
    return v


def _choice(*allowed: str) -> Check:
    def check(v: object) -> str:
        if v not in allowed:
            raise Invalid(f"must be one of {', '.join(repr(a) for a in allowed)}, not {v!r}"[:200])
        return cast(str, v)
    return check


def _list(v: object, lo: int = 0, hi: int = MAX_INT) -> list[object] | tuple[object, ...]:
    if not isinstance(v, (list, tuple)) or not lo <= len(v) <= hi:
        raise Invalid(f"must be a list of {lo}..{hi} items" + ("" if isinstance(v, (list, tuple))
                                                                 else f", not {_kind(v)}"))
    return v


def _names(v: object) -> tuple[str, ...]:
    out = []
    for i, x in enumerate(_list(v)):
        try:
            out.append(_name(x))
        except Invalid as e:
            raise Invalid(f"[{i}] {e}") from None
    return tuple(out)


def _rid(v: object) -> RequestId | None:
    try:
        return RequestId.parse(v)
    except BadRequest as e:
        raise Invalid(e.reason.removeprefix("rid ")) from None


def _items(v: object) -> tuple[tuple[bytes, bytes], ...]:
    if not isinstance(v, (list, tuple)) or not 0 < len(v) <= MAX_BATCH:
        raise Invalid(f"must be a list of 1..{MAX_BATCH} [key, value] pairs")
    out = []
    for i, it in enumerate(v):
        if not isinstance(it, (list, tuple)) or len(it) != 2:
            raise Invalid(f"[{i}] must be a [key, value] pair")
        try:
            out.append((_data(it[0]), _data(it[1])))
        except Invalid as e:
            raise Invalid(f"[{i}] {e}") from None
    return tuple(out)


def _updates(v: object) -> tuple[Update, ...]:
    out: list[Update] = []
    for i, u in enumerate(_list(v)):
        if not isinstance(u, (list, tuple)) or len(u) != 3:
            raise Invalid(f"[{i}] must be a [key, value, counter] triple")
        try:
            out.append((_data(u[0]), _optional(_data)(u[1]), _int()(u[2])))
        except Invalid as e:
            raise Invalid(f"[{i}] {e}") from None
    return tuple(out)


def _doc(v: object) -> JsonDoc:
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise Invalid(f"must be a map with string keys, not {_kind(v)}")
    return cast(JsonDoc, v)


def _docs(v: object) -> list[JsonDoc]:
    out = []
    for i, d in enumerate(_list(v)):
        try:
            out.append(_doc(d))
        except Invalid as e:
            raise Invalid(f"[{i}] {e}") from None
    return out


def _str_map(v: object) -> dict[str, str]:
    d = _doc(v)
    if not all(isinstance(x, str) for x in d.values()):
        raise Invalid("must map strings to strings")
    return cast(dict[str, str], d)


def arg(check: Check, default: object = MISSING, *, factory: Callable[[], object] | None = None) -> Any:
    """A request or reply field decoded by ``check`` (omitted on the wire: ``default``,
    or a new ``factory()``; neither: required)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"check": check})
    if default is MISSING:
        return field(metadata={"check": check})
    return field(default=default, metadata={"check": check})


def _plain(v: object) -> object:
    """A field's wire form: tuples as lists, a request id as its list."""
    if isinstance(v, RequestId):
        return v.wire()
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    return v


def _decode(cls: type, doc: object, *, strict: bool) -> dict[str, object]:
    """The decoded fields of ``doc`` for dataclass ``cls``; Invalid naming the field.
    ``strict``: an unknown key is refused (requests; a reply may carry more)."""
    if not isinstance(doc, dict):
        raise Invalid(f"must be a map, not {_kind(doc)}")
    fs = fields(cls)
    if strict:
        unknown = [k for k in doc if k not in {f.name for f in fs}]
        if unknown:
            takes = ", ".join(f.name for f in fs) or "none"
            raise Invalid(f"unknown argument {str(unknown[0])[:64]!r} (it takes: {takes})")
    out: dict[str, object] = {}
    for f in fs:
        if f.name in doc:
            try:
                out[f.name] = f.metadata["check"](doc[f.name])
            except Invalid as e:
                raise Invalid(f"{f.name}{'' if str(e).startswith('[') else ' '}{e}") from None
        elif f.default is MISSING and f.default_factory is MISSING:
            raise Invalid(f"missing {'argument' if strict else 'field'} {f.name!r}")
    return out


# -- requests ------------------------------------------------------------------------------
class Req(Generic[R]):
    """A request of method ``METHOD`` whose reply decodes to ``R``."""
    __slots__ = ()
    METHOD: ClassVar[str]
    # arguments left out of the map while they hold their default (as callers send them)
    OMIT_DEFAULT: ClassVar[frozenset[str]] = frozenset()

    def to_wire(self) -> dict[str, object]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)  # type: ignore[arg-type]
                if not (f.name in self.OMIT_DEFAULT and getattr(self, f.name) == f.default)}

    def kwargs(self) -> dict[str, object]:
        """The decoded arguments by name: what the method's handler is called with."""
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_wire(cls, args: object) -> Self:
        try:
            return cls(**_decode(cls, args, strict=True))
        except Invalid as e:
            raise BadRequest(f"bad arguments for {cls.METHOD}: {e}") from None

    def reply(self, raw: object, peer: str = "the peer") -> R:
        """The decoded reply to this request, or BadReply."""
        try:
            return cast(R, METHODS[self.METHOD].reply(raw))
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise BadReply(f"{peer} answered {self.METHOD} with a malformed reply: {e}"[:400]) from None


class Reply:
    """A reply that is a map: decoded field by field, extra fields ignored."""
    __slots__ = ()

    def to_wire(self) -> dict[str, object]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_wire(cls, doc: object) -> Self:
        return cls(**_decode(cls, doc, strict=False))


@dataclass(frozen=True, slots=True)
class PingReply(Reply):
    id: str = arg(_text)
    boot: str = arg(_text, "")
    epoch: int = arg(_int(), 0)
    page_size: int | None = arg(_optional(_int(1)), None)
    controller: str | None = arg(_optional(_text), None)
    lease_valid: bool = arg(_bool, False)
    settings: JsonDoc = arg(_doc, factory=dict)


@dataclass(frozen=True, slots=True)
class MapPage(Reply):
    """One page of the map (``ClusterMap.to_wire``): the top-level fields are checked
    here, the rest where :func:`fetch_map` reads it."""
    doc: WireDoc

    def to_wire(self) -> dict[str, object]:
        return self.doc

    @classmethod
    def from_wire(cls, doc: object) -> Self:
        d = _doc(doc)
        for k in ("version", "epoch"):
            _int()(d.get(k))
        for k in ("caches", "members"):
            _list(d.get(k))
        return cls(d)


@dataclass(frozen=True, slots=True)
class Registered(Reply):
    counter: int = arg(_int())


@dataclass(frozen=True, slots=True)
class Demanded(Reply):
    session: str = arg(_name)
    counter: int = arg(_int())
    count: int = arg(_int())
    bytes: int = arg(_int())


def _entries(v: object) -> tuple[Update, ...]:
    return _updates(v)


@dataclass(frozen=True, slots=True)
class Fetched(Reply):
    entries: tuple[Update, ...] = arg(_entries)
    next: int = arg(_int())
    done: bool = arg(_bool)


@dataclass(frozen=True, slots=True)
class IndexPage(Reply):
    """One page of a partition's shipped index (``index_page``): the header (the
    fields of ``indexes.ShipHeader``, checked where it is read) and the page's bytes."""
    header: JsonDoc = arg(_doc)
    data: bytes = arg(_data)


@dataclass(frozen=True, slots=True)
class Holds(Reply):
    node: str = arg(_text)
    state: str | None = arg(_optional(_text))
    counter: int = arg(_int())


@dataclass(frozen=True, slots=True)
class Fence(Reply):
    token: str = arg(_name)
    counter: int = arg(_int())
    term: int = arg(_int())
    epoch: int = arg(_int())
    lease_s: float = arg(_number)
    isr: tuple[str, ...] = arg(_names)
    transfer: dict[str, str] = arg(_str_map)


def _latency(v: object) -> LatencyReport:
    return LatencyReport.from_wire(v)


# -- reply decoders of plain values -------------------------------------------------------------
def _reply_int(v: object) -> int:
    return cast(int, _int()(v))


def _reply_bool(v: object) -> bool:
    return _bool(v)


def _reply_text(v: object) -> str:
    return _text(v)


def _reply_value(v: object) -> bytes | None:
    if v is not None and not isinstance(v, bytes):
        raise Invalid(f"must be bytes or null, not {_kind(v)}")
    return v


def _reply_keys(v: object) -> list[bytes]:
    out = _list(v)
    if not all(isinstance(k, bytes) for k in out):
        raise Invalid("must be a list of keys (bytes)")
    return cast(list[bytes], list(out))


def _reply_rows(v: object) -> list[Row]:
    out: list[Row] = []
    for i, r in enumerate(_list(v)):
        if not isinstance(r, (list, tuple)) or len(r) != 2 or not isinstance(r[1], bytes):
            raise Invalid(f"[{i}] must be a [value, key] pair")
        out.append((r[0], r[1]))
    return out


def _reply_counters(v: object) -> tuple[int, int]:
    got = _list(v, 2, 2)
    return _reply_int(got[0]), _reply_int(got[1])


def _reply_replicate(v: object) -> ReplicateAnswer:
    return cast(ReplicateAnswer, _choice(*REPLICATE_ANSWERS)(v))


def _reply_join(v: object) -> JoinAnswer:
    return cast(JoinAnswer, _choice("ok", "resync")(v))


# -- the requests, by method -----------------------------------------------------------------
_cache = _name
_part = _int(0, MAX_PARTITION)
_count = _int()
_epoch = _optional(_int())


@dataclass(frozen=True, slots=True)
class Ping(Req[PingReply]):
    METHOD: ClassVar[str] = "ping"


@dataclass(frozen=True, slots=True)
class GetMap(Req[MapPage]):
    METHOD: ClassVar[str] = "get_map"
    start: int = arg(_count, 0)
    count: int | None = arg(_optional(_count), None)


@dataclass(frozen=True, slots=True)
class Put(Req[int]):
    METHOD: ClassVar[str] = "put"
    cache: str = arg(_cache)
    key: bytes = arg(_data)
    value: bytes = arg(_data)
    rid: RequestId | None = arg(_rid, None)


@dataclass(frozen=True, slots=True)
class PutBatch(Req[tuple[int, int]]):
    METHOD: ClassVar[str] = "put_batch"
    cache: str = arg(_cache)
    key: bytes = arg(_data)
    items: tuple[tuple[bytes, bytes], ...] = arg(_items)
    rid: RequestId | None = arg(_rid, None)


@dataclass(frozen=True, slots=True)
class Get(Req[Optional[bytes]]):
    METHOD: ClassVar[str] = "get"
    OMIT_DEFAULT: ClassVar[frozenset[str]] = frozenset({"consistency"})
    cache: str = arg(_cache)
    key: bytes = arg(_data)
    consistency: str = arg(_choice(LINEARIZABLE, STALE), LINEARIZABLE)


@dataclass(frozen=True, slots=True)
class Remove(Req[int]):
    METHOD: ClassVar[str] = "remove"
    cache: str = arg(_cache)
    key: bytes = arg(_data)
    rid: RequestId | None = arg(_rid, None)


@dataclass(frozen=True, slots=True)
class Lookup(Req[list[bytes]]):
    METHOD: ClassVar[str] = "lookup"
    cache: str = arg(_cache)
    index: str = arg(_name)
    value: object = arg(_any)


@dataclass(frozen=True, slots=True)
class Range(Req[list[Row]]):
    METHOD: ClassVar[str] = "range"
    cache: str = arg(_cache)
    index: str = arg(_name)
    lo: object = arg(_any)
    hi: object = arg(_any)
    limit: int | None = arg(_optional(_count), None)


@dataclass(frozen=True, slots=True)
class Moves(Req[list[JsonDoc]]):
    METHOD: ClassVar[str] = "moves"


MOVES_PAGE = 500           # finished moves per moves_done reply (about 300 KB)


@dataclass(frozen=True, slots=True)
class MovesDone(Req[list[JsonDoc]]):
    METHOD: ClassVar[str] = "moves_done"
    start: int = arg(_count, 0)
    count: int = arg(_count, MOVES_PAGE)


@dataclass(frozen=True, slots=True)
class AdmissionStatus(Req[JsonDoc]):
    METHOD: ClassVar[str] = "admission"


@dataclass(frozen=True, slots=True)
class Metrics(Req[str]):
    METHOD: ClassVar[str] = "metrics"


@dataclass(frozen=True, slots=True)
class Leave(Req[bool]):
    METHOD: ClassVar[str] = "leave"
    OMIT_DEFAULT: ClassVar[frozenset[str]] = frozenset({"node"})
    node: str | None = arg(_optional(_name), None)


@dataclass(frozen=True, slots=True)
class Replicate(Req[ReplicateAnswer]):
    METHOD: ClassVar[str] = "replicate"
    OMIT_DEFAULT: ClassVar[frozenset[str]] = frozenset({"rid"})
    cache: str = arg(_cache)
    p: int = arg(_part)
    key: bytes = arg(_data)
    value: bytes | None = arg(_optional(_data))
    counter: int = arg(_count)
    prev: int = arg(_count)
    primary: str = arg(_name)
    epoch: int | None = arg(_epoch, None)
    rid: RequestId | None = arg(_rid, None)


@dataclass(frozen=True, slots=True)
class ReplicateBatch(Req[ReplicateAnswer]):
    METHOD: ClassVar[str] = "replicate_batch"
    OMIT_DEFAULT: ClassVar[frozenset[str]] = frozenset({"rid"})
    cache: str = arg(_cache)
    p: int = arg(_part)
    updates: tuple[Update, ...] = arg(_updates)
    prev: int = arg(_count)
    primary: str = arg(_name)
    epoch: int | None = arg(_epoch, None)
    rid: RequestId | None = arg(_rid, None)


@dataclass(frozen=True, slots=True)
class JoinIsr(Req[JoinAnswer]):
    METHOD: ClassVar[str] = "join_isr"
    cache: str = arg(_cache)
    p: int = arg(_part)
    node: str = arg(_name)


@dataclass(frozen=True, slots=True)
class Demand(Req[Demanded]):
    METHOD: ClassVar[str] = "demand"
    cache: str = arg(_cache)
    p: int = arg(_part)
    node: str = arg(_name)
    address: str = arg(_name)
    epoch: int | None = arg(_epoch, None)


@dataclass(frozen=True, slots=True)
class Fetch(Req[Fetched]):
    """``max_bytes`` None: the supplier's default (node.move.FETCH_BYTES)."""
    METHOD: ClassVar[str] = "fetch"
    OMIT_DEFAULT: ClassVar[frozenset[str]] = frozenset({"max_bytes"})
    session: str = arg(_name)
    offset: int = arg(_count)
    max_bytes: int | None = arg(_optional(_int(1)), None)


@dataclass(frozen=True, slots=True)
class DemandDone(Req[bool]):
    METHOD: ClassVar[str] = "demand_done"
    session: str = arg(_name)


@dataclass(frozen=True, slots=True)
class IndexWant(Req[bool]):
    """A demander about to fetch p's file from this node asks for p's index entries at
    the file snapshot's counter (``[rebalance] index_transfer``); with ``below`` > 0
    only if p's file holds fewer bytes per live entry than that here (``auto``). The
    reply says whether the entries will be exported."""
    METHOD: ClassVar[str] = "index_want"
    OMIT_DEFAULT: ClassVar[frozenset[str]] = frozenset({"below"})
    cache: str = arg(_cache)
    p: int = arg(_part)
    node: str = arg(_name)
    below: int = arg(_count, 0)


@dataclass(frozen=True, slots=True)
class IndexPageQuery(Req[IndexPage]):
    METHOD: ClassVar[str] = "index_page"
    cache: str = arg(_cache)
    p: int = arg(_part)
    counter: int = arg(_int())
    page: int = arg(_count)


@dataclass(frozen=True, slots=True)
class Register(Req[Registered]):
    METHOD: ClassVar[str] = "register"
    cache: str = arg(_cache)
    p: int = arg(_part)
    node: str = arg(_name)
    address: str = arg(_name)
    epoch: int | None = arg(_epoch, None)


@dataclass(frozen=True, slots=True)
class Handoff(Req[int]):
    METHOD: ClassVar[str] = "handoff"
    cache: str = arg(_cache)
    p: int = arg(_part)
    to: str = arg(_name)


@dataclass(frozen=True, slots=True)
class Unfence(Req[bool]):
    METHOD: ClassVar[str] = "unfence"
    cache: str = arg(_cache)
    p: int = arg(_part)


@dataclass(frozen=True, slots=True)
class AckLatency(Req[LatencyReport]):
    METHOD: ClassVar[str] = "ack_latency"


@dataclass(frozen=True, slots=True)
class HoldsQuery(Req[Holds]):
    METHOD: ClassVar[str] = "holds"
    cache: str = arg(_cache)
    p: int = arg(_part)


@dataclass(frozen=True, slots=True)
class ValidateFence(Req[Fence]):
    METHOD: ClassVar[str] = "validate_fence"
    cache: str = arg(_cache)
    p: int = arg(_part)
    term: int = arg(_count)


@dataclass(frozen=True, slots=True)
class ValidateUnfence(Req[bool]):
    METHOD: ClassVar[str] = "validate_unfence"
    cache: str = arg(_cache)
    p: int = arg(_part)
    token: str = arg(_name)


@dataclass(frozen=True, slots=True)
class DebugSet(Req[int]):
    METHOD: ClassVar[str] = "debug_set"
    cache: str = arg(_cache)
    p: int = arg(_part)
    key: bytes = arg(_data)
    value: bytes | None = arg(_optional(_data))


# -- the table ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Method(Generic[R]):
    """One RPC method: its request class, its reply decoder, who may call it and (for a
    node-only method) the argument naming the calling node."""
    request: type[Req[R]]
    reply: Callable[[object], R]
    roles: frozenset[str]
    claim: str | None = None

    @property
    def name(self) -> str:
        return self.request.METHOD


def _table(*methods: Method[Any]) -> dict[str, Method[Any]]:
    out: dict[str, Method[Any]] = {}
    for m in methods:
        assert m.name not in out, m.name
        assert m.claim is None or m.claim in {f.name for f in fields(m.request)}, m   # type: ignore[arg-type]
        out[m.name] = m
    return out


METHODS: dict[str, Method[Any]] = _table(
    # client methods (a node may call them too)
    Method(Ping, PingReply.from_wire, READ_MAP),
    Method(GetMap, MapPage.from_wire, READ_MAP),
    Method(Put, _reply_int, BOTH),
    Method(PutBatch, _reply_counters, BOTH),
    Method(Get, _reply_value, BOTH),
    Method(Remove, _reply_int, BOTH),
    Method(Lookup, _reply_keys, BOTH),
    Method(Range, _reply_rows, BOTH),
    Method(Moves, _docs, BOTH),
    Method(MovesDone, _docs, BOTH),
    Method(AdmissionStatus, _doc, BOTH),
    Method(Metrics, _reply_text, BOTH),
    Method(Leave, _reply_bool, BOTH),
    # node-only methods (the validation fence: a live validator's too)
    Method(Replicate, _reply_replicate, NODES, claim="primary"),
    Method(ReplicateBatch, _reply_replicate, NODES, claim="primary"),
    Method(JoinIsr, _reply_join, NODES, claim="node"),
    Method(Demand, Demanded.from_wire, NODES, claim="node"),
    Method(Fetch, Fetched.from_wire, NODES),
    Method(DemandDone, _reply_bool, NODES),
    Method(Register, Registered.from_wire, NODES, claim="node"),
    Method(IndexWant, _reply_bool, NODES, claim="node"),
    Method(IndexPageQuery, IndexPage.from_wire, NODES),
    Method(Handoff, _reply_int, NODES, claim="to"),
    Method(Unfence, _reply_bool, NODES),
    Method(AckLatency, _latency, NODES),
    Method(HoldsQuery, Holds.from_wire, NODES),
    Method(ValidateFence, Fence.from_wire, FENCERS),
    Method(ValidateUnfence, _reply_bool, FENCERS),
    Method(DebugSet, _reply_int, NODES),
)

CLIENT_METHODS = frozenset(name for name, m in METHODS.items() if CLIENT in m.roles)
VALIDATOR_METHODS = frozenset(name for name, m in METHODS.items() if VALIDATOR in m.roles)
NODE_CLAIMS = {name: m.claim for name, m in METHODS.items() if m.claim is not None}


def decode_request(method: str, args: object, role: str) -> Req[Any]:
    """The typed request of a REQUEST frame, or BadRequest: an unknown method, a
    method the caller's role may not call (a node-only method asked by a client, any
    but the validator's methods asked by a validator), or arguments that do not decode."""
    m = METHODS.get(method)
    if m is None:
        raise BadRequest(f"unknown method {method[:64]!r}")
    if role not in m.roles:
        raise BadRequest(_not_for(method, m, role))
    return m.request.from_wire(args)


def _not_for(method: str, m: Method[Any], role: str) -> str:
    if CLIENT not in m.roles:
        extra = " (and live validators)" if VALIDATOR in m.roles else ""
        return f"method {method!r} is for nodes only{extra}"
    return (f"method {method!r} is not for a {role} certificate: a live validator may call "
            f"{', '.join(sorted(VALIDATOR_METHODS))} only")


def encode_reply(result: object) -> object:
    """A handler's result as it goes into the REPLY frame."""
    if isinstance(result, (Reply, LatencyReport)):
        return result.to_wire()
    if isinstance(result, tuple):
        return _plain(result)
    return result


# -- calling ------------------------------------------------------------------------------------
class Requester:
    """Typed requests over an untyped ``call(address, method, timeout=, **args)``
    (node.wire.Pool, or a test's stand-in for the other nodes)."""
    __slots__ = ()

    def call(self, address: str, method: str, /, timeout: float | None = None, **args: Any) -> Any:
        raise NotImplementedError

    def request(self, address: str, req: Req[R], timeout: float | None = None) -> R:
        """Send ``req`` to the node at ``address``; its decoded reply (BadReply when the
        reply does not decode, the peer's error as a NodeError)."""
        return req.reply(self.call(address, req.METHOD, timeout=timeout, **req.to_wire()), address)


def fetch_map(pool: Requester, address: str, timeout: float | None = 5.0) -> ClusterMap:
    """The whole map from the node at ``address``, page by page (``ClusterMap.fetch``);
    BadReply when a page does not read as a map."""
    def page(start: int = 0, count: int | None = None) -> WireDoc:
        return pool.request(address, GetMap(start, count), timeout=timeout).doc
    try:
        return ClusterMap.fetch(page)
    except NodeError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as e:
        raise BadReply(f"{address} answered get_map with a malformed map: {e!r}"[:400]) from None


def fetch_map_page(pool: Requester, address: str, start: int, count: int, *,
                   into: ClusterMap | None = None, min_epoch: int = 0,
                   timeout: float | None = 5.0) -> ClusterMap | None:
    """One page of the map at ``address`` (partitions ``start`` to ``start + count``
    in the page numbering, :meth:`ClusterMap.global_index`): a new map holding only
    that page's partitions, or, with ``into``, that page taken into ``into``
    (:meth:`ClusterMap.absorb`). None, and ``into`` unchanged, when the page is older
    than ``min_epoch`` or names no member (a node that has not joined yet). BadReply
    when the page does not read as a map or names other caches than ``into``;
    ``into`` is then unchanged too."""
    doc = pool.request(address, GetMap(start, count), timeout=timeout).doc
    try:
        if int(doc["epoch"]) < min_epoch or not doc["members"]:
            return None
        if into is None:
            return ClusterMap.from_wire(doc)
        into.absorb(doc)
        return into
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as e:
        raise BadReply(f"{address} answered get_map with a malformed map: {e!r}"[:400]) from None


__all__ = ["METHODS", "Method", "Req", "Reply", "Requester", "CLIENT_METHODS", "VALIDATOR_METHODS", "NODE_CLAIMS",
           "decode_request", "encode_reply", "fetch_map", "fetch_map_page", "Invalid",
           "Ping", "PingReply", "GetMap", "MapPage", "Put", "PutBatch", "Get", "Remove", "Lookup",
           "Range", "Row", "Moves", "MovesDone", "MOVES_PAGE", "AdmissionStatus", "Metrics", "Leave",
           "Replicate", "ReplicateBatch", "ReplicateAnswer", "JoinIsr", "JoinAnswer", "Update",
           "Demand", "Demanded", "Fetch", "Fetched", "DemandDone", "Register", "IndexWant",
           "IndexPageQuery", "IndexPage",
           "Registered", "Handoff", "Unfence", "AckLatency", "HoldsQuery", "Holds", "ValidateFence",
           "Fence", "ValidateUnfence", "DebugSet", "MAX_BATCH", "LINEARIZABLE", "STALE"]
