"""The cluster driver's clients: every operation (write or read) through one node's
view of the map, and the read check after the run settled.

Each operation belongs to one node (``route``: by the writer and the operation's
position, from the seed alone), and goes through a ``node.Client`` seeded with that
node first whose map is dropped before each operation: the map comes from that node,
so a node cut off from the others (its map stale, itself still primary there) is
tried -- the minority side is exercised, and must not acknowledge. When it refuses
(``not_primary``, ``unavailable``) the client refreshes from the live members and
retries within ``WRITE_TIMEOUT_S``; a node that is down is skipped for the next seed.
A write that raised is "not acknowledged" (it may or may not be there); one that
returned is acknowledged with the partition counter the node replied. Reads go the same
way (linearizable ``get``: the primary in that node's view, then wherever the client's
retries lead). Every read of the final check enters the run's history too (process
``final-<node>``), so the linearizability check also covers the end state.

:class:`WriteStats` counts, per node, the writes it routed, and the puts/removes that
node itself refused by error code (``unavailable`` from a primary whose lease is not
valid or which could not shrink its in-sync set, ``not_primary`` ...): the run's
record that the minority side was tried.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable

from ..history import READ, History
from ..workload import Model, Op, Receipt

if TYPE_CHECKING:
    from transfer.tls import TlsFiles

WRITE_TIMEOUT_S = 8.0      # a new primary is up about 1 lease TTL after its predecessor died
CALL_TIMEOUT_S = 8.0       # one RPC (the node's own replication timeout is 5 s)
SLOW_S = 1.0


def route(nodes: list[str], op: Op, up: set[str] | None = None, pinned: bool = False) -> str:
    """The node whose view routes ``op``: spread over every node of the scenario, or
    (``pinned``) always the same one per process, as a client that knows one node; a
    node not running (not joined yet, killed, left) passes its turn to the next one up
    (a cut-off node is running: it keeps its turn)."""
    i = (op.writer if pinned else op.seq + op.writer) % len(nodes)
    for k in range(len(nodes)):
        n = nodes[(i + k) % len(nodes)]
        if up is None or n in up:
            return n
    return nodes[i]


class WriteStats:
    """Per node: writes routed through its view, and its own refusals by error code."""

    def __init__(self) -> None:
        self.routed: Counter[str] = Counter()
        self.refused: dict[str, Counter[str]] = {}
        self.slow: Counter[str] = Counter()          # writes that took > SLOW_S
        self.longest: dict[str, float] = {}
        self._lock = threading.Lock()

    def count(self, node: str, seconds: float = 0.0) -> None:
        with self._lock:
            self.routed[node] += 1
            if seconds > SLOW_S:
                self.slow[node] += 1
            self.longest[node] = max(self.longest.get(node, 0.0), seconds)

    def refusal(self, node: str, code: str) -> None:
        with self._lock:
            self.refused.setdefault(node, Counter())[code] += 1

    def summary(self) -> str:
        with self._lock:
            return "; ".join(
                f"{n}: {k} routed (slowest {self.longest.get(n, 0):.1f}s, {self.slow[n]} over "
                f"{SLOW_S:.0f}s)" + (", refused by itself " + ", ".join(
                    f"{c} {code}" for code, c in sorted(self.refused[n].items())) if n in self.refused else "")
                for n, k in sorted(self.routed.items()))


class NodeClients:
    """One ``node.Client`` per node for one writer (one thread); ``apply`` returns the
    counter, the routing node and the node that acknowledged. ``addresses()`` and
    ``advertised()`` are asked at each write: a node started again on another port
    (its first port was taken) gets a new client."""

    def __init__(self, nodes: list[str], addresses: Callable[[], dict[str, str]], secret_file: str,
                 cache: str, stats: WriteStats | None = None,
                 advertised: Callable[[], dict[str, str]] | None = None,
                 up: Callable[[], set[str]] | None = None, pinned: bool = False,
                 tls: "TlsFiles | None" = None) -> None:
        """``tls``: the clients' certificate (mutual TLS) instead of ``secret_file``."""
        self.nodes = list(nodes)
        self.tls = tls
        self.up = up
        self.pinned = pinned
        self.addresses, self.advertised = addresses, advertised or addresses
        self.secret_file, self.cache = secret_file, cache
        self.stats = stats or WriteStats()
        self.clients: dict[str, tuple[str, Any]] = {}     # node -> (its address, client)
        self.names: dict[str, str] = {}                  # any address of a node -> node
        self.answered = ""          # the node that answered this writer's last put/remove/get
        self.routed = ""            # the node whose view routed it

    def _client(self, node: str) -> Any:
        from node import Client
        addrs, adv = self.addresses(), self.advertised()
        have = self.clients.get(node)
        if have is not None and have[0] == addrs[node]:
            return have[1]
        if have is not None:
            have[1].close()
        self.names.update({a: n for n, a in adv.items()} | {a: n for n, a in addrs.items()})
        others = [a for m, a in addrs.items() if m != node]
        c = Client([addrs[node], *others], secret_file=self.secret_file, timeout=WRITE_TIMEOUT_S,
                   tls=self.tls)
        c.pool.timeout = CALL_TIMEOUT_S
        # the node's own refusals: the map names its advertised address, seeds the listen one
        c.pool.call = self._counting(node, {addrs[node], adv.get(node, addrs[node])}, c.pool.call)
        self.clients[node] = (addrs[node], c)
        return c

    def _counting(self, node: str, addrs: set[str], call: Any) -> Any:
        """``Pool.call`` that notes the node's own refusals of a put/remove."""
        from node import NodeError

        def counted(address: str, method: str, /, timeout: float | None = None, **args: Any) -> Any:
            try:
                out = call(address, method, timeout=timeout, **args)
                if method in ("put", "remove", "get"):
                    self.answered = self.names.get(address, address)
                return out
            except NodeError as e:
                if address in addrs and method in ("put", "remove"):
                    self.stats.refusal(node, getattr(e, "code", type(e).__name__))
                raise
        return counted

    def apply(self, op: Op) -> Receipt:
        node = route(self.nodes, op, self.up() if self.up else None, self.pinned)
        c = self._client(node)
        c.map = None            # this node's view: the map is fetched from it first
        self.routed, self.answered = node, ""
        t0 = time.monotonic()
        try:
            if op.value is None:
                counter = c.remove(self.cache, op.key)
            else:
                counter = c.put(self.cache, op.key, op.value)
            return Receipt(counter, node, self.answered)
        finally:
            self.stats.count(node, time.monotonic() - t0)

    def read(self, op: Op) -> bytes | None:
        """A linearizable read of ``op.key`` through the view of the node ``route`` picks."""
        node = route(self.nodes, op, self.up() if self.up else None, self.pinned)
        c = self._client(node)
        c.map = None
        self.routed, self.answered = node, ""
        return c.get(self.cache, op.key)

    def via(self) -> str:
        """Where the last operation went: the routing node, and the one that answered."""
        if self.answered and self.answered != self.routed:
            return f"{self.routed}>{self.answered}"
        return self.routed

    def close(self) -> None:
        for _, c in self.clients.values():
            c.close()


def verify_reads(addresses: dict[str, str], secret_file: str, cache: str, model: Model,
                 history: History | None = None, *, tls: "TlsFiles | None" = None) -> list[str]:
    """Through each node's client, every key the workload wrote reads as its last
    acknowledged value (or a later unacknowledged one; absent after a remove). Each
    read enters ``history`` (process ``final-<node>``)."""
    from node import Client
    problems: list[str] = []
    for n, addr in addresses.items():
        others = [a for m, a in addresses.items() if m != n]
        with Client([addr, *others], secret_file=secret_file, timeout=WRITE_TIMEOUT_S, tls=tls) as c:
            bad = 0
            for key in sorted(model.keys()):
                h = history.invoke(f"final-{n}", READ, key, via=n) if history is not None else None
                try:
                    found = c.get(cache, key)
                except Exception as e:  # noqa: BLE001 - a read that fails is the finding
                    why: str | None = f"{key!r}: read failed: {type(e).__name__}: {str(e)[:160]}"
                    if h is not None:
                        history.failed(h, e)
                else:
                    why = model.check(key, found)
                    if h is not None:
                        history.ok(h, found)
                if why:
                    bad += 1
                    if bad <= 10:
                        problems.append(f"through {n}: {why}")
            if bad > 10:
                problems.append(f"through {n}: ... and {bad - 10} more")
    return problems
