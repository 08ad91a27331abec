"""Node configuration: a TOML file (read with :mod:`tomllib`) plus flags that override it.

Every key, its default and its meaning are listed in ``docs/node.md``. The cache layout
(names, partition counts, backups, indexes) must be the same on every node of a cluster:
the coordinator refuses a join whose caches differ.
"""
from __future__ import annotations

import os
import re
import tomllib
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .errors import ConfigError

DEFAULT_PARTITIONS = 64
DEFAULT_BACKUPS = 1
# Why these limits: a key must fit in one data page of a partition file (values may
# spill to overflow pages), and a request must fit in one control frame (1 MiB).
MAX_KEY_BYTES = 512
MAX_VALUE_BYTES = 512 * 1024
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

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "partitions": self.partitions, "backups": self.backups,
                "indexes": [asdict(i) for i in self.indexes]}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> "CacheConfig":
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
    min_in_sync: int = 1                  # writes are refused with fewer in-sync copies (docs/node.md)
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
    # processes a files move may hand its index rebuild's scan to (indexes.ScanPool),
    # so the scan does not take the GIL from the other moves; 0 = never (the node's
    # process); index_offload "idle": only while a CPU is idle (docs/rebalancing.md)
    index_workers: int = 2
    index_offload: str = "idle"              # "idle": only while a CPU is idle; "always"
    index_offload_min_bytes: int = 8 << 20   # smaller files are scanned in the node's process
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


def _caches(raw: Any, where: str) -> tuple[CacheConfig, ...]:
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
            idx.append(IndexConfig(d["name"], d["field"], bool(d.get("unique", False))))
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
    ("rebalance", "index_workers"): "index_workers",
    ("rebalance", "index_offload"): "index_offload",
    ("rebalance", "index_offload_min_bytes"): "index_offload_min_bytes",
    ("control_plane", "endpoints"): "control_plane",
    ("control_plane", "prefix"): "control_prefix",
    ("control_plane", "lease_ttl_s"): "lease_ttl_s",
    ("control_plane", "lease_margin_s"): "lease_margin_s",
    ("cluster", "min_in_sync"): "min_in_sync",
    ("limits", "max_key_bytes"): "max_key_bytes",
    ("limits", "max_value_bytes"): "max_value_bytes",
}


def _flatten(doc: dict[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
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
        elif key in known_tables and isinstance(val, dict):
            for sub, v in val.items():
                if (key, sub) not in _KEYS:
                    raise ConfigError(f"{where}: unknown key [{key}].{sub}")
                out[_KEYS[(key, sub)]] = v
        else:
            raise ConfigError(f"{where}: unknown key {key!r} (see docs/node.md for the keys)")
    return out


def load(path: str | None = None, **flags: Any) -> NodeConfig:
    """Read ``path`` (TOML, optional) and apply ``flags`` (None values are ignored)."""
    values: dict[str, Any] = {}
    where = path or "flags"
    if path:
        try:
            with open(path, "rb") as f:
                doc = tomllib.load(f)
        except OSError as e:
            raise ConfigError(f"cannot read config {path}: {e.strerror}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config {path} is not valid TOML: {e}") from None
        values.update(_flatten(doc, path))
        base = os.path.dirname(os.path.abspath(path))
        for k in ("data", "secret_file"):  # relative paths are relative to the file
            if isinstance(values.get(k), str) and not os.path.isabs(values[k]):
                values[k] = os.path.join(base, values[k])
    for k, v in flags.items():
        if v is not None and v != ():
            values[k] = v
    cp = values.get("control_plane", ())
    if isinstance(cp, str):
        cp = [u for u in cp.split(",") if u]
    if not isinstance(cp, (list, tuple)) or not all(isinstance(u, str) for u in cp):
        raise ConfigError(f"{where}: control_plane.endpoints must be a list of etcd client URLs")
    values["control_plane"] = tuple(u for x in cp for u in x.split(",") if u)
    for req in ("id", "data"):
        if not values.get(req):
            raise ConfigError(f"{where}: '{req}' is required (set it in the file or pass --{req})")
    if not isinstance(values["id"], str) or not _NAME.match(values["id"]):
        raise ConfigError(f"{where}: node id {values['id']!r} must be 1-64 letters, digits, _ . -")
    cfg = NodeConfig(**values, source=path)
    return validate(cfg)


def validate(cfg: NodeConfig) -> NodeConfig:
    parse_address(cfg.listen)
    if cfg.advertise:
        parse_address(cfg.advertise)
    if cfg.control_plane:
        from .control import parse_endpoints
        parse_endpoints(cfg.control_plane)
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
    if cfg.metrics_listen:
        parse_address(cfg.metrics_listen)
    if cfg.transfer_listen:
        host, port = cfg.transfer_listen.rpartition(":")[::2]
        if not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ConfigError(f"transfer.listen {cfg.transfer_listen!r}: expected HOST:PORT (port 0 = any)")
    if cfg.transfer_rate_limit < 0:
        raise ConfigError("transfer.rate_limit must be >= 0 bytes/s (0 = unlimited)")
    if cfg.wal_sync not in ("group", "always", "none"):
        raise ConfigError(f"wal.sync must be group, always or none (got {cfg.wal_sync!r})")
    if cfg.rebalance_mode not in ("messages", "files"):
        raise ConfigError(f"rebalance.mode must be 'messages' or 'files' (got {cfg.rebalance_mode!r})")
    if cfg.rebalance_batch < 1 or cfg.transfer_concurrency < 1:
        raise ConfigError("rebalance.batch and transfer.concurrency must be >= 1")
    if not isinstance(cfg.index_workers, int) or not 0 <= cfg.index_workers <= 64:
        raise ConfigError(f"rebalance.index_workers must be 0 (in the node's process) to 64, "
                          f"not {cfg.index_workers!r}")
    if cfg.index_offload not in ("idle", "always"):
        raise ConfigError(f"rebalance.index_offload must be 'idle' or 'always' (got {cfg.index_offload!r}; "
                          "index_workers = 0 keeps every rebuild in the node's process)")
    if not isinstance(cfg.index_offload_min_bytes, int) or cfg.index_offload_min_bytes < 0:
        raise ConfigError(f"rebalance.index_offload_min_bytes must be >= 0 bytes, "
                          f"not {cfg.index_offload_min_bytes!r}")
    if cfg.max_key_bytes < 1 or cfg.max_value_bytes < 0:
        raise ConfigError("limits: max_key_bytes must be >= 1 and max_value_bytes >= 0")
    return cfg


def with_overrides(cfg: NodeConfig, **changes: Any) -> NodeConfig:
    return validate(replace(cfg, **changes))
