"""Every control-plane key a node reads, parsed and checked in one place.

etcd holds JSON under the cluster prefix ``P`` (docs/node.md, "Keys"). Each function
here takes one key and its :class:`~node.control.KV` and returns a typed record, or
raises :class:`Malformed` carrying the key, the key's mod revision and why. Checking
one value costs the size of that value: nothing here looks at other keys.

=================================  ===================================================
key                                parsed by
=================================  ===================================================
``P/meta``                         :func:`meta` -> :class:`Meta`
``P/members/<node>``               :func:`member` -> :class:`MemberDoc`
``P/reports/<node>/<cache>/<p>``   :func:`report_entry` -> :class:`ReportEntry`
``P/reports/<node>``               :func:`report_doc` (a whole report, older layout)
``P/parts/<cache>/<p>``            :func:`record` -> :class:`~node.cluster_map.PartRecord`
``P/pins/<cache>/<p>``             :func:`pin` -> owners, primary first
``P/controller``                   :func:`controller` -> :class:`ControllerDoc`
``P/requests/<cache>/<p>/<node>``  :func:`request` -> :class:`AlterIsr` | :class:`SetPrimary`
``P/settings/<name>``              :func:`setting` -> a scalar
=================================  ===================================================

What a node does with a malformed value is decided where it is read (docs/node.md,
"A malformed key"): a record is rewritten by the controller, a member, report, pin or
meta is absent, an election key is deleted so a new election runs, a request is
refused, a setting is ignored. :func:`log_malformed` logs each (key, revision) once, as
one line, rate-limited across keys.
"""
from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from .assignment import ranked
from .config import CacheConfig, IndexConfig
from .jsonvalue import Json, JsonDoc

if TYPE_CHECKING:
    from .control import KV

log = logging.getLogger("ferry.node.schema")

NODE_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")   # as node/config.py's ids
NAME = NODE_ID                                                # cache and index names
PARTITION = re.compile(r"^(0|[1-9][0-9]{0,4})$")             # decimal, no sign or padding
MAX_WHOLE = 2**63 - 1          # epochs, terms, counters: 64-bit in every consumer
MAX_COPIES = 64                # in-sync set, pin: backups + 1 is at most 9
MAX_TEXT = 512                 # an address, a boot id, a digest, a setting's text
MAX_PARTITIONS = 65536
MAX_BACKUPS = 8
MAX_CACHES = 1024
MAX_INDEXES = 256
# RETURNING: a copy this node held OWNING when its process started, not yet confirmed
# current (docs/node.md, "Returning copies"): never primary, supplier or in-sync on its word alone
REPORT_STATES = ("OWNING", "MOVING", "RENTING", "LOST", "RETURNING")
# a record whose predecessor no node's map held is rebuilt from the copies' reports;
# they are given this long to report their counters first (each node that holds the
# partition writes its report when it sees the record go bad)
REBUILD_GRACE_S = 1.0


class Malformed(ValueError):
    """A control-plane value that is not what its key must hold."""

    def __init__(self, key: str, revision: int | None, why: str) -> None:
        self.key, self.revision, self.why = key, revision, why[:300]
        self.action = ""        # what the reader did about it, for the log line
        super().__init__(f"{key} (revision {revision if revision else 'unknown'}): {self.why}")


# -- records --------------------------------------------------------------------------
@dataclass(frozen=True)
class Meta:
    caches: tuple[CacheConfig, ...]
    created_by: str | None
    initial_members: tuple[str, ...]
    secret_salt: str
    secret_check: str

    def caches_wire(self) -> list[JsonDoc]:
        return [c.to_wire() for c in sorted(self.caches, key=lambda c: c.name)]


@dataclass(frozen=True)
class MemberDoc:
    address: str
    transfer: str
    boot: str
    leaving: bool


@dataclass(frozen=True)
class ReportEntry:
    state: str
    counter: int


@dataclass(frozen=True)
class ControllerDoc:
    id: str
    boot: str


@dataclass(frozen=True)
class AlterIsr:
    term: int
    remove: tuple[str, ...]
    add: tuple[str, ...]


@dataclass(frozen=True)
class SetPrimary:
    previous: str | None


Request = Union[AlterIsr, SetPrimary]


@dataclass(frozen=True)
class BadRecord:
    """A partition record that is in etcd but malformed, as one node's map knows it:
    ``mod`` its revision, ``since`` when this node first saw it (monotonic clock),
    ``known``: the map still holds the valid record it replaced (seen event by event,
    so it is the last valid one etcd had)."""
    mod: int
    since: float
    known: bool


# -- field checks (each raises ValueError with the reason) ----------------------------
def _obj(v: Json, what: str) -> dict[str, Json]:
    if not isinstance(v, dict):
        raise ValueError(f"{what} must be a JSON object, not {_kind(v)}")
    return v


def _kind(v: object) -> str:
    if v is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(v), type(v).__name__)


def _show(v: object) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _whole(v: Json, what: str, lo: int = 0, hi: int = MAX_WHOLE) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{what} must be a whole number, not {_kind(v)} {_show(v)}")
    if not lo <= v <= hi:
        raise ValueError(f"{what} {_show(v)} is out of range {lo}..{hi}")
    return v


def _text(v: Json, what: str, limit: int = MAX_TEXT) -> str:
    if not isinstance(v, str):
        raise ValueError(f"{what} must be a string, not {_kind(v)} {_show(v)}")
    if len(v) > limit:
        raise ValueError(f"{what} is {len(v)} characters long; at most {limit}")
    return v


def _flag(v: Json, what: str) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"{what} must be true or false, not {_show(v)}")
    return v


def node_id(v: Json, what: str = "node id") -> str:
    if not isinstance(v, str) or not NODE_ID.match(v):
        raise ValueError(f"{what} {_show(v)} is not a node id (1-64 letters, digits, _ . -)")
    return v


def _nodes(v: Json, what: str, limit: int = MAX_COPIES) -> tuple[str, ...]:
    if not isinstance(v, list):
        raise ValueError(f"{what} must be a list of node ids, not {_kind(v)}")
    if len(v) > limit:
        raise ValueError(f"{what} names {len(v)} nodes; at most {limit}")
    out = tuple(node_id(n, f"{what} entry") for n in v)
    if len(set(out)) != len(out):
        raise ValueError(f"{what} names a node twice: {_show(list(out))}")
    return out


def partition_number(s: str, partitions: int | None = None) -> int:
    """A partition number as it appears in a key: decimal, no sign, no padding."""
    if not PARTITION.match(s):
        raise ValueError(f"partition {_show(s)} is not a partition number")
    p = int(s)
    if partitions is not None and p >= partitions:
        raise ValueError(f"partition {p} is out of range 0..{partitions - 1}")
    return p


def _value(key: str, kv: "KV") -> Json:
    if kv.bad:
        raise Malformed(key, kv.mod, kv.bad)
    return kv.value


# -- the key types --------------------------------------------------------------------
def meta(key: str, kv: "KV") -> Meta:
    """``P/meta``: the cluster's creation record."""
    v = _value(key, kv)
    try:
        d = _obj(v, "the cluster record")
        raw = d.get("caches")
        if not isinstance(raw, list) or not raw:
            raise ValueError(f"caches must be a non-empty list, not {_kind(raw)}")
        if len(raw) > MAX_CACHES:
            raise ValueError(f"caches lists {len(raw)} caches; at most {MAX_CACHES}")
        caches = tuple(_cache(c, i) for i, c in enumerate(raw))
        if len({c.name for c in caches}) != len(caches):
            raise ValueError("caches names a cache twice")
        created = d.get("created_by")
        created_by = None if created is None else node_id(created, "created_by")
        initial = d.get("initial_members", [])
        members = tuple(sorted(_nodes(initial, "initial_members", 10_000)))
        salt = _text(d.get("secret_salt", ""), "secret_salt", 128)
        check = _text(d.get("secret_check", ""), "secret_check", 128)
    except ValueError as e:
        raise Malformed(key, kv.mod, str(e)) from None
    return Meta(caches, created_by, members, salt, check)


def _cache(c: Json, i: int) -> CacheConfig:
    d = _obj(c, f"caches[{i}]")
    name = d.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise ValueError(f"caches[{i}].name {_show(name)} is not a cache name")
    parts = _whole(d.get("partitions"), f"caches[{i}].partitions", 1, MAX_PARTITIONS)
    backups = _whole(d.get("backups"), f"caches[{i}].backups", 0, MAX_BACKUPS)
    raw = d.get("indexes", [])
    if not isinstance(raw, list) or len(raw) > MAX_INDEXES:
        raise ValueError(f"caches[{i}].indexes must be a list of at most {MAX_INDEXES} indexes")
    idx = []
    for j, x in enumerate(raw):
        ix = _obj(x, f"caches[{i}].indexes[{j}]")
        iname = ix.get("name")
        if not isinstance(iname, str) or not NAME.match(iname):
            raise ValueError(f"caches[{i}].indexes[{j}].name {_show(iname)} is not an index name")
        field = _text(ix.get("field"), f"caches[{i}].indexes[{j}].field", 256)
        idx.append(IndexConfig(iname, field, _flag(ix.get("unique", False), f"caches[{i}].indexes[{j}].unique")))
    return CacheConfig(name, parts, backups, tuple(idx))


def member(key: str, kv: "KV") -> MemberDoc:
    """``P/members/<node>``: a live member's addresses."""
    v = _value(key, kv)
    try:
        d = _obj(v, "a member")
        address = _text(d.get("address"), "address")
        if not address:
            raise ValueError("address is empty")
        out = MemberDoc(address, _text(d.get("transfer", ""), "transfer"), _text(d.get("boot", ""), "boot"),
                        _flag(d.get("leaving", False), "leaving"))
    except ValueError as e:
        raise Malformed(key, kv.mod, str(e)) from None
    return out


def _entry(v: Json, what: str = "a report") -> ReportEntry:
    if not isinstance(v, list) or len(v) != 2:
        raise ValueError(f"{what} must be [state, counter], not {_kind(v)} {_show(v)}")
    st = v[0]
    if st not in REPORT_STATES:
        raise ValueError(f"{what}'s state {_show(st)} is not one of {', '.join(REPORT_STATES)}")
    return ReportEntry(str(st), _whole(v[1], f"{what}'s counter"))


def report_entry(key: str, kv: "KV") -> ReportEntry:
    """``P/reports/<node>/<cache>/<p>``: ``[state, counter]``."""
    v = _value(key, kv)
    try:
        return _entry(v)
    except ValueError as e:
        raise Malformed(key, kv.mod, str(e)) from None


def report_doc(key: str, kv: "KV", partitions: dict[str, int]) -> dict[tuple[str, int], ReportEntry]:
    """``P/reports/<node>`` = ``{"caches": {cache: {p: [state, counter]}}}``: every entry
    of a cache in ``partitions`` (cache -> partition count); other caches are skipped."""
    v = _value(key, kv)
    out: dict[tuple[str, int], ReportEntry] = {}
    try:
        d = _obj(v, "a report")
        caches = d.get("caches", {})
        if not isinstance(caches, dict):
            raise ValueError(f"caches must be an object, not {_kind(caches)}")
        for cache, ps in caches.items():
            if cache not in partitions:
                continue
            if not isinstance(ps, dict):
                raise ValueError(f"cache {_show(cache)}: partitions must be an object, not {_kind(ps)}")
            for p_s, st in ps.items():
                p = partition_number(p_s, partitions[cache])
                out[(cache, p)] = _entry(st, f"{cache}/{p}")
    except ValueError as e:
        raise Malformed(key, kv.mod, str(e)) from None
    return out


def record_fields(v: Json) -> tuple[str | None, tuple[str, ...], int, bool, int,
                                     tuple[tuple[str, str], ...]]:
    """(primary, in-sync copies, epoch, lost, term, confirmed) of a partition record's
    JSON, or ValueError saying what is wrong. The primary, when there is one, is in
    sync. ``confirmed``: (node, boot) of returning copies the controller elected."""
    d = _obj(v, "a partition record")
    prim = d.get("primary")
    if prim is not None:
        node_id(prim, "primary")
    isr = _nodes(d.get("isr", []), "isr")
    epoch = _whole(d.get("epoch", 0), "epoch")
    term = _whole(d.get("term", 0), "term")
    lost = _flag(d.get("lost", False), "lost")
    if prim is not None and prim not in isr:
        raise ValueError(f"primary {prim} is not in the in-sync set {list(isr)}")
    if term > epoch:
        raise ValueError(f"term {term} is past epoch {epoch} (every change of primary bumps both)")
    conf = d.get("confirmed", {})
    if not isinstance(conf, dict) or len(conf) > len(isr) or \
            not all(n in isr and isinstance(b, str) and len(b) <= 64 for n, b in conf.items()):
        raise ValueError("confirmed must map in-sync copies to their boot ids")
    return prim, isr, epoch, lost, term, tuple(sorted((n, str(b)) for n, b in conf.items()))


@dataclass
class PartRecord:
    """What the controller decided for one partition (``P/parts/<cache>/<p>``)."""
    primary: str | None = None
    isr: tuple[str, ...] = ()      # in-sync copies: every acknowledged write is on each
    epoch: int = 0                 # bumped by every change of primary or in-sync set
    lost: bool = False             # every in-sync copy is gone: reported, never served stale
    # the primary's term (Kafka's leader epoch): bumped only when the primary changes.
    # Copies fence on it, so a change of the in-sync set alone deposes nobody.
    term: int = 0
    # returning copies (docs/node.md, "Returning copies") the controller elected when every in-sync
    # copy had come back unconfirmed: (node, boot of the process it confirmed)
    confirmed: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> JsonDoc:
        d: JsonDoc = {"primary": self.primary, "isr": list(self.isr), "epoch": self.epoch,
                      "lost": self.lost, "term": self.term}
        if self.confirmed:
            d["confirmed"] = dict(self.confirmed)
        return d

    @classmethod
    def from_json(cls, d: Json) -> "PartRecord":
        """Lenient: anything that is not a valid record reads as no record."""
        try:
            return cls.parse(d)
        except ValueError:
            return cls()

    @classmethod
    def parse(cls, d: Json) -> "PartRecord":
        """Strict: a record as the controller writes it, else ValueError saying why
        (the checks are node/schema.py's)."""
        return cls(*record_fields(d))


def record(key: str, kv: "KV") -> "PartRecord":
    """``P/parts/<cache>/<p>``: the controller's record of one partition."""
    v = _value(key, kv)
    try:
        return PartRecord(*record_fields(v))
    except ValueError as e:
        raise Malformed(key, kv.mod, str(e)) from None


def pin(key: str, kv: "KV") -> tuple[str, ...]:
    """``P/pins/<cache>/<p>``: a plan's owners, primary first."""
    v = _value(key, kv)
    try:
        owners = _nodes(v, "a pin")
        if not owners:
            raise ValueError("a pin names no node")
        return owners
    except ValueError as e:
        raise Malformed(key, kv.mod, str(e)) from None


def controller(key: str, kv: "KV") -> ControllerDoc:
    """``P/controller``: the election winner (``{id, boot}``, under its lease). Whether
    the node it names is a live member holding that lease is the reader's check."""
    v = _value(key, kv)
    try:
        d = _obj(v, "the election key")
        return ControllerDoc(node_id(d.get("id"), "id"), _text(d.get("boot", ""), "boot"))
    except ValueError as e:
        raise Malformed(key, kv.mod, str(e)) from None


def request(key: str, kv: "KV") -> Request:
    """``P/requests/<cache>/<p>/<node>``: ``{"op": "alter_isr", "term", "remove",
    "add"}`` or ``{"op": "set_primary", "previous"}``."""
    v = _value(key, kv)
    try:
        d = _obj(v, "a request")
        op = d.get("op")
        if op == "alter_isr":
            return AlterIsr(_whole(d.get("term"), "term"), _nodes(d.get("remove", []), "remove"),
                            _nodes(d.get("add", []), "add"))
        if op == "set_primary":
            prev = d.get("previous")
            return SetPrimary(None if prev is None else node_id(prev, "previous"))
        raise ValueError(f"op {_show(op)} is not alter_isr or set_primary")
    except ValueError as e:
        raise Malformed(key, kv.mod, str(e)) from None


def request_at(prefix: str, rest: str, kv: "KV") -> tuple[str, int, str, Request]:
    """(cache, partition, node, request) of ``P/requests/<rest>``, ``rest`` being
    ``<cache>/<p>/<node>``; whether the cache and partition exist is the reader's check."""
    key = f"{prefix}/requests/{rest}"
    parts = rest.split("/")
    try:
        if len(parts) != 3:
            raise ValueError("a request key must be requests/<cache>/<partition>/<node>")
        cache, p, node = parts[0], partition_number(parts[1]), node_id(parts[2])
    except ValueError as e:
        raise Malformed(key, kv.mod, str(e)) from None
    return cache, p, node, request(key, kv)


def setting(key: str, kv: "KV") -> Json:
    """``P/settings/<name>``: a number, a boolean or a short string. Whether it suits
    the setting named is checked as the config file's value is (``config.apply_each``)."""
    v = _value(key, kv)
    if isinstance(v, bool) or (isinstance(v, (int, float)) and abs(v) <= 2**63):
        return v
    if isinstance(v, str) and len(v) <= MAX_TEXT:
        return v
    raise Malformed(key, kv.mod, f"a setting must be a number, a boolean or a string of at most "
                                 f"{MAX_TEXT} characters, not {_kind(v)} {_show(v)}")


# -- a malformed record, rebuilt --------------------------------------------------------
def rebuild_record(cache: str, p: int, bad: BadRecord, owning: dict[str, int],
                   now: float) -> tuple["PartRecord | None", bool]:
    """(the record to write, look again later) for a malformed record whose valid
    predecessor the controller's map does not hold (it started after the record went
    bad, or reloaded after a compaction). ``owning``: live members reporting OWNING for
    the partition -> their reported counter.

    The copies with the highest counter are the in-sync set, the first by rendezvous
    order the primary: no copy that reports fewer updates can lead. Epoch and term are
    the malformed value's revision: every earlier record was written at a lower
    revision, with an epoch and a term no higher than that revision, so no copy has
    seen a higher term and fences the new primary off. Nothing is written while no
    copy reports OWNING (nothing to lead), nor during the first REBUILD_GRACE_S after
    the bad value was seen, while the copies send fresh counters."""
    if not owning:
        return None, False
    if now - bad.since < REBUILD_GRACE_S:
        return None, True
    top = max(owning.values())
    isr = tuple(ranked(cache, p, [n for n, c in owning.items() if c == top]))
    rev = max(1, bad.mod)
    return PartRecord(isr[0], isr, rev, False, rev), False


# -- logging ------------------------------------------------------------------------------
LOG_PER_SECOND = 10          # malformed-key lines per second, at most, over all keys
_SEEN_MAX = 4096             # (key, revision) pairs remembered as logged


class _Once:
    """Logs each (key, revision) once; at most LOG_PER_SECOND lines a second in all,
    the lines left out counted in the next one."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: OrderedDict[tuple[str, int | None], None] = OrderedDict()
        self.window = 0.0
        self.lines = 0
        self.dropped = 0

    def __call__(self, err: Malformed, what: str, logger: logging.Logger) -> bool:
        k = (err.key, err.revision)
        now = time.monotonic()
        with self.lock:
            if k in self.seen:
                return False
            self.seen[k] = None
            if len(self.seen) > _SEEN_MAX:
                self.seen.popitem(last=False)
            if now - self.window >= 1.0:
                self.window, self.lines = now, 0
            if self.lines >= LOG_PER_SECOND:
                self.dropped += 1
                return False
            self.lines += 1
            dropped, self.dropped = self.dropped, 0
        logger.warning("stage=control malformed key %s (revision %s): %s; %s%s", err.key,
                       err.revision if err.revision else "unknown", err.why, what,
                       f" ({dropped} more malformed key(s) not logged)" if dropped else "")
        return True


_once = _Once()


def log_malformed(err: Malformed, what: str = "treated as absent",
                  logger: logging.Logger | None = None) -> bool:
    """Log ``err`` once per (key, revision), one line, no traceback; ``what`` says what
    the node does about it. True when it was logged now."""
    return _once(err, what, logger or log)


__all__ = ["Malformed", "Meta", "MemberDoc", "ReportEntry", "ControllerDoc", "AlterIsr", "SetPrimary",
           "Request", "BadRecord", "meta", "member", "report_entry", "report_doc", "record", "record_fields",
           "pin", "controller", "request", "request_at", "setting", "partition_number", "node_id", "rebuild_record",
           "log_malformed", "REBUILD_GRACE_S"]
