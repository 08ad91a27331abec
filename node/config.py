"""Node configuration: a TOML file (read with :mod:`tomllib`) plus flags that override it.

Every key, its default and its meaning are listed in ``docs/node.md``. The cache layout
(names, partition counts, backups, indexes) must be the same on every node of a cluster:
the cluster refuses (P/meta in etcd) a node whose caches differ.
"""
from __future__ import annotations

import os
import re
import tomllib
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypeVar, Union

from faults import fileio

from .errors import ConfigError
from .jsonvalue import JsonDoc, WireDoc

if TYPE_CHECKING:
    from transfer.tls import TlsFiles

    from .control import EtcdAccess

DEFAULT_PARTITIONS = 64
DEFAULT_BACKUPS = 1
# Why these limits: a key must fit in one data page of a partition file (values may
# spill to overflow pages), and a request must fit in one control frame (1 MiB).
MAX_KEY_BYTES = 512
MAX_VALUE_BYTES = 512 * 1024
# A value travels whole in one request frame (transfer.frames.MAX_PAYLOAD, 1 MiB; not
# imported: that would load the transfer package for every `ferry` command). The rest
# of the frame is kept for the key and the request's own fields.
MAX_FRAME = 1 << 20
MAX_VALUE_LIMIT = MAX_FRAME - (64 << 10)
# Below this the checkpointer would start its next run as soon as one ends: an interval
# of 0 keeps a core at 100% for ever.
MIN_CHECKPOINT_INTERVAL_S = 0.05
# The largest whole-number setting: etcd's JSON, the metrics and the C code that meet
# these values take 64-bit integers.
MAX_WHOLE = 2**63 - 1
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
MAX_CONFIG_BYTES = 1 << 20
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class IndexConfig:
    name: str
    field: str
    unique: bool = False


@dataclass(frozen=True)
class CacheConfig:
    name: str = "default"
    partitions: int = DEFAULT_PARTITIONS
    backups: int = DEFAULT_BACKUPS
    indexes: tuple[IndexConfig, ...] = ()

    def to_wire(self) -> JsonDoc:
        return {"name": self.name, "partitions": self.partitions, "backups": self.backups,
                "indexes": [asdict(i) for i in self.indexes]}

    @classmethod
    def from_wire(cls, d: WireDoc) -> "CacheConfig":
        return cls(d["name"], int(d["partitions"]), int(d["backups"]),
                   tuple(IndexConfig(i["name"], i["field"], bool(i.get("unique", False)))
                         for i in d.get("indexes", ())))


# -- the keys of the config file, declared once --------------------------------------
# Each NodeConfig field that is a key of the config file is declared with setting()
# (or field(metadata=declare(...)) when it has no default): its TOML name, how a
# value is checked, whether it is live, a line of help. From these come the file's
# keys (_KEYS), the checks of validate(), the live settings (LIVE_KEYS:
# node.membership.SETTINGS, node.watch.LIVE, node.settings, `ferry cluster settings`)
# and ping's settings. docs/node.md's key table lists every one
# (tests/node/test_config_keys.py checks it).
T = TypeVar("T")
Bound = Union[int, float, Callable[["NodeConfig"], int], None]


@dataclass(frozen=True)
class Setting:
    """One key of the config file. ``kind`` says how a value is checked (and how
    ``ferry cluster settings set`` reads one):

    - ``whole``: an int (not a bool) ``lo``..``hi`` (``hi`` None: at most MAX_WHOLE);
    - ``number``: an int or a float ``lo``..``hi``;
    - ``bool``: true or false (``on``/``off`` and the like in ``ferry cluster settings``);
    - ``choice``: one of ``choices`` (any case with ``fold_case``);
    - ``text``: a string, non-empty when the field has no default;
    - ``address``: HOST:PORT, when set (always when the default is set);
    - ``other``: only ``check``.

    ``lo``, ``hi`` and ``unit`` may be functions of the config (a bound that depends on
    another key). ``rule`` replaces the kind's own words in the error ("KEY must be
    RULE, not VALUE"). ``check`` runs after the kind's check, for what the kind does
    not say (a power of two, a bound that depends on a later key). ``live``: the node
    applies a change without a restart, from its config file and as a cluster setting
    (``ferry cluster settings``)."""
    key: str                       # as written: "transfer.rate_limit" is [transfer] rate_limit
    kind: str
    help: str                      # one line: what the key does
    lo: Bound = None
    hi: Bound = None
    unit: "str | Callable[[NodeConfig], str]" = ""
    choices: tuple[str, ...] = ()
    fold_case: bool = False
    hint: str = ""                 # appended to a choice's error
    rule: str = ""
    check: "Callable[[NodeConfig], None] | None" = None
    live: bool = False
    field: str = ""                # the NodeConfig field (filled in from the class)
    default: object = None         # the field's default (filled in from the class)
    required: bool = False         # the field has no default

    @property
    def path(self) -> tuple[str, ...]:
        """The key as (table, name) or (name,)."""
        return tuple(self.key.split("."))

    def bounds(self, cfg: "NodeConfig") -> tuple[int | float | None, int | float | None, str]:
        lo, hi, unit = self.lo, self.hi, self.unit
        return (lo(cfg) if callable(lo) else lo, hi(cfg) if callable(hi) else hi,
                unit(cfg) if callable(unit) else unit)

    def describe(self) -> str:
        """The values the key takes and its default, for help texts."""
        lo, hi, _unit = self.bounds(NodeConfig(id="x", data="/"))
        if self.kind in ("whole", "number"):
            what = ("whole number " if self.kind == "whole" else "number ") + \
                (f"{lo}..{hi}" if hi is not None else f">= {lo}")
        elif self.kind == "bool":
            what = "on/off"
        elif self.kind == "choice":
            what = "one of " + ", ".join(self.choices)
        else:
            what = self.kind
        shown = {True: "on", False: "off"}.get(self.default, self.default) \
            if isinstance(self.default, bool) else self.default
        return f"{what}, default {shown}"


def declare(key: str, kind: str, help: str, **rest: Any) -> dict[str, Setting]:
    """The field metadata that makes a NodeConfig field the config file's ``key``."""
    return {"setting": Setting(key, kind, help, **rest)}


def setting(default: T, key: str, kind: str, help: str, **rest: Any) -> T:
    """A NodeConfig field with ``default`` that is the config file's ``key`` (see
    :class:`Setting` for the rest)."""
    out: T = field(default=default, metadata=declare(key, kind, help, **rest))
    return out


def _min_memory(cfg: "NodeConfig") -> int:
    from checkpoint import MIN_PAGES
    return int(MIN_PAGES) * cfg.page_size


def _memory_unit(cfg: "NodeConfig") -> str:
    from checkpoint import MIN_PAGES
    return f"bytes, at least {MIN_PAGES} pages of page memory"


def _max_key(cfg: "NodeConfig") -> int:
    from checkpoint import max_key
    return int(max_key(cfg.page_size))


def _endpoints(cfg: "NodeConfig") -> None:
    if cfg.control_plane:
        from .control import parse_endpoints
        parse_endpoints(cfg.control_plane)


def _prefix(cfg: "NodeConfig") -> None:
    p = cfg.control_prefix
    if not isinstance(p, str) or not p.startswith("/") or p.endswith("/") or len(p) > 200:
        raise ConfigError(f"control_plane.prefix must look like /ferry/NAME, not {p!r}")


def _lease_margin(cfg: "NodeConfig") -> None:
    if not isinstance(cfg.lease_margin_s, (int, float)) or not 0 <= cfg.lease_margin_s < cfg.lease_ttl_s / 2:
        raise ConfigError(f"control_plane.lease_margin_s must be 0 .. half the lease TTL, "
                          f"not {cfg.lease_margin_s!r}")


def _members(cfg: "NodeConfig") -> None:
    im = cfg.initial_members
    if not isinstance(im, (tuple, list)) or not all(isinstance(n, str) and _NAME.match(n) for n in im) \
            or len(set(im)) != len(im) or len(im) > 10_000:
        raise ConfigError(f"cluster.initial_members must be a list of distinct node ids, not {im!r}"[:200])


def _transfer_listen(cfg: "NodeConfig") -> None:
    if cfg.transfer_listen:
        host, port = str(cfg.transfer_listen).rpartition(":")[::2]
        if not isinstance(cfg.transfer_listen, str) or not host or not port.isdigit() \
                or not 0 <= int(port) < 65536:
            raise ConfigError(f"transfer.listen {cfg.transfer_listen!r}: expected HOST:PORT (port 0 = any)")


def _power_of_two(cfg: "NodeConfig") -> None:
    from checkpoint.pagefile import valid_page_size
    if not valid_page_size(cfg.page_size):
        raise ConfigError(f"checkpoint.page_size must be a power of two 1024..65536 (the partition "
                          f"file format's page sizes), not {cfg.page_size!r}")


def _max_moves(cfg: "NodeConfig") -> None:
    if cfg.rebalance_max_moves and cfg.rebalance_max_moves < cfg.rebalance_min_moves:
        raise ConfigError(f"rebalance.max_moves ({cfg.rebalance_max_moves}) must be 0 (automatic) or at "
                          f"least rebalance.min_moves ({cfg.rebalance_min_moves})")


@dataclass(frozen=True)
class NodeConfig:
    id: str = field(metadata=declare("id", "text", "node id: 1-64 of A-Z a-z 0-9 _ . -"))
    data: str = field(metadata=declare("data", "text", "data directory (relative to the config file)"))
    listen: str = setting("127.0.0.1:7001", "listen", "address", "address served")
    advertise: str | None = setting(None, "advertise", "address",
                                    "address other nodes and clients use; defaults to listen")
    secret_file: str | None = setting(None, "secret_file", "text",
                                      "cluster secret (not read when [tls] is set)")
    # etcd client URLs of the control plane (membership, primaries, in-sync copies, settings)
    control_plane: tuple[str, ...] = setting((), "control_plane.endpoints", "other",
                                             "etcd client URLs", check=_endpoints)
    control_prefix: str = setting("/ferry/default", "control_plane.prefix", "other",
                                  "key prefix: one etcd can hold several clusters", check=_prefix)
    lease_ttl_s: int = setting(3, "control_plane.lease_ttl_s", "whole",
                               "the node's etcd lease: a node silent this long is failed", lo=2, hi=600,
                               rule="a whole number of seconds 2..600 (etcd's lease granularity)")
    lease_margin_s: float = setting(0.5, "control_plane.lease_margin_s", "other",
                                    "a primary stops acknowledging this long before its lease may end",
                                    check=_lease_margin)
    # how the node proves itself to etcd (node/control.py EtcdAccess): etcd's CA, a
    # client certificate and key, an etcd user and the file holding its password;
    # checked together (EtcdAccess.check)
    etcd_ca: str | None = setting(None, "control_plane.ca", "other", "the CA that signed etcd's certificate")
    etcd_cert: str | None = setting(None, "control_plane.cert", "other", "the node's etcd client certificate")
    etcd_key: str | None = setting(None, "control_plane.key", "other", "the key of control_plane.cert")
    etcd_user: str | None = setting(None, "control_plane.user", "other", "the node's etcd user")
    etcd_password_file: str | None = setting(None, "control_plane.password_file", "other",
                                             "the file holding control_plane.user's password")
    # mutual TLS for node RPC, client RPC and file transfers (transfer/tls.py): the
    # cluster CA, this node's certificate (ferry://node/ID) and key; all three or none.
    # Set, they replace the shared secret (secret_file is then not read). Checked
    # together (_check_tls)
    tls_ca: str | None = setting(None, "tls.ca", "other", "the cluster CA's certificate")
    tls_cert: str | None = setting(None, "tls.cert", "other", "this node's certificate (ferry://node/ID)")
    tls_key: str | None = setting(None, "tls.key", "other", "the key of tls.cert")
    tls_crl: str | None = setting(None, "tls.crl", "other",
                                  "a revocation list signed by the cluster CA (ferry certs revoke)")
    min_in_sync: int = setting(1, "cluster.min_in_sync", "whole",
                               "writes are refused with fewer in-sync copies", lo=1, hi=9, rule="1..9")
    # the members a new cluster starts with (like etcd's --initial-cluster): each
    # creates its rendezvous share of the partitions, empty, so nothing moves at start
    initial_members: tuple[str, ...] = setting((), "cluster.initial_members", "other",
                                               "the node ids a new cluster starts with", check=_members)
    metrics_listen: str | None = setting(None, "metrics_listen", "address",
                                         "HOST:PORT for Prometheus text; unset = off")
    log_level: str = setting("INFO", "log_level", "choice", "the level of the node's log",
                             choices=LOG_LEVELS, fold_case=True, live=True)
    caches: tuple[CacheConfig, ...] = (CacheConfig(),)     # [[caches]]: _caches, _check_caches
    wal_sync: str = setting("group", "wal.sync", "choice", "when the WAL syncs",
                            choices=("group", "always", "none"))
    checkpoint_interval_s: float = setting(5.0, "checkpoint.interval_s", "number",
                                           "seconds between checkpoints", lo=MIN_CHECKPOINT_INTERVAL_S,
                                           hi=86400, unit="seconds", live=True)
    page_size: int = setting(4096, "checkpoint.page_size", "whole", "bytes per page of a partition file",
                             lo=1024, hi=65536, unit="bytes", check=_power_of_two)
    memory_budget: int = setting(64 << 20, "checkpoint.memory_budget", "whole", "bytes of page memory",
                                 lo=_min_memory, unit=_memory_unit)
    transfer_rate_limit: int = setting(0, "transfer.rate_limit", "whole",
                                       "bytes/s of file transfers (files mode), 0 = unlimited",
                                       lo=0, unit="bytes/s, 0 = unlimited", live=True)
    transfer_concurrency: int = setting(4, "transfer.concurrency", "whole", "partitions moved at once",
                                        lo=1, hi=256, unit="partitions moved at once", live=True)
    transfer_listen: str | None = setting(None, "transfer.listen", "other",
                                          "HOST:PORT of the file supplier; unset = listen host, any port",
                                          check=_transfer_listen)
    rebalance_mode: str = setting("files", "rebalance.mode", "choice",
                                  "rebalancing mode of this node as demander", choices=("messages", "files"))
    rebalance_batch: int = setting(512, "rebalance.batch", "whole", "entries per batch in the messages mode",
                                   lo=1, hi=65536, unit="entries per batch")
    replay_rate_limit: int = setting(0, "rebalance.replay_rate_limit", "whole",
                                     "temp-WAL records/s replayed per move, 0 = unlimited",
                                     lo=0, unit="records/s, 0 = unlimited", live=True)
    # foreground protection (node/admission.py): moves yield when writes slow down
    rebalance_protect: bool = setting(True, "rebalance.protect", "bool",
                                      "foreground protection: moves yield when writes slow down", live=True)
    latency_target_ms: float = setting(0.0, "rebalance.latency_target_ms", "number",
                                       "the write p99 (ms) protection keeps, 0 = 1.5 x the idle p99", lo=0, hi=60_000,
                                       unit="milliseconds of write p99, 0 = 1.5 x the idle p99", live=True)
    rebalance_min_moves: int = setting(1, "rebalance.min_moves", "whole",
                                       "moves at once the protection never goes below",
                                       lo=1, hi=256, unit="moves the protection never goes below", live=True)
    rebalance_max_moves: int = setting(0, "rebalance.max_moves", "whole", "moves at once, at most, 0 = 2 x transfer.concurrency",
                                       lo=0, hi=256, unit="moves at once, 0 = 2 x transfer.concurrency",
                                       check=_max_moves, live=True)
    # processes a files move may hand its index rebuild's scan to (indexes.ScanPool),
    # so the scan does not take the GIL from the other moves; 0 = never (the node's
    # process); index_offload "idle": only while a CPU is idle (docs/rebalancing.md)
    index_workers: int = setting(2, "rebalance.index_workers", "whole",
                                 "processes an index rebuild may hand its scan to",
                                 lo=0, hi=64, unit="processes, 0 = in the node's process")
    index_offload: str = setting("idle", "rebalance.index_offload", "choice",
                                 "when a rebuild's scan goes to those processes: idle (a CPU is idle), always",
                                 choices=("idle", "always"),
                                 hint="; index_workers = 0 keeps every rebuild in the node's process")
    index_offload_min_bytes: int = setting(8 << 20, "rebalance.index_offload_min_bytes", "whole",
                                           "smaller files are scanned in the node's process",
                                           lo=0, unit="bytes")
    # the streaming install: a files move builds p's index keys while its file arrives
    # (node/move/stream.py); off: rebuilt from the installed file (docs/rebalancing.md).
    # Off by default: on 2 cores it made every join slower (1.3-1.8x at 1-64 KiB values,
    # docs/benchmarks.md, `bench/rebalance_bench.py`); the decode competes with the receive.
    stream_index: bool = setting(False, "rebalance.stream_index", "bool",
                                 "a files move builds its index keys while the file arrives")
    # how a files move gets p's index: rebuilt from the installed file, shipped by the
    # supplier beside the file (node/move/ship.py: its entries at the file's counter,
    # checked against the file, a rebuild when a check fails), or shipped when the
    # partition's values average below index_ship_below (docs/rebalancing.md)
    index_transfer: str = setting("rebuild", "rebalance.index_transfer", "choice",
                                  "how a files move gets the partition's index: rebuild, ship, auto",
                                  choices=("rebuild", "ship", "auto"),
                                  hint="; auto ships when values average below rebalance.index_ship_below",
                                  live=True)
    index_ship_below: int = setting(1024, "rebalance.index_ship_below", "whole",
                                    "index_transfer = auto ships the index when the partition's "
                                    "file holds fewer bytes per live entry than this",
                                    lo=0, unit="bytes per live entry", live=True)
    # delta catch-up: a copy that still holds an older file of p fetches only the pages
    # that differ (transfer.delta), unless more than delta_limit of them do
    delta: bool = setting(True, "rebalance.delta", "bool", "delta catch-up: fetch only the pages that differ")
    delta_limit: float = setting(0.5, "rebalance.delta_limit", "number",
                                 "the whole file is fetched when more than this fraction of pages differ",
                                 lo=0.0, hi=1.0, rule="a fraction 0..1 of a partition's pages")
    max_key_bytes: int = setting(MAX_KEY_BYTES, "limits.max_key_bytes", "whole", "longest key, bytes",
                                 lo=1, hi=_max_key,
                                 unit=lambda cfg: f"bytes: a key must fit in one {cfg.page_size}-byte data page")
    max_value_bytes: int = setting(MAX_VALUE_BYTES, "limits.max_value_bytes", "whole", "longest value, bytes",
                                   lo=0, hi=MAX_VALUE_LIMIT,
                                   unit=f"bytes: a value travels in one {MAX_FRAME >> 20} MiB request frame")
    source: str | None = field(default=None, compare=False)   # the TOML file, if any

    @property
    def address(self) -> str:
        return self.advertise or self.listen

    @property
    def supplier_listen(self) -> tuple[str, int]:
        """Where the file supplier (transfer.SupplierServer) listens."""
        if self.transfer_listen:
            host, _, port = self.transfer_listen.rpartition(":")
            return host, int(port)
        return parse_address(self.listen)[0], 0

    def cache(self, name: str) -> CacheConfig:
        for c in self.caches:
            if c.name == name:
                return c
        raise ConfigError(f"unknown cache {name!r}; configured: {', '.join(c.name for c in self.caches)}")


def parse_address(addr: str) -> tuple[str, int]:
    host, sep, port = str(addr).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"bad address {addr!r}: expected HOST:PORT, e.g. 127.0.0.1:7001")
    return host, int(port)


def _caches(raw: object, where: str) -> tuple[CacheConfig, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: 'caches' must be a non-empty array of tables ([[caches]])")
    out = []
    for i, c in enumerate(raw):
        if not isinstance(c, dict):
            raise ConfigError(f"{where}: caches[{i}] must be a table")
        name = c.get("name", "default")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(f"{where}: caches[{i}].name {name!r} must be 1-64 letters, digits, _ . -")
        parts, backups = c.get("partitions", DEFAULT_PARTITIONS), c.get("backups", DEFAULT_BACKUPS)
        if not isinstance(parts, int) or not 1 <= parts <= 65536:
            raise ConfigError(f"{where}: caches[{i}].partitions must be an integer 1..65536")
        if not isinstance(backups, int) or not 0 <= backups <= 8:
            raise ConfigError(f"{where}: caches[{i}].backups must be an integer 0..8")
        idx = []
        for j, d in enumerate(c.get("indexes", [])):
            if not isinstance(d, dict) or not isinstance(d.get("name"), str) \
                    or not isinstance(d.get("field"), str) or not _NAME.match(d["name"]):
                raise ConfigError(f"{where}: caches[{i}].indexes[{j}] needs string 'name' and 'field'")
            if not isinstance(d.get("unique", False), bool):
                raise ConfigError(f"{where}: caches[{i}].indexes[{j}].unique must be true or false, "
                                  f"not {d['unique']!r}")
            idx.append(IndexConfig(d["name"], d["field"], d.get("unique", False)))
        out.append(CacheConfig(name, parts, backups, tuple(idx)))
    if len({c.name for c in out}) != len(out):
        raise ConfigError(f"{where}: cache names must be unique")
    return tuple(out)


# every key of the config file, in NodeConfig's order (the order validate() checks them)
KEYS: tuple[Setting, ...] = tuple(
    replace(f.metadata["setting"], field=f.name, required=f.default is MISSING,
            default=None if f.default is MISSING else f.default)
    for f in fields(NodeConfig) if "setting" in f.metadata)
BY_KEY: dict[str, Setting] = {s.key: s for s in KEYS}
# TOML (table, key) or (key,) -> NodeConfig field
_KEYS: dict[tuple[str, ...], str] = {s.path: s.field for s in KEYS}
# the live settings: name ("transfer.rate_limit") -> NodeConfig field
LIVE_KEYS: dict[str, str] = {s.key: s.field for s in KEYS if s.live}


def _flatten(doc: dict[str, object], where: str) -> dict[str, object]:
    out: dict[str, object] = {}
    known_tables = {k[0] for k in _KEYS if len(k) == 2} | {"caches"}
    for key, val in doc.items():
        if key == "caches":
            out["caches"] = _caches(val, where)
        elif (key,) in _KEYS:
            out[_KEYS[(key,)]] = val
        elif key == "membership" or key == "join":
            raise ConfigError(f"{where}: {key!r} is gone: membership lives in the control plane "
                              "(etcd); set [control_plane] endpoints and lease_ttl_s instead "
                              "(docs/node.md)")
        elif key in known_tables:
            if not isinstance(val, dict):
                raise ConfigError(f"{where}: {key!r} must be a table ([{key}] with its keys below)")
            for sub, v in val.items():
                if (key, sub) not in _KEYS:
                    raise ConfigError(f"{where}: unknown key [{key}].{sub}")
                out[_KEYS[(key, sub)]] = v
        else:
            raise ConfigError(f"{where}: unknown key {key!r} (see docs/node.md for the keys)")
    return out


def read_toml(path: str) -> dict[str, object]:
    """The document of the TOML file ``path``, or ConfigError saying what is wrong.
    Opened non-blocking and only if it is a regular file: ``--config`` naming a FIFO
    hung the start, ``/dev/zero`` read until memory ran out."""
    try:
        raw = fileio.read_regular(path, MAX_CONFIG_BYTES)
    except fileio.NotRegularFile:
        raise ConfigError(f"config {path} is not a regular file; point --config at a "
                          "TOML file") from None
    except fileio.FileTooLarge as e:
        raise ConfigError(f"config {path} is {e.size} bytes; a node's config is "
                          f"a few KiB (at most {MAX_CONFIG_BYTES} bytes are read)") from None
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:     # tomllib would raise this, not TOMLDecodeError
        line = raw.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"config {path} is not UTF-8 text (byte 0x{raw[e.start]:02x} on line "
                          f"{line}); TOML files must be UTF-8: re-save it as UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config {path} is not valid TOML: {e}") from None
    except RecursionError:
        raise ConfigError(f"config {path} nests arrays or tables too deeply") from None


def load(path: str | None = None, **flags: object) -> NodeConfig:
    """Read ``path`` (TOML, optional) and apply ``flags`` (None values are ignored)."""
    values: dict[str, object] = {}
    where = path or "flags"
    if path:
        values.update(_flatten(read_toml(path), path))
        base = os.path.dirname(os.path.abspath(path))
        for k in ("data", "secret_file", "etcd_ca", "etcd_cert", "etcd_key",
                  "etcd_password_file", "tls_ca", "tls_cert", "tls_key", "tls_crl"):  # relative paths are relative to the file
            rel = values.get(k)
            if isinstance(rel, str) and not os.path.isabs(rel):
                values[k] = os.path.join(base, rel)
    for k, v in flags.items():
        if v is not None and v != ():
            values[k] = v
    cp = values.get("control_plane", ())
    if isinstance(cp, str):
        cp = [u for u in cp.split(",") if u]
    if not isinstance(cp, (list, tuple)) or not all(isinstance(u, str) for u in cp):
        raise ConfigError(f"{where}: control_plane.endpoints must be a list of etcd client URLs")
    values["control_plane"] = tuple(u for x in cp for u in x.split(",") if u)
    im = values.get("initial_members", ())
    if isinstance(im, str):
        im = [n for n in im.split(",") if n]
    if isinstance(im, list):
        im = tuple(n.strip() if isinstance(n, str) else n for x in im
                   for n in (x.split(",") if isinstance(x, str) else [x]) if n != "")
    values["initial_members"] = im
    for req in ("id", "data"):
        if not values.get(req):
            raise ConfigError(f"{where}: '{req}' is required (set it in the file or pass --{req})")
    if not isinstance(values["id"], str) or not _NAME.match(values["id"]):
        raise ConfigError(f"{where}: node id {values['id']!r} must be 1-64 letters, digits, _ . -")
    if "max_key_bytes" not in values and isinstance(values.get("page_size"), int) \
            and not isinstance(values["page_size"], bool):
        # the default key limit is what one data page holds, if that is less than 512:
        # page_size = 1024 alone must not be refused for a key limit nobody set
        from checkpoint import max_key
        values["max_key_bytes"] = min(MAX_KEY_BYTES, max(1, max_key(values["page_size"])))
    cfg = _unchecked(NodeConfig(id="", data=""), dict(values, source=path))
    try:
        return validate(cfg)
    except ConfigError as e:
        # name the file, unless the value came from a flag (validate's messages start
        # with the key's name)
        flagged = [_key(k) for k, v in flags.items() if v is not None and v != ()]
        if not path or any(str(e).startswith(k + " ") for k in flagged):
            raise
        raise ConfigError(f"{path}: {e}") from None


def access(cfg: NodeConfig) -> "EtcdAccess":
    """The node's etcd credentials: the [control_plane] keys, or the environment's
    (``FERRY_ETCD_*``) when the file sets none of them."""
    from .control import EtcdAccess
    a = EtcdAccess(cfg.etcd_ca, cfg.etcd_cert, cfg.etcd_key, cfg.etcd_user, cfg.etcd_password_file)
    return EtcdAccess.from_env() if a.empty else a


def validate(cfg: NodeConfig) -> NodeConfig:
    """``cfg`` if every key's value is of its type and in its range (its :class:`Setting`,
    in NodeConfig's order), the keys that go together agree and the caches are sound;
    else ConfigError naming the first key that is wrong."""
    for s in KEYS:
        _check(cfg, s)
    access(cfg).check(cfg.control_plane)
    _check_tls(cfg)
    _check_caches(cfg.caches)
    return cfg


def _unchecked(cfg: NodeConfig, changes: Mapping[str, object]) -> NodeConfig:
    """``cfg`` with fields replaced by values not checked yet (a file's, a flag's, a
    live setting's): every caller passes the result to :func:`validate` at once, which
    refuses a value of the wrong type or range with ConfigError."""
    raw: dict[str, Any] = dict(changes)
    return replace(cfg, **raw)


def with_overrides(cfg: NodeConfig, **changes: object) -> NodeConfig:
    return validate(_unchecked(cfg, changes))


def field_of(name: str) -> str | None:
    """The NodeConfig field of a key as written in the file and in ``ferry cluster
    settings`` (``transfer.rate_limit``), or of the field's own name; None if neither."""
    for k, f in _KEYS.items():
        if ".".join(k) == name:
            return f
    return name if name in NodeConfig.__dataclass_fields__ else None


def apply_each(cfg: NodeConfig, changes: Mapping[str, object]) -> tuple[NodeConfig, dict[str, str]]:
    """Apply live setting changes one by one. ``changes`` maps a setting's name
    (``transfer.rate_limit``) or its NodeConfig field (``transfer_rate_limit``) to the
    new value. Each is checked on its own, on the config with the changes accepted so
    far, so one malformed stored setting no longer holds back every other one; a
    change that depends on another (``rebalance.min_moves`` above the old
    ``max_moves``) is tried again after the others. Returns the new config and
    ``{name as given: why refused}``."""
    new = cfg
    pending: dict[str, tuple[str, object]] = {}
    refused: dict[str, str] = {}
    for name, value in changes.items():
        fld = field_of(name)
        if fld is None or fld not in LIVE_FIELDS:
            refused[name] = f"unknown setting {name!r}"
        else:
            pending[name] = (fld, value)
    progress = True
    while pending and progress:
        progress = False
        for name, (fld, value) in list(pending.items()):
            try:
                new = validate(_unchecked(new, {fld: value}))
            except (ConfigError, TypeError, ValueError, OverflowError) as e:
                refused[name] = str(e)
                continue
            del pending[name]
            refused.pop(name, None)
            progress = True
    return new, refused


def _key(fld: str) -> str:
    """The TOML name of a NodeConfig field (``transfer.rate_limit``), as users write it
    in the file and in ``ferry cluster settings set``."""
    return _KEY_OF.get(fld, fld)


_KEY_OF = {s.field: s.key for s in KEYS}
LIVE_FIELDS = frozenset(LIVE_KEYS.values())


def _check(cfg: NodeConfig, s: Setting) -> None:
    """Refuse the value of ``s`` in ``cfg`` with ConfigError if it is not of the
    setting's kind and range, then run its own ``check``."""
    v = getattr(cfg, s.field)
    rule = s.rule
    bad = False
    if s.kind == "whole":
        lo, hi, unit = s.bounds(cfg)
        top = MAX_WHOLE if hi is None else hi
        # bool is an int in Python; `true` is never a count
        bad = not isinstance(v, int) or isinstance(v, bool) or not (lo is None or lo <= v) or not v <= top
        if bad and not rule:
            rng = f"{lo}..{hi}" if hi is not None else f">= {lo} (at most {MAX_WHOLE})"
            rule = f"a whole number {rng} ({unit})"
    elif s.kind == "number":
        lo, hi, unit = s.bounds(cfg)
        # NaN fails too: every comparison with it is False
        bad = not isinstance(v, (int, float)) or isinstance(v, bool) \
            or not (lo is None or lo <= v) or not (hi is None or v <= hi)
        rule = rule or f"a number {lo}..{hi} ({unit})"
    elif s.kind == "bool":
        bad, rule = not isinstance(v, bool), rule or "true or false"
    elif s.kind == "choice":
        if not isinstance(v, str) or (v.upper() if s.fold_case else v) not in s.choices:
            raise ConfigError(f"{s.key} must be one of {', '.join(s.choices)}, not {v!r}{s.hint}")
    elif s.kind == "text":
        if s.required and (not isinstance(v, str) or not v):
            raise ConfigError(f"{s.key!r} must be a non-empty string, not {v!r}")
        bad, rule = v is not None and not isinstance(v, str), rule or "a string"
    elif s.kind == "address":
        if v or s.default is not None:
            parse_address(v)
        bad, rule = v is not None and not isinstance(v, str), rule or "a string"
    if bad:
        raise ConfigError(f"{s.key} must be {rule}, not {v!r}")
    if s.check is not None:
        s.check(cfg)


def _check_tls(cfg: NodeConfig) -> None:
    """[tls] ca, cert, key: all three paths or none (the files are read when the node
    starts: transfer.tls names a file that does not load)."""
    vals = {f: getattr(cfg, f) for f in ("tls_ca", "tls_cert", "tls_key")}
    for f, v in vals.items():
        if v is not None and (not isinstance(v, str) or not v):
            raise ConfigError(f"{_key(f)} must be a file path, not {v!r}")
    given = [f for f, v in vals.items() if v]
    if given and len(given) != 3:
        missing = ", ".join(_key(f) for f in vals if f not in given)
        raise ConfigError(f"{_key(given[0])}: TLS needs all of tls.ca, tls.cert and tls.key; "
                          f"missing {missing} (`ferry certs issue CA_DIR ID --node` makes them)")
    crl = cfg.tls_crl
    if crl is not None and (not isinstance(crl, str) or not crl):
        raise ConfigError(f"{_key('tls_crl')} must be a file path, not {crl!r}")
    if crl and not given:
        raise ConfigError(f"{_key('tls_crl')}: a revocation list is for mutual TLS; set tls.ca, "
                          "tls.cert and tls.key too")


def tls_files(cfg: NodeConfig) -> "TlsFiles | None":
    """The node's [tls] files, or None: the shared secret authenticates instead."""
    if not cfg.tls_ca or not cfg.tls_cert or not cfg.tls_key:
        return None
    from transfer.tls import TlsFiles
    return TlsFiles(cfg.tls_ca, cfg.tls_cert, cfg.tls_key, cfg.tls_crl or None)


def _check_caches(caches: object) -> None:
    """Caches from the file (already shape-checked by :func:`_caches`) or from flags
    (``--partitions``/``--backups``): the same ranges either way."""
    if not isinstance(caches, tuple) or not caches:
        raise ConfigError("there must be at least one cache ([[caches]])")
    for i, c in enumerate(caches):
        where = f"caches[{i}] ({c.name})"
        if not isinstance(c.partitions, int) or isinstance(c.partitions, bool) \
                or not 1 <= c.partitions <= 65536:
            raise ConfigError(f"{where}: partitions must be a whole number 1..65536, not {c.partitions!r}")
        if not isinstance(c.backups, int) or isinstance(c.backups, bool) or not 0 <= c.backups <= 8:
            raise ConfigError(f"{where}: backups must be a whole number 0..8, not {c.backups!r}")
        names = [ix.name for ix in c.indexes]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"{where}: index name(s) {', '.join(map(repr, dup))} appear more than "
                              "once; each index of a cache needs its own name")
    if len({c.name for c in caches}) != len(caches):
        raise ConfigError("cache names must be unique")
