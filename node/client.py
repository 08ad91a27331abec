"""``node.Client``: the small Python client.

It fetches the cluster map from any reachable address, sends each put/get/remove to
the primary of the key's partition, and follows map changes: a ``not_primary`` or
``unavailable`` answer (or a dead connection) refreshes the map and retries until
``timeout`` seconds have passed. A put or remove returns (the partition update
counter) only when the cluster acknowledged it; an error raises.

A request that cannot fit in one frame is refused with ``TooLarge`` before anything
is sent (:meth:`node.wire.Channel.call`), not retried.
"""
from __future__ import annotations

import random
import time
from typing import Any, Iterable

from .assignment import partition_of
from .cluster_map import ClusterMap
from .errors import AuthFailed, NodeError, Unavailable
from .wire import Pool, as_bytes, load_secret

class Client:
    def __init__(self, addresses: str | Iterable[str], secret_file: str | None = None, *,
                 timeout: float = 30.0) -> None:
        self.seeds = [addresses] if isinstance(addresses, str) else list(addresses)
        if not self.seeds:
            raise ValueError("Client needs at least one node address")
        self.pool = Pool(load_secret(secret_file), role="client", timeout=10.0)
        self.timeout = timeout
        self.map: ClusterMap | None = None

    # -- map ----------------------------------------------------------------------
    def _addresses(self) -> list[str]:
        live = [m.address for m in self.map.members.values() if m.alive] if self.map else []
        return live + [s for s in self.seeds if s not in live]

    def refresh(self) -> ClusterMap:
        last: Exception | None = None
        for addr in self._addresses():
            try:
                m = ClusterMap.from_wire(self.pool.call(addr, "get_map", timeout=5.0))
            except AuthFailed:
                raise       # a wrong secret is not a reason to try elsewhere
            except NodeError as e:
                last = e
                continue
            if m.members and (self.map is None or m.epoch >= self.map.epoch):
                self.map = m
                return m
        if self.map is not None and last is None:
            return self.map
        raise Unavailable(f"no node of the cluster answers ({', '.join(self._addresses())}): {last}")

    def _call_primary(self, cache: str, key: bytes, method: str, **args: Any) -> Any:
        deadline = time.monotonic() + self.timeout
        hint: str | None = None
        redirected = False
        delay = 0.05
        while True:
            try:
                if self.map is None:
                    self.refresh()
                if cache not in self.map.caches:
                    raise NodeError(f"unknown cache {cache!r}; caches: {', '.join(self.map.caches)}")
                p = partition_of(key, self.map.caches[cache].partitions)
                addr = hint or self.map.address(self.map.primary(cache, p))
                hint = None
                if addr is None:
                    raise Unavailable(f"partition {cache}/{p} has no primary now")
                return self.pool.call(addr, method, cache=cache, key=key, **args)
            except NodeError as e:
                if not getattr(e, "retry", False) or time.monotonic() > deadline:
                    raise
                hint = getattr(e, "hint", None)
                if hint is not None and not redirected:
                    # a redirect to the new primary (a hand-off just ended): a move of the
                    # role, not a failure; go there at once, once, and back off after that
                    redirected = True
                else:
                    time.sleep(delay * (0.5 + random.random()))
                    delay = min(delay * 2, 0.5)
                try:
                    self.refresh()          # (after a redirect: the next puts go there directly)
                except NodeError:
                    pass

    # -- operations ---------------------------------------------------------------
    def put(self, cache: str, key: bytes | str, value: bytes | str) -> int:
        return self._call_primary(cache, as_bytes(key, "key"), "put", value=as_bytes(value, "value"))

    def put_many(self, cache: str, items: Iterable[tuple[bytes | str, bytes | str]], *,
                 batch: int = 256, max_bytes: int = 768 * 1024) -> int:
        """Bulk load: the pairs grouped by partition, one ``put_batch`` request per group
        of at most ``batch`` items / ``max_bytes`` bytes. Returns the number put. A batch
        that fails raises (some of its items may be applied; putting them again is safe)."""
        if self.map is None:
            self.refresh()
        parts = self.map.caches[cache].partitions if cache in self.map.caches else 1
        groups: dict[int, list[list[bytes]]] = {}
        sizes: dict[int, int] = {}
        n = 0
        for k, v in items:
            k, v = as_bytes(k, "key"), as_bytes(v, "value")
            p = partition_of(k, parts)
            g = groups.setdefault(p, [])
            if g and (len(g) >= batch or sizes[p] + len(k) + len(v) > max_bytes):
                self._call_primary(cache, g[0][0], "put_batch", items=g)
                n += len(g)
                g = groups[p] = []
                sizes[p] = 0
            g.append([k, v])
            sizes[p] = sizes.get(p, 0) + len(k) + len(v) + 16
        for g in groups.values():
            if g:
                self._call_primary(cache, g[0][0], "put_batch", items=g)
                n += len(g)
        return n

    def get(self, cache: str, key: bytes | str) -> bytes | None:
        return self._call_primary(cache, as_bytes(key, "key"), "get")

    def remove(self, cache: str, key: bytes | str) -> int:
        return self._call_primary(cache, as_bytes(key, "key"), "remove")

    def _everywhere(self, method: str, **args: Any) -> list[Any]:
        """Ask every live node (each answers for the partitions it leads)."""
        deadline = time.monotonic() + self.timeout
        while True:
            m = self.refresh()
            try:
                return [self.pool.call(mem.address, method, **args)
                        for mem in m.members.values() if mem.alive]
            except NodeError as e:
                if not getattr(e, "retry", False) or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def lookup(self, cache: str, index: str, value: Any) -> list[bytes]:
        out: set[bytes] = set()
        for keys in self._everywhere("lookup", cache=cache, index=index, value=value):
            out.update(keys)
        return sorted(out)

    def range(self, cache: str, index: str, lo: Any, hi: Any, limit: int | None = None) -> list[tuple[Any, bytes]]:
        rows = sorted({tuple(r) for part in self._everywhere("range", cache=cache, index=index,
                                                              lo=lo, hi=hi, limit=limit) for r in part})
        return rows[:limit] if limit else rows

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
