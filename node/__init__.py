"""The reference storage node: partition map, partition states, replicated update path,
membership, file-based rebalancing (default; temp WAL, OWNING gate, crash recovery,
plans) and message-based rebalancing (fallback), client, cluster status and metrics.

Public face:
- :class:`Client` (put/get/remove/lookup/range), :class:`NodeConfig`, :func:`load_config`
- :func:`partition_of`, :func:`owners` (rendezvous hashing with B backups)
- :class:`State`, :data:`ALLOWED`, :class:`StateTable` (the one transition table)
- :class:`NodeError` and its subclasses
- :class:`ClusterMap` (the map as a node sees it), :class:`Pool` and :func:`load_secret`
  (authenticated RPC to nodes), :class:`Etcd` (the control plane's client) and
  :class:`CacheData` (one cache's storage: WAL, pages, indexes; loaded on first use)
- :mod:`node.rpcapi` (the RPC methods, typed: a request class per method, its reply,
  ``Pool.request``, ``fetch_map``)
- :mod:`node.move` (the move engine and its ports, hosted by the node), :mod:`node.status` (``collect``: the cluster status document)
- :mod:`node.etcdserver` (``EtcdCluster``: a local etcd for ``ferry.localcluster``,
  the benchmarks and the harness); import it explicitly
Documentation: docs/node.md, docs/rebalancing.md.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .assignment import owners, partition_of
from .client import Client
from .cluster_map import ClusterMap
from .config import CacheConfig, IndexConfig, NodeConfig
from .config import load as load_config
from .errors import (AuthFailed, BadRequest, ConfigError, DataDirLocked, IllegalTransition,
                     NodeError, NotPrimary, TooLarge, Unavailable)
from .states import ALLOWED, State, StateTable
from .wire import Pool, load_secret

if TYPE_CHECKING:
    from .control import Etcd
    from .storage import CacheData

_LAZY = {"Etcd": ("node.control", "Etcd"), "CacheData": ("node.storage", "CacheData")}


def __getattr__(name: str) -> object:
    # storage (WAL, pages, LMDB) and the etcd client load only when asked for: a
    # client program imports `node` for Client and partition_of alone
    if name in _LAZY:
        import importlib
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'node' has no attribute {name!r}")

__all__ = ["Client", "NodeConfig", "CacheConfig", "IndexConfig", "load_config", "owners",
           "partition_of", "State", "ALLOWED", "StateTable", "NodeError", "ConfigError",
           "AuthFailed", "BadRequest", "TooLarge", "NotPrimary", "Unavailable",
           "DataDirLocked", "IllegalTransition", "ClusterMap", "Pool", "load_secret", "Etcd",
           "CacheData"]
