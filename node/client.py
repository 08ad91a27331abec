"""``node.Client``: the small Python client.

It fetches the cluster map from any reachable address, sends each put/get/remove to
the primary of the key's partition, and follows map changes: a ``not_primary`` or
``unavailable`` answer (or a dead connection) refreshes the map and retries until
``timeout`` seconds have passed. A put or remove returns (the partition update
counter) only when the cluster acknowledged it; an error raises.

**Writes cannot apply twice.** Each put, remove and put_batch carries a request id
(this client's random id, the write's sequence number, the lowest one still in
flight: :mod:`node.dedup`), the same on every retry of that write. So the client
retries an answer that says the write may have been applied (``outcome`` ``unknown``:
a replication that failed after the primary applied it, a reply lost after the
request left) as well as one that says it certainly was not (``refused``: not the
primary, its lease not valid, a connection that failed before the request left): the
primary that applied it answers with its first outcome. It does not retry a request
the cluster refused for good (bad request, too large, wrong secret). The error a write
finally raises says ``unknown`` if ANY attempt may have applied it, ``refused`` only
if none did.

**Reads** are linearizable by default: the primary answers only while its lease
holds, and only with acknowledged writes. ``get(..., consistency="stale")`` asks any
OWNING copy (starting with a random one): possibly older than the last acknowledged
write, and on a backup possibly a write not acknowledged yet (docs/node.md, "Reads").

A request that cannot fit in one frame is refused with ``TooLarge`` before anything
is sent (:meth:`node.wire.Channel.call`), not retried.
"""
from __future__ import annotations

import itertools
import random
import secrets
import threading
import time
from typing import Callable, Iterable, TypeVar

from transfer.tls import TlsContexts, TlsError, TlsFiles

from .assignment import partition_of
from .cluster_map import ClusterMap
from .config import CacheConfig
from .dedup import RequestId
from .errors import UNKNOWN, AuthFailed, BadRequest, NodeError, Unavailable
from .rpcapi import (LINEARIZABLE, METHODS, STALE, Get, Lookup, Put, PutBatch, Range, Remove, Req, Row,
                     fetch_map, fetch_map_page)
from .states import State
from .wire import Pool, as_bytes, load_secret

R = TypeVar("R")

class Client:
    """``tls`` (``transfer.tls.TlsFiles``: the cluster CA, a client certificate from
    ``ferry certs issue CA_DIR NAME --client`` and its key) authenticates by mutual TLS
    instead of the secret; each node's certificate must then name the member the map
    lists at its address."""

    def __init__(self, addresses: str | Iterable[str], secret_file: str | None = None, *,
                 timeout: float = 30.0, tls: TlsFiles | None = None) -> None:
        self.seeds = [addresses] if isinstance(addresses, str) else list(addresses)
        if not self.seeds:
            raise ValueError("Client needs at least one node address")
        if tls is not None:
            try:
                contexts = TlsContexts(tls)
            except TlsError as e:
                raise AuthFailed(e.reason) from None
            self.pool = Pool(b"", role="client", timeout=10.0, tls=contexts, expect=self._member_at)
        else:
            self.pool = Pool(load_secret(secret_file), role="client", timeout=10.0)
        self.timeout = timeout
        self._map: ClusterMap | None = None
        # the route pages held in ``_map`` and the epoch each was read at (None: the
        # whole map, read by refresh()); the caches outlive a map set to None
        self._pages: dict[int, int] | None = {}
        self._caches: dict[str, CacheConfig] | None = None
        self._map_lock = threading.Lock()
        self.id = secrets.token_hex(8)          # this client's part of every request id
        self._seq = itertools.count(1)
        self._in_flight: set[int] = set()       # sequence numbers of writes not returned
        self._seq_lock = threading.Lock()

    @property
    def map(self) -> ClusterMap | None:
        """The route table: the whole map after :meth:`refresh`, else the pages the
        requests so far needed. Setting it to None makes the next request read its
        page again."""
        return self._map

    @map.setter
    def map(self, m: ClusterMap | None) -> None:
        with self._map_lock:
            self._map = m
            self._pages = None if m is not None else {}
            if m is not None:
                self._caches = m.caches

    def _member_at(self, address: str) -> str | None:
        m = self._map
        return m.member_at(address) if m is not None else None

    # -- map ----------------------------------------------------------------------
    def _addresses(self) -> list[str]:
        live = [m.address for m in self.map.members.values() if m.alive] if self.map else []
        return live + [s for s in self.seeds if s not in live]

    def refresh(self, avoid: str | None = None) -> ClusterMap:
        """A map from the first node that answers with one at least as new as ours;
        ``avoid`` (a node that just answered ``unavailable``: its lease may have run
        out, its map too) is asked last."""
        last: Exception | None = None
        addrs = self._addresses()
        if avoid in addrs:
            addrs = [a for a in addrs if a != avoid] + [avoid]
        for addr in addrs:
            try:
                m = fetch_map(self.pool, addr)
            except AuthFailed:
                raise       # a wrong secret is not a reason to try elsewhere
            except NodeError as e:
                last = e
                continue
            held = self._map
            if m.members and (held is None or self._pages or m.epoch >= held.epoch):
                self.map = m
                return m
        if self.map is not None and last is None:
            return self.map
        raise Unavailable(f"no node of the cluster answers ({', '.join(self._addresses())}): {last}")

    # -- routes by page ----------------------------------------------------------------
    # A request needs one partition's record: the client reads the page of the map
    # that holds it (ROUTE_PAGE partitions, get_map(start, count)) when it first routes
    # a key there, and that page again after an answer that says the route is wrong
    # (not_primary, unavailable, a dead connection). No request reads the whole map,
    # so routing costs the same at 100,000 partitions as at 16.
    ROUTE_PAGE = 256

    def _page(self, caches: dict[str, CacheConfig], cache: str, p: int) -> int:
        base = 0
        for name, c in caches.items():
            if name == cache:
                break
            base += c.partitions
        return (base + p) // self.ROUTE_PAGE

    def _route(self, cache: str, key: bytes) -> tuple[ClusterMap, int]:
        """The map to route ``key`` of ``cache`` by, holding the page of its partition,
        and that partition."""
        m = self._map
        caches = m.caches if m is not None else self._caches
        if caches is None:
            m = self._load_page(0)
            caches = m.caches
        if cache not in caches:
            raise NodeError(f"unknown cache {cache!r}; caches: {', '.join(caches)}")
        p = partition_of(key, caches[cache].partitions)
        page = self._page(caches, cache, p)
        if m is None or (self._pages is not None and page not in self._pages):
            m = self._load_page(page)
        return m, p

    def _load_page(self, page: int, avoid: str | None = None) -> ClusterMap:
        """Route page ``page`` from the first node that answers with it at least as
        new as the one held (``avoid`` asked last); the map held if none is newer."""
        last: Exception | None = None
        addrs = self._addresses()
        if avoid in addrs:
            addrs = [a for a in addrs if a != avoid] + [avoid]
        for addr in addrs:
            with self._map_lock:
                held, pages = self._map, self._pages
            into = held if held is not None and held.caches == self._caches else None
            min_epoch = 0
            if into is not None:
                min_epoch = into.epoch if pages is None else pages.get(page, 0)
            try:
                m = fetch_map_page(self.pool, addr, page * self.ROUTE_PAGE, self.ROUTE_PAGE,
                                   into=into, min_epoch=min_epoch)
            except AuthFailed:
                raise
            except NodeError as e:
                last = e
                continue
            if m is None:
                continue
            with self._map_lock:
                if into is None:
                    self._map, self._pages, self._caches = m, {}, m.caches
                if self._pages is not None:
                    self._pages[page] = m.epoch
            return m
        if self._map is not None and last is None:
            return self._map
        raise Unavailable(f"no node of the cluster answers ({', '.join(self._addresses())}): {last}")

    def _call_primary(self, cache: str, key: bytes, method: str, **args: object) -> object:
        """A request by method name (``put``, ``put_batch``, ``get``, ``remove``) to the
        primary of ``key``: its arguments checked by the method's request class
        (node/rpcapi.py), BadRequest before anything is sent when they do not decode."""
        spec = METHODS.get(method)
        if spec is None:
            raise BadRequest(f"unknown method {method!r}")
        return self._on_primary(cache, key, spec.request.from_wire({"cache": cache, "key": key, **args}))

    def _on_primary(self, cache: str, key: bytes, req: Req[R]) -> R:
        return self._retrying(cache, key, req, lambda m, p: [m.address(m.primary(cache, p))])

    def _retrying(self, cache: str, key: bytes, req: Req[R],
                  where: Callable[[ClusterMap, int], list[str | None]]) -> R:
        """``req`` at the first of ``where(map, p)`` (the primary; every OWNING copy
        for a stale read), retried as the class doc says until ``timeout``. The error
        finally raised says ``unknown`` if any attempt may have taken effect."""
        deadline = time.monotonic() + self.timeout
        hint: str | None = None
        redirected = False
        delay = 0.05
        maybe = False
        while True:
            addr: str | None = None
            page: int | None = None
            try:
                cmap, p = self._route(cache, key)
                page = self._page(cmap.caches, cache, p)
                addr = hint or next(iter(a for a in where(cmap, p) if a), None)
                hint = None
                if addr is None:
                    raise Unavailable(f"partition {cache}/{p} has no "
                                      f"{'OWNING copy' if isinstance(req, Get) and req.consistency == STALE else 'primary'} now")
                return self.pool.request(addr, req)
            except NodeError as e:
                maybe = maybe or e.outcome == UNKNOWN
                if not getattr(e, "retry", False) or time.monotonic() > deadline:
                    if maybe:
                        e.maybe_applied()
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
                    # the partition's page again (after a redirect: the next puts go
                    # there directly); a node that answered unavailable is asked last
                    if page is not None:
                        self._load_page(page, avoid=addr if isinstance(e, Unavailable) else None)
                except NodeError:
                    pass

    def _write(self, cache: str, key: bytes, make: Callable[[RequestId], Req[R]]) -> R:
        """A write with a request id, the same on every retry."""
        with _InFlight(self) as rid:
            return self._on_primary(cache, key, make(rid))

    # -- operations ---------------------------------------------------------------
    def put(self, cache: str, key: bytes | str, value: bytes | str) -> int:
        k, v = as_bytes(key, "key"), as_bytes(value, "value")
        return self._write(cache, k, lambda rid: Put(cache, k, v, rid))

    def put_many(self, cache: str, items: Iterable[tuple[bytes | str, bytes | str]], *,
                 batch: int = 256, max_bytes: int = 768 * 1024) -> int:
        """Bulk load: the pairs grouped by partition, one ``put_batch`` request per group
        of at most ``batch`` items / ``max_bytes`` bytes. Returns the number put. A batch
        that fails raises (some of its items may be applied; putting them again is safe)."""
        caches = self._caches if self._caches is not None else self._load_page(0).caches
        parts = caches[cache].partitions if cache in caches else 1
        groups: dict[int, list[tuple[bytes, bytes]]] = {}
        sizes: dict[int, int] = {}
        n = 0
        for k, v in items:
            k, v = as_bytes(k, "key"), as_bytes(v, "value")
            p = partition_of(k, parts)
            g = groups.setdefault(p, [])
            if g and (len(g) >= batch or sizes[p] + len(k) + len(v) > max_bytes):
                self._put_batch(cache, g)
                n += len(g)
                g = groups[p] = []
                sizes[p] = 0
            g.append((k, v))
            sizes[p] = sizes.get(p, 0) + len(k) + len(v) + 16
        for g in groups.values():
            if g:
                self._put_batch(cache, g)
                n += len(g)
        return n

    def _put_batch(self, cache: str, items: list[tuple[bytes, bytes]]) -> None:
        batch = tuple(items)
        self._write(cache, batch[0][0], lambda rid: PutBatch(cache, batch[0][0], batch, rid))

    def get(self, cache: str, key: bytes | str, consistency: str = LINEARIZABLE) -> bytes | None:
        """The value of ``key`` (None: absent). ``linearizable`` (default): from the
        primary, reflecting every write acknowledged before the call. ``stale``: from
        any OWNING copy, possibly older (see the module doc)."""
        key = as_bytes(key, "key")
        if consistency == LINEARIZABLE:
            return self._on_primary(cache, key, Get(cache, key))
        if consistency != STALE:
            raise ValueError(f"consistency must be {LINEARIZABLE!r} or {STALE!r}, not {consistency!r}")

        def owners(m: ClusterMap, p: int) -> list[str | None]:
            nodes = m.holders(cache, p, State.OWNING)
            random.shuffle(nodes)
            return [m.address(n) for n in nodes]
        return self._retrying(cache, key, Get(cache, key, STALE), owners)

    def remove(self, cache: str, key: bytes | str) -> int:
        k = as_bytes(key, "key")
        return self._write(cache, k, lambda rid: Remove(cache, k, rid))

    def _everywhere(self, req: Req[R]) -> list[R]:
        """Ask every live node (each answers for the partitions it leads)."""
        deadline = time.monotonic() + self.timeout
        while True:
            m = self._load_page(0)      # the members, with the first page
            try:
                return [self.pool.request(mem.address, req) for mem in m.members.values() if mem.alive]
            except NodeError as e:
                if not getattr(e, "retry", False) or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def lookup(self, cache: str, index: str, value: object) -> list[bytes]:
        out: set[bytes] = set()
        for keys in self._everywhere(Lookup(cache, index, value)):
            out.update(keys)
        return sorted(out)

    def range(self, cache: str, index: str, lo: object, hi: object, limit: int | None = None) -> list[Row]:
        """``(value, key)`` rows with ``lo <= value < hi``, in order, from every node."""
        found: set[Row] = {r for part in self._everywhere(Range(cache, index, lo, hi, limit)) for r in part}
        rows: list[Row] = sorted(found)  # type: ignore[type-var]  # the values of one index compare
        return rows[:limit] if limit else rows

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _InFlight:
    """One write's request id for as long as the call runs: ``[client, seq, low]``,
    ``low`` the oldest sequence number of this client still in flight (its own at
    most). Once the call returns or raises, its number leaves the set: a late copy of
    it then falls below the ``low`` of the client's next writes and is refused."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def __enter__(self) -> RequestId:
        c = self.client
        with c._seq_lock:
            self.seq = next(c._seq)
            c._in_flight.add(self.seq)
            low = min(c._in_flight)
        return RequestId(c.id, self.seq, low)

    def __exit__(self, *exc: object) -> None:
        with self.client._seq_lock:
            self.client._in_flight.discard(self.seq)
