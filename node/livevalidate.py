"""The node's part in live validation (``ferry validate --cluster``, docs/validation.md).

A validator compares the in-sync copies of one partition at ONE update counter. It
asks the partition's primary for a *validation fence*:

``validate_fence(cache, p, term)``
    Only the current primary, for its current term (the term the validator read in
    the map), holding p OWNING with a valid lease and no hand-off fence, grants it.
    Under the partition lock (so no write is half-replicated) it stops taking writes
    of p for at most ``FENCE_LEASE_S`` and answers the counter C, the in-sync set and
    the in-sync copies' transfer addresses. A write is acknowledged only once every
    in-sync copy applied it, so each in-sync copy then holds exactly C.
``validate_unfence(cache, p, token)``
    Lifts that fence (never another one: a hand-off fence taken meanwhile stays) and
    answers whether it was still in force: when it was, every snapshot the validator
    opened before asking was opened at C.

The fence is a lease, like the primary's own: a validator that dies leaves p fenced
for ``FENCE_LEASE_S`` at most; writes meanwhile are refused with ``not_primary`` and
the client retries (docs/node.md), so a validation costs foreground writes a short
retry, never an error.

``debug_set(cache, p, key, value)`` changes this node's copy of a key through its
store, behind replication (the store's ``apply`` at the next counter): the test knob
that makes a replica diverge on a running cluster. It exists only when the node was
started with ``FERRY_DEBUG_RPC=1`` in its environment (off by default; like
``FERRY_CRASH``, a test switch, never a setting of a production node).
"""
from __future__ import annotations

import os
import secrets
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from .cluster_map import PartRecord
from .errors import BadRequest, NotPrimary, Unavailable
from .rpcapi import Fence
from .storage import CacheData

# Long enough for every in-sync owner to open its snapshot (a flush of the partition's
# pages, milliseconds to a few hundred on a slow disk), short enough that a validator
# that died stalls writes of one partition only briefly.
FENCE_LEASE_S = 2.0
DEBUG_ENV = "FERRY_DEBUG_RPC"

PartKey = tuple[str, int]

if TYPE_CHECKING:
    from .context import Fences, NodeContext


@dataclass
class LiveValidation:
    """The validation fence of one node. Built from what it needs, nothing more:

    ``plock``: the partition lock; ``record``: the map's record of p (primary, isr,
    term); ``leads``: this node may take writes of p now (primary, OWNING, lease valid,
    no fence); ``counter``: p's update counter; ``fenced``: the node's write fences
    (partition -> monotonic deadline), shared with the hand-off; ``transfer_address``:
    a member's file supplier; ``data``: the caches (for the debug knob only)."""
    node_id: str
    plock: Callable[[str, int], threading.RLock]
    record: Callable[[str, int], PartRecord]
    leads: Callable[[str, int], bool]
    counter: Callable[[str, int], int]
    fenced: Fences
    transfer_address: Callable[[str], str | None]
    data: dict[str, CacheData]
    debug: bool = False

    def __post_init__(self) -> None:
        self._tokens: dict[PartKey, tuple[str, float]] = {}
        # RPC method name -> handler, for the node's dispatch (nodes-only role); built
        # once: the dispatch consults it on every request
        self.handlers: dict[str, Callable[..., object]] = {"validate_fence": self.fence,
                                                           "validate_unfence": self.unfence}
        if self.debug:
            self.handlers["debug_set"] = self.debug_set

    @classmethod
    def of(cls, ctx: "NodeContext", leads: Callable[[str, int], bool]) -> "LiveValidation":
        """The node's: ``leads`` is the update path's (may p take writes now)."""
        def transfer_address(node: str) -> str | None:
            with ctx.map.lock:
                return ctx.map.map.transfer_address(node)
        return cls(ctx.id, ctx.plock, ctx.map.record, leads,
                   lambda c, p: ctx.data[c].counter(p), ctx.repl.fenced, transfer_address,
                   ctx.data, cls.debug_enabled())

    @classmethod
    def debug_enabled(cls) -> bool:
        return os.environ.get(DEBUG_ENV) == "1"

    def _check(self, cache: str, p: int) -> None:
        """(the types are checked by the request's decoder, node/rpcapi.py)"""
        if cache not in self.data:
            raise BadRequest(f"unknown cache {cache!r}")
        if not 0 <= p < self.data[cache].cache.partitions:
            raise BadRequest(f"partition {p!r} is out of range for cache {cache!r}")

    def fence(self, cache: str, p: int, term: int) -> Fence:
        self._check(cache, p)
        with self.plock(cache, p):
            rec = self.record(cache, p)
            if rec.primary != self.node_id or rec.term != term:
                raise NotPrimary(f"node {self.node_id} is not the primary of {cache}/{p} at term "
                                 f"{term} (primary {rec.primary or 'none'}, term {rec.term}); "
                                 "re-read the map")
            if not self.leads(cache, p):
                # fenced by a hand-off, lease not valid, or not OWNING: try again later
                raise Unavailable(f"{cache}/{p} on {self.node_id} cannot be fenced now (a hand-off "
                                  "in progress, its lease not valid, or not OWNING); retry")
            deadline = time.monotonic() + FENCE_LEASE_S
            token = secrets.token_hex(8)
            self.fenced.set((cache, p), deadline)
            self._tokens[(cache, p)] = (token, deadline)
            return Fence(token=token, counter=self.counter(cache, p), term=rec.term, epoch=rec.epoch,
                         lease_s=FENCE_LEASE_S, isr=tuple(rec.isr),
                         transfer={n: self.transfer_address(n) or "" for n in rec.isr})

    def unfence(self, cache: str, p: int, token: str) -> bool:
        """True when the fence ``token`` names was still in force (not expired)."""
        self._check(cache, p)
        with self.plock(cache, p):
            mine = self._tokens.get((cache, p))
            if mine is None or mine[0] != token:
                return False
            del self._tokens[(cache, p)]
            deadline = mine[1]
            self.fenced.lift((cache, p), deadline)   # unless replaced by a hand-off fence
            return time.monotonic() < deadline

    def debug_set(self, cache: str, p: int, key: bytes, value: bytes | None) -> int:
        """Change this copy only (no replication), at the next counter of this copy."""
        self._check(cache, p)
        with self.plock(cache, p):
            c = self.counter(cache, p) + 1
            self.data[cache].store.apply(p, key, value, c)
            return c


__all__ = ["LiveValidation", "FENCE_LEASE_S", "DEBUG_ENV"]
