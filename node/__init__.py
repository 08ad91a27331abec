"""The reference storage node: partition map, partition states, replicated update path,
membership, file-based rebalancing (default; temp WAL, OWNING gate, crash recovery,
plans) and message-based rebalancing (fallback), client, cluster status and metrics.

Public face:
- :class:`Client` (put/get/remove/lookup/range), :class:`NodeConfig`, :func:`load_config`
- :func:`partition_of`, :func:`owners` (rendezvous hashing with B backups)
- :class:`State`, :data:`ALLOWED`, :class:`StateTable` (the one transition table)
- :class:`NodeError` and its subclasses
- :mod:`node.localcluster` (``LocalCluster``: node processes in one folder, for the demo
  and the benchmark; import it explicitly)
Documentation: docs/node.md, docs/rebalancing.md.
"""
from __future__ import annotations

from .assignment import owners, partition_of
from .client import Client
from .config import CacheConfig, IndexConfig, NodeConfig
from .config import load as load_config
from .errors import (AuthFailed, BadRequest, ConfigError, DataDirLocked, IllegalTransition,
                     NodeError, NotPrimary, TooLarge, Unavailable)
from .states import ALLOWED, State, StateTable

__all__ = ["Client", "NodeConfig", "CacheConfig", "IndexConfig", "load_config", "owners",
           "partition_of", "State", "ALLOWED", "StateTable", "NodeError", "ConfigError",
           "AuthFailed", "BadRequest", "TooLarge", "NotPrimary", "Unavailable",
           "DataDirLocked", "IllegalTransition"]
