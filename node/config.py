"""Node configuration: a TOML file (read with :mod:`tomllib`) plus flags that override it.

Every key, its default and its meaning are listed in ``docs/node.md``. The cache layout
(names, partition counts, backups, indexes) must be the same on every node of a cluster:
the cluster refuses (P/meta in etcd) a node whose caches differ.
"""
from __future__ import annotations

import os
import re
import tomllib
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Mapping

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


@dataclass(frozen=True)
class NodeConfig:
    id: str
    data: str
    listen: str = "127.0.0.1:7001"
    advertise: str | None = None          # address others use; defaults to listen
    secret_file: str | None = None
    # etcd client URLs of the control plane (membership, primaries, in-sync copies, settings)
    control_plane: tuple[str, ...] = ()
    control_prefix: str = "/ferry/default"   # key prefix: one etcd can hold several clusters
    lease_ttl_s: int = 3                  # the node's etcd lease: a node silent this long is failed
    lease_margin_s: float = 0.5           # a primary stops acknowledging this long before its lease may end
    # how the node proves itself to etcd (node/control.py EtcdAccess): etcd's CA, a
    # client certificate and key, an etcd user and the file holding its password
    etcd_ca: str | None = None
    etcd_cert: str | None = None
    etcd_key: str | None = None
    etcd_user: str | None = None
    etcd_password_file: str | None = None
    # mutual TLS for node RPC, client RPC and file transfers (transfer/tls.py): the
    # cluster CA, this node's certificate (ferry://node/ID) and key; all three or none.
    # Set, they replace the shared secret (secret_file is then not read)
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    min_in_sync: int = 1                  # writes are refused with fewer in-sync copies (docs/node.md)
    # the members a new cluster starts with (like etcd's --initial-cluster): each
    # creates its rendezvous share of the partitions, empty, so nothing moves at start
    initial_members: tuple[str, ...] = ()
    metrics_listen: str | None = None     # "HOST:PORT" for Prometheus text; None = off
    log_level: str = "INFO"
    caches: tuple[CacheConfig, ...] = (CacheConfig(),)
    wal_sync: str = "group"
    checkpoint_interval_s: float = 5.0
    page_size: int = 4096
    memory_budget: int = 64 << 20
    transfer_rate_limit: int = 0          # bytes/s, 0 = unlimited (used by the files mode)
    transfer_concurrency: int = 4         # partitions moved at once
    transfer_listen: str | None = None    # "HOST:PORT" of the file supplier; None = listen host, any port
    rebalance_mode: str = "files"
    rebalance_batch: int = 512            # entries per batch in the messages mode
    replay_rate_limit: int = 0            # temp-WAL records/s replayed per move, 0 = unlimited
    # foreground protection (node/admission.py): moves yield when writes slow down
    rebalance_protect: bool = True
    latency_target_ms: float = 0.0        # write p99 target; 0 = 1.5 x each node's idle p99
    rebalance_min_moves: int = 1          # the controller never goes below this many moves
    rebalance_max_moves: int = 0          # moves at once; 0 = 2 x transfer.concurrency (files)
    # processes a files move may hand its index rebuild's scan to (indexes.ScanPool),
    # so the scan does not take the GIL from the other moves; 0 = never (the node's
    # process); index_offload "idle": only while a CPU is idle (docs/rebalancing.md)
    index_workers: int = 2
    index_offload: str = "idle"              # "idle": only while a CPU is idle; "always"
    index_offload_min_bytes: int = 8 << 20   # smaller files are scanned in the node's process
    # the streaming install: a files move builds p's index keys while its file arrives
    # (node/move/stream.py); off: rebuilt from the installed file (docs/rebalancing.md).
    # Off by default: on 2 cores it made every join slower (1.3-1.8x at 1-64 KiB values,
    # docs/benchmarks.md, `bench/rebalance_bench.py`); the decode competes with the receive.
    stream_index: bool = False
    # delta catch-up: a copy that still holds an older file of p fetches only the pages
    # that differ (transfer.delta), unless more than delta_limit of them do
    delta: bool = True
    delta_limit: float = 0.5
    max_key_bytes: int = MAX_KEY_BYTES
    max_value_bytes: int = MAX_VALUE_BYTES
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


# TOML table.key -> NodeConfig field
_KEYS: dict[tuple[str, ...], str] = {
    ("id",): "id", ("data",): "data", ("listen",): "listen", ("advertise",): "advertise",
    ("secret_file",): "secret_file", ("metrics_listen",): "metrics_listen",
    ("log_level",): "log_level",
    ("wal", "sync"): "wal_sync",
    ("checkpoint", "interval_s"): "checkpoint_interval_s",
    ("checkpoint", "page_size"): "page_size",
    ("checkpoint", "memory_budget"): "memory_budget",
    ("transfer", "rate_limit"): "transfer_rate_limit",
    ("transfer", "concurrency"): "transfer_concurrency",
    ("transfer", "listen"): "transfer_listen",
    ("rebalance", "mode"): "rebalance_mode",
    ("rebalance", "batch"): "rebalance_batch",
    ("rebalance", "replay_rate_limit"): "replay_rate_limit",
    ("rebalance", "protect"): "rebalance_protect",
    ("rebalance", "latency_target_ms"): "latency_target_ms",
    ("rebalance", "min_moves"): "rebalance_min_moves",
    ("rebalance", "max_moves"): "rebalance_max_moves",
    ("rebalance", "index_workers"): "index_workers",
    ("rebalance", "index_offload"): "index_offload",
    ("rebalance", "index_offload_min_bytes"): "index_offload_min_bytes",
    ("rebalance", "stream_index"): "stream_index",
    ("rebalance", "delta"): "delta",
    ("rebalance", "delta_limit"): "delta_limit",
    ("control_plane", "endpoints"): "control_plane",
    ("control_plane", "prefix"): "control_prefix",
    ("control_plane", "lease_ttl_s"): "lease_ttl_s",
    ("control_plane", "lease_margin_s"): "lease_margin_s",
    ("control_plane", "ca"): "etcd_ca",
    ("control_plane", "cert"): "etcd_cert",
    ("control_plane", "key"): "etcd_key",
    ("control_plane", "user"): "etcd_user",
    ("control_plane", "password_file"): "etcd_password_file",
    ("tls", "ca"): "tls_ca",
    ("tls", "cert"): "tls_cert",
    ("tls", "key"): "tls_key",
    ("cluster", "min_in_sync"): "min_in_sync",
    ("cluster", "initial_members"): "initial_members",
    ("limits", "max_key_bytes"): "max_key_bytes",
    ("limits", "max_value_bytes"): "max_value_bytes",
}


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
                  "etcd_password_file", "tls_ca", "tls_cert", "tls_key"):  # relative paths are relative to the file
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
    parse_address(cfg.listen)
    if cfg.advertise:
        parse_address(cfg.advertise)
    if cfg.control_plane:
        from .control import parse_endpoints
        parse_endpoints(cfg.control_plane)
    access(cfg).check(cfg.control_plane)
    if not isinstance(cfg.lease_ttl_s, int) or isinstance(cfg.lease_ttl_s, bool) \
            or not 2 <= cfg.lease_ttl_s <= 600:
        raise ConfigError(f"control_plane.lease_ttl_s must be a whole number of seconds 2..600 "
                          f"(etcd's lease granularity), not {cfg.lease_ttl_s!r}")
    if not isinstance(cfg.lease_margin_s, (int, float)) or not 0 <= cfg.lease_margin_s < cfg.lease_ttl_s / 2:
        raise ConfigError(f"control_plane.lease_margin_s must be 0 .. half the lease TTL, "
                          f"not {cfg.lease_margin_s!r}")
    if not isinstance(cfg.control_prefix, str) or not cfg.control_prefix.startswith("/") \
            or cfg.control_prefix.endswith("/") or len(cfg.control_prefix) > 200:
        raise ConfigError(f"control_plane.prefix must look like /ferry/NAME, not {cfg.control_prefix!r}")
    if not isinstance(cfg.min_in_sync, int) or isinstance(cfg.min_in_sync, bool) \
            or not 1 <= cfg.min_in_sync <= 9:
        raise ConfigError(f"cluster.min_in_sync must be 1..9, not {cfg.min_in_sync!r}")
    im = cfg.initial_members
    if not isinstance(im, (tuple, list)) or not all(isinstance(n, str) and _NAME.match(n) for n in im) \
            or len(set(im)) != len(im) or len(im) > 10_000:
        raise ConfigError(f"cluster.initial_members must be a list of distinct node ids, not {im!r}"[:200])
    if cfg.metrics_listen:
        parse_address(cfg.metrics_listen)
    if cfg.transfer_listen:
        host, port = str(cfg.transfer_listen).rpartition(":")[::2]
        if not isinstance(cfg.transfer_listen, str) or not host or not port.isdigit() \
                or not 0 <= int(port) < 65536:
            raise ConfigError(f"transfer.listen {cfg.transfer_listen!r}: expected HOST:PORT (port 0 = any)")
    for fld in ("id", "data"):
        if not isinstance(getattr(cfg, fld), str) or not getattr(cfg, fld):
            raise ConfigError(f"{fld!r} must be a non-empty string, not {getattr(cfg, fld)!r}")
    for fld in ("advertise", "secret_file"):
        if getattr(cfg, fld) is not None and not isinstance(getattr(cfg, fld), str):
            raise ConfigError(f"{_key(fld)} must be a string, not {getattr(cfg, fld)!r}")
    _check_tls(cfg)
    _choice(cfg, "log_level", LOG_LEVELS, upper=True)
    _choice(cfg, "wal_sync", ("group", "always", "none"))
    _choice(cfg, "rebalance_mode", ("messages", "files"))
    _choice(cfg, "index_offload", ("idle", "always"),
            hint="; index_workers = 0 keeps every rebuild in the node's process")
    _number(cfg, "checkpoint_interval_s", MIN_CHECKPOINT_INTERVAL_S, 86400, "seconds")
    _whole(cfg, "page_size", 1024, 65536, "bytes")
    from checkpoint.pagefile import valid_page_size
    if not valid_page_size(cfg.page_size):
        raise ConfigError(f"checkpoint.page_size must be a power of two 1024..65536 (the partition "
                          f"file format's page sizes), not {cfg.page_size!r}")
    from checkpoint import MIN_PAGES
    _whole(cfg, "memory_budget", MIN_PAGES * cfg.page_size, None,
           f"bytes, at least {MIN_PAGES} pages of page memory")
    _whole(cfg, "transfer_rate_limit", 0, None, "bytes/s, 0 = unlimited")
    _whole(cfg, "transfer_concurrency", 1, 256, "partitions moved at once")
    _whole(cfg, "rebalance_batch", 1, 65536, "entries per batch")
    _whole(cfg, "replay_rate_limit", 0, None, "records/s, 0 = unlimited")
    _whole(cfg, "index_workers", 0, 64, "processes, 0 = in the node's process")
    if not isinstance(cfg.rebalance_protect, bool):
        raise ConfigError(f"rebalance.protect must be true or false, not {cfg.rebalance_protect!r}")
    _number(cfg, "latency_target_ms", 0, 60_000, "milliseconds of write p99, 0 = 1.5 x the idle p99")
    _whole(cfg, "rebalance_min_moves", 1, 256, "moves the protection never goes below")
    _whole(cfg, "rebalance_max_moves", 0, 256, "moves at once, 0 = 2 x transfer.concurrency")
    if cfg.rebalance_max_moves and cfg.rebalance_max_moves < cfg.rebalance_min_moves:
        raise ConfigError(f"rebalance.max_moves ({cfg.rebalance_max_moves}) must be 0 (automatic) or at "
                          f"least rebalance.min_moves ({cfg.rebalance_min_moves})")
    _whole(cfg, "index_offload_min_bytes", 0, None, "bytes")
    if not isinstance(cfg.stream_index, bool):
        raise ConfigError(f"rebalance.stream_index must be true or false, not {cfg.stream_index!r}")
    if not isinstance(cfg.delta, bool):
        raise ConfigError(f"rebalance.delta must be true or false, not {cfg.delta!r}")
    if isinstance(cfg.delta_limit, bool) or not isinstance(cfg.delta_limit, (int, float)) or \
            not 0.0 <= cfg.delta_limit <= 1.0:
        raise ConfigError(f"rebalance.delta_limit must be a fraction 0..1 of a partition's pages, "
                          f"not {cfg.delta_limit!r}")
    from checkpoint import max_key
    _whole(cfg, "max_key_bytes", 1, max_key(cfg.page_size),
           f"bytes: a key must fit in one {cfg.page_size}-byte data page")
    _whole(cfg, "max_value_bytes", 0, MAX_VALUE_LIMIT,
           f"bytes: a value travels in one {MAX_FRAME >> 20} MiB request frame")
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
        if fld is None or fld in ("id", "data", "source", "caches", "tls_ca", "tls_cert", "tls_key"):
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
    for k, f in _KEYS.items():
        if f == fld:
            return ".".join(k)
    return fld


def _whole(cfg: NodeConfig, fld: str, lo: int, hi: int | None, unit: str) -> None:
    v = getattr(cfg, fld)
    top = MAX_WHOLE if hi is None else hi
    # bool is an int in Python; `true` is never a count
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= top:
        rng = f"{lo}..{hi}" if hi is not None else f">= {lo} (at most {MAX_WHOLE})"
        raise ConfigError(f"{_key(fld)} must be a whole number {rng} ({unit}), not {v!r}")


def _number(cfg: NodeConfig, fld: str, lo: float, hi: float, unit: str) -> None:
    v = getattr(cfg, fld)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= v <= hi:  # NaN fails too
        raise ConfigError(f"{_key(fld)} must be a number {lo}..{hi} ({unit}), not {v!r}")


def _choice(cfg: NodeConfig, fld: str, allowed: tuple[str, ...], *, upper: bool = False,
            hint: str = "") -> None:
    v = getattr(cfg, fld)
    if not isinstance(v, str) or (v.upper() if upper else v) not in allowed:
        raise ConfigError(f"{_key(fld)} must be one of {', '.join(allowed)}, not {v!r}{hint}")


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


def tls_files(cfg: NodeConfig) -> "TlsFiles | None":
    """The node's [tls] files, or None: the shared secret authenticates instead."""
    if not cfg.tls_ca or not cfg.tls_cert or not cfg.tls_key:
        return None
    from transfer.tls import TlsFiles
    return TlsFiles(cfg.tls_ca, cfg.tls_cert, cfg.tls_key)


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
