"""The coordinator's side of membership: the oldest live member keeps the map.

It admits joins, records graceful leaves, merges state reports, moves primaries on
hand-off, and declares a member failed when its heartbeats stop for
``failure_timeout_s``. Every change bumps ``epoch`` (and ``version`` when membership
changed) and is pushed to all live members by ``publish``. A member that stops hearing
the coordinator for the same timeout marks it failed in its own copy; the next oldest
live member then takes over with a higher version (see :meth:`take_over`).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from .cluster_map import ClusterMap, Member
from .errors import BadRequest, ConfigError
from .states import State

log = logging.getLogger("ferry.node.coordinator")


class Coordinator:
    def __init__(self, me: str, cmap: ClusterMap, lock: threading.RLock,
                 publish: Callable[[], None], failure_timeout: float) -> None:
        self.me = me
        self.map = cmap              # shared with the node; guarded by ``lock``
        self.lock = lock
        self.publish = publish
        self.failure_timeout = failure_timeout
        self.last_seen: dict[str, float] = {}

    def _changed(self, membership: bool, why: str) -> None:
        if membership:
            self.map.version += 1
        self.map.choose_primaries()
        self.map.epoch += 1
        log.info("stage=map version=%d epoch=%d: %s", self.map.version, self.map.epoch, why)

    def take_over(self, dead: list[str]) -> None:
        """Become coordinator after the previous one (and ``dead``) stopped answering."""
        with self.lock:
            for n in dead:
                if n in self.map.members:
                    self.map.members[n].alive = False
            now = time.monotonic()
            self.last_seen = {n: now for n in self.map.alive()}
            self._changed(True, f"{self.me} takes over as coordinator; failed: {', '.join(dead)}")
        self.publish()

    # -- requests -----------------------------------------------------------------
    def join(self, node: str, address: str, boot: str, caches: list[dict[str, Any]],
             report: dict[str, Any], transfer: str = "") -> dict[str, Any]:
        with self.lock:
            mine = [c.to_wire() for c in self.map.caches.values()]
            if sorted(caches, key=lambda c: c["name"]) != sorted(mine, key=lambda c: c["name"]):
                raise ConfigError(f"node {node} has a different cache layout than the cluster "
                                  f"({caches} != {mine}); caches must match on every node")
            for m in self.map.members.values():
                if m.address == address and m.id != node and m.alive:
                    raise BadRequest(f"address {address} is already used by live node {m.id}")
            old = self.map.members.get(node)
            order = 1 + max((m.order for m in self.map.members.values()), default=0)
            if old is not None and old.alive and old.boot == boot:
                return self.map.to_wire()  # a retried join
            self.map.members[node] = Member(node, address, order, True, False, boot, transfer)
            self._merge(node, report)
            self.last_seen[node] = time.monotonic()
            self._changed(True, f"node {node} joined at {address}" + (" (restarted)" if old else ""))
            out = self.map.to_wire()
        self.publish()
        return out

    def leave(self, node: str) -> None:
        with self.lock:
            m = self.map.members.get(node)
            if m is None or m.leaving:
                return
            m.leaving = True
            self._changed(True, f"node {node} is leaving gracefully")
        self.publish()

    def leave_done(self, node: str) -> None:
        with self.lock:
            if node not in self.map.members:
                return
            del self.map.members[node]
            for cache in self.map.states:
                for p, st in enumerate(self.map.states[cache]):
                    st.pop(node, None)
                    self.map.stale[cache][p].discard(node)
                    self.map.counters[cache][p].pop(node, None)
            self._changed(True, f"node {node} left")
        self.publish()

    def report(self, node: str, boot: str, report: dict[str, Any]) -> bool:
        with self.lock:
            m = self.map.members.get(node)
            if m is None or not m.alive or m.boot != boot:
                return False  # the node must join (again) first
            self.last_seen[node] = time.monotonic()
            if not self._merge(node, report):
                return True
            self._changed(False, f"states reported by {node}")
        self.publish()
        return True

    def heartbeat(self, node: str, boot: str) -> bool:
        with self.lock:
            m = self.map.members.get(node)
            if m is None or not m.alive or m.boot != boot:
                return False
            self.last_seen[node] = time.monotonic()
            return True

    def pin(self, plan: str, moves: list[dict[str, Any]]) -> int:
        """A plan: each named partition gets exactly the named owners (primary first).
        All or nothing: any bad entry refuses the whole plan. Returns the new epoch."""
        with self.lock:
            placeable = set(self.map.placeable())
            staged: list[tuple[str, int, list[str]]] = []
            for i, mv in enumerate(moves):
                cache, p, to = mv["cache"], mv["partition"], mv["to"]
                cc = self.map.caches.get(cache)
                if cc is None:
                    raise BadRequest(f"plan {plan}: moves[{i}]: unknown cache {cache!r}")
                if not 0 <= p < cc.partitions:
                    raise BadRequest(f"plan {plan}: moves[{i}]: cache {cache} has partitions "
                                     f"0..{cc.partitions - 1}, not {p}")
                if len(to) != cc.backups + 1 or len(set(to)) != len(to):
                    raise BadRequest(f"plan {plan}: moves[{i}]: 'to' must name {cc.backups + 1} "
                                     f"different nodes (backups + 1), got {to}")
                bad = [n for n in to if n not in placeable]
                if bad:
                    raise BadRequest(f"plan {plan}: moves[{i}]: {', '.join(bad)} not a live member")
                staged.append((cache, p, list(to)))
            for cache, p, to in staged:
                self.map.pins[cache][p] = to
            self._changed(False, f"plan {plan}: {len(staged)} partition(s) reassigned")
            epoch = self.map.epoch
        self.publish()
        return epoch

    def set_primary(self, cache: str, p: int, node: str, previous: str | None) -> bool:
        with self.lock:
            if self.map.primaries[cache][p] != previous:
                return False
            if self.map.states[cache][p].get(node) != State.OWNING.value:
                return False
            self.map.primaries[cache][p] = node
            self.map.epoch += 1
            log.info("stage=handoff cache=%s partition=%d primary %s -> %s epoch=%d",
                     cache, p, previous, node, self.map.epoch)
        self.publish()
        return True

    def _merge(self, node: str, report: dict[str, Any]) -> bool:
        """Replace what ``node`` holds by its report {cache: {p: [state, counter, stale]}}."""
        changed = False
        for cache, parts in report.items():
            if cache not in self.map.states:
                continue
            seen = set()
            for ps, (state, counter, stale) in parts.items():
                p = int(ps)
                seen.add(p)
                st, sl = self.map.states[cache][p], self.map.stale[cache][p]
                if st.get(node) != state or (node in sl) != bool(stale):
                    changed = True
                st[node] = state
                self.map.counters[cache][p][node] = int(counter)
                (sl.add if stale else sl.discard)(node)
            for p, st in enumerate(self.map.states[cache]):
                if p not in seen and node in st:
                    del st[node]
                    self.map.stale[cache][p].discard(node)
                    changed = True
        return changed

    # -- failure detection --------------------------------------------------------
    def check_failures(self) -> None:
        now = time.monotonic()
        with self.lock:
            dead = [n for n in self.map.alive() if n != self.me
                    and now - self.last_seen.setdefault(n, now) > self.failure_timeout]
            if not dead:
                return
            for n in dead:
                self.map.members[n].alive = False
            self._changed(True, f"node(s) {', '.join(dead)} failed (no heartbeat for "
                                f"{self.failure_timeout:.1f}s)")
        self.publish()
