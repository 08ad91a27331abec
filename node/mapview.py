"""The cluster map from the control plane's keys: a pure function of the keys under
the prefix (what the node's watch holds), so it is tested without etcd.

``P/members/<id>``: live members (the key lives with the member's lease);
``P/reports/<id>``: each node's partition states and counters; ``P/parts/<cache>/<p>``:
the controller's record (primary, in-sync set, epoch, term, lost);
``P/pins/<cache>/<p>``: a plan's owners; ``P/controller``: the elected controller;
``P/settings/<name>``: live cluster settings; ``P/requests/...``: requests to the
controller still pending. A malformed key is logged and skipped, never fatal.

The whole map is rebuilt on each watch batch: O(partitions), fine at the sizes of
docs/node.md's arithmetic; an incremental update would be the next step near 100k.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from .cluster_map import ClusterMap, Member, PartRecord
from .config import CacheConfig
from .control import KV
from .jsonvalue import Json

log = logging.getLogger("ferry.node.membership")


def map_from_keys(kvs: Mapping[str, KV], revision: int, prefix: str,
                  caches: Iterable[CacheConfig]) -> tuple[ClusterMap, dict[str, Json], set[str]]:
    """(the map at ``revision``, the cluster settings, the pending request keys)."""
    head = prefix + "/"
    m = ClusterMap({c.name: c for c in caches})
    m.epoch = revision
    settings: dict[str, Json] = {}
    requests: set[str] = set()
    version = 0
    for key, kv in kvs.items():
        if not key.startswith(head):
            continue
        parts = key[len(head):].split("/")
        kind = parts[0]
        val = kv.value
        try:
            if kind == "members" and len(parts) == 2 and isinstance(val, dict):
                m.members[parts[1]] = Member(parts[1], str(val.get("address", "")), kv.create, True,
                                             bool(val.get("leaving")), str(val.get("boot", "")),
                                             str(val.get("transfer", "")))
                version = max(version, kv.create)
            elif kind == "reports" and len(parts) == 2 and isinstance(val, dict):
                reported = val.get("caches") or {}
                if not isinstance(reported, dict):
                    raise TypeError("caches is not an object")
                for cache, ps in reported.items():
                    if cache not in m.states or not isinstance(ps, dict):
                        continue
                    for p_s, st in ps.items():
                        p = int(p_s)
                        if 0 <= p < len(m.states[cache]) and isinstance(st, list) and len(st) >= 2:
                            counter = int(st[1])  # type: ignore[arg-type]   # first: may refuse
                            m.states[cache][p][parts[1]] = str(st[0])
                            m.counters[cache][p][parts[1]] = counter
            elif kind == "parts" and len(parts) == 3 and parts[1] in m.parts:
                p = int(parts[2])
                if 0 <= p < len(m.parts[parts[1]]):
                    m.parts[parts[1]][p] = PartRecord.from_json(val)
            elif kind == "pins" and len(parts) == 3 and parts[1] in m.pins and isinstance(val, list):
                m.pins[parts[1]][int(parts[2])] = [str(x) for x in val]
            elif kind == "controller" and isinstance(val, dict):
                ctl = val.get("id")
                m.controller = ctl if isinstance(ctl, str) else None
            elif kind == "settings" and len(parts) == 2:
                settings[parts[1]] = val
            elif kind == "requests":
                requests.add(key)
        except (ValueError, TypeError) as e:
            log.warning("stage=control ignoring malformed key %s: %s", key, e)
    m.version = version
    return m, settings, requests


__all__ = ["map_from_keys"]
