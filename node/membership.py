"""The member's side of membership: join, heartbeats, coordinator take-over, adopting
maps, reporting partition states, and the reconcile loop that acts on each map.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

from faults import crashpoint, fileio

from .cluster_map import ClusterMap, Member
from .coordinator import Coordinator
from .errors import ConfigError, NodeError, Unavailable
from .states import State

log = logging.getLogger("ferry.node.membership")
CLUSTER_FILE = "cluster.json"      # last known members, to find the cluster after a restart
REPORT_COALESCE_S = 0.02           # a state change is reported this soon (bursts coalesce)


class Membership:
    # -- map ----------------------------------------------------------------------
    def adopt(self, wire: dict[str, Any]) -> bool:
        new = ClusterMap.from_wire(wire)
        with self.map_lock:
            if new.epoch <= self.map.epoch and self.map.members:
                return False
            membership_changed = new.version != self.map.version
            self.map = new
            self._suspects.clear()       # a newer map names the coordinator to try
            if self.coord is not None:
                self.coord.map = new
            if new.coordinator == self.id and self.coord is None:
                self._become_coordinator()
            elif new.coordinator != self.id:
                self.coord = None
        if membership_changed:
            self._save_cluster()
        self.wake()
        return True

    def _become_coordinator(self) -> None:
        self.coord = Coordinator(self.id, self.map, self.map_lock, self.publish,
                                 self.cfg.failure_timeout_s)
        now = time.monotonic()
        self.coord.last_seen = {n: now for n in self.map.alive()}
        log.info("stage=membership node=%s is coordinator (version %d)", self.id, self.map.version)

    def _save_cluster(self) -> None:
        with self.map_lock:
            version = self.map.version
            doc = {"version": version,
                   "members": {m.id: m.address for m in self.map.members.values()}}
        with self._save_lock:   # publisher and heartbeat threads both save; one temp file
            if getattr(self, "_saved_version", None) == version:
                return
            fileio.atomic_write(os.path.join(self.cfg.data, CLUSTER_FILE), json.dumps(doc).encode())
            self._saved_version = version

    def _known_peers(self) -> list[str]:
        peers = list(self.cfg.join)
        try:
            with open(os.path.join(self.cfg.data, CLUSTER_FILE)) as f:
                peers += [a for n, a in json.load(f)["members"].items() if n != self.id]
        except (OSError, ValueError, KeyError):
            pass
        return [a for i, a in enumerate(peers) if a not in peers[:i] and a != self.cfg.address]

    def publish(self) -> None:
        """Coordinator: push the current map to every live member (coalesced, async)."""
        self._publish_event.set()

    def _publisher(self) -> None:
        while not self.stopping.is_set():
            self._publish_event.wait(1.0)
            if self.stopping.is_set():
                return
            self._publish_event.clear()
            if self.coord is None:
                continue
            with self.map_lock:
                wire = self.map.to_wire()
                targets = [(m.id, m.address) for m in self.map.members.values()
                           if m.alive and m.id != self.id]
            self.wake()
            self._save_cluster()
            for node, addr in targets:
                threading.Thread(target=self._push, args=(addr, wire), daemon=True).start()

    def _push(self, addr: str, wire: dict[str, Any]) -> None:
        try:
            self.pool.call(addr, "map", timeout=3.0, map=wire)
        except NodeError:
            pass  # the member catches up by its heartbeat

    def refresh_map(self) -> None:
        if self.coord is not None:
            return
        try:
            self.adopt(self.call_coordinator("get_map"))
        except NodeError:
            pass

    def call_coordinator(self, method: str, **args: Any) -> Any:
        if self.coord is not None:
            return getattr(self, "op_" + method)(**args)
        with self.map_lock:
            addr = self.map.address(self.map.coordinator)
        if addr is None:
            raise Unavailable("no coordinator known")
        return self.pool.call(addr, method, timeout=5.0, **args)

    # -- join ---------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        # every cache present, even with nothing held: the coordinator replaces what the
        # node holds per cache, so a cache left out would keep its last states forever
        out: dict[str, Any] = {cache: {} for cache in self.data}
        for (cache, p), s in self.states.items():
            if s in (State.OWNING, State.MOVING, State.RENTING, State.LOST):
                cnt = self.data[cache].counter(p) if s == State.OWNING else 0
                out.setdefault(cache, {})[str(p)] = [s.value, cnt, (cache, p) in self.stale]
        return out

    def join_cluster(self) -> None:
        peers = self._known_peers()
        caches = [c.to_wire() for c in self.cfg.caches]
        deadline = time.monotonic() + max(10.0, 4 * self.cfg.failure_timeout_s)
        while peers and not self.stopping.is_set():
            for addr in list(peers):
                for _hop in range(4):   # follow redirects to the coordinator
                    try:
                        r = self.pool.call(addr, "join", timeout=10.0, node=self.id, address=self.cfg.address,
                                           boot=self.boot, caches=caches, report=self.report(),
                                           transfer=self.transfer_address)
                    except ConfigError:
                        raise
                    except NodeError as e:
                        log.info("stage=join via %s failed: %s", addr, e)
                        break
                    if "redirect" in r:
                        if r["redirect"] == self.cfg.address and self._resume_coordination(addr):
                            return
                        addr = r["redirect"]
                        continue
                    self.adopt(r["map"])
                    log.info("stage=join node=%s joined (version %d, coordinator %s)",
                             self.id, self.map.version, self.map.coordinator)
                    return
            if time.monotonic() > deadline:
                if self.cfg.join and not self._been_member():
                    raise Unavailable(f"cannot reach the cluster at {', '.join(self.cfg.join)}")
                break
            self.stopping.wait(0.5)
        self._bootstrap()

    def _resume_coordination(self, peer: str) -> bool:
        """The members still take this node for their coordinator: it restarted within
        the failure timeout. Take their map (its epoch and primaries are ahead of what
        this node saved) and coordinate from it, instead of bootstrapping a cluster at
        an older epoch that the members' maps and hand-offs would disagree with."""
        try:
            new = ClusterMap.from_wire(self.pool.call(peer, "get_map", timeout=5.0))
        except NodeError as e:
            log.info("stage=join cannot read the members' map from %s: %s", peer, e)
            return False
        if new.coordinator != self.id or self.id not in new.members:
            return False
        me = new.members[self.id]
        me.alive, me.boot, me.address, me.transfer = True, self.boot, self.cfg.address, self.transfer_address
        with self.map_lock:
            self.map = new
            self._become_coordinator()
            self.coord._merge(self.id, self.report())
            self.coord._changed(True, f"coordinator {self.id} restarted; resumes from the members' map")
        self.publish()
        self._save_cluster()
        log.info("stage=join node=%s resumed as coordinator (version %d, epoch %d)",
                 self.id, self.map.version, self.map.epoch)
        return True

    def _been_member(self) -> bool:
        return os.path.exists(os.path.join(self.cfg.data, CLUSTER_FILE))

    def _bootstrap(self) -> None:
        """No cluster reachable: start one. A fresh node creates every partition."""
        fresh = not any(True for _ in self.states.items())
        old_version = 0
        try:
            with open(os.path.join(self.cfg.data, CLUSTER_FILE)) as f:
                old_version = int(json.load(f)["version"])
        except (OSError, ValueError, KeyError):
            pass
        if fresh:
            for cache, data in self.data.items():
                for p in range(data.cache.partitions):
                    data.create(p)
                self.states.set_many([(cache, p, State.OWNING) for p in range(data.cache.partitions)],
                                     reason="new cluster")
            self.stale.clear()
        with self.map_lock:
            m = ClusterMap({c.name: c for c in self.cfg.caches})
            m.version, m.epoch = old_version, old_version
            m.members[self.id] = Member(self.id, self.cfg.address, 1, True, False, self.boot,
                                            self.transfer_address)
            self.map = m
            self._become_coordinator()
            self.coord._merge(self.id, self.report())
            self.coord._changed(True, f"node {self.id} starts a {'new' if fresh else 'restarted'} cluster")
        self._save_cluster()
        log.info("stage=join node=%s bootstrapped the cluster (version %d)", self.id, self.map.version)

    # -- heartbeats ---------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        """A heartbeat every ``heartbeat_interval_s``, and at once (after a short pause
        that lets a burst of changes go out as one report) when a partition state
        changed: the coordinator's map, and with it the hand-off of the primary and
        the old owners' eviction, wait for that report, so a move's OWNING is not held
        up by up to one heartbeat interval per step of that chain."""
        self._last_ok = time.monotonic()
        while not self.stopping.is_set():
            self._report_dirty.wait(self.cfg.heartbeat_interval_s)
            if self.stopping.wait(REPORT_COALESCE_S):
                return
            before = self._last_ok
            try:
                self._heartbeat_once()
            except Exception:   # never let the failure detector die
                log.exception("stage=membership heartbeat round failed")
            if (self._last_ok == before and self._report_dirty.is_set()
                    and self.stopping.wait(self.cfg.heartbeat_interval_s)):
                return          # failed with a report pending: retry at the normal pace

    def _heartbeat_target(self) -> str | None:
        """Whom this member reports to: the map's coordinator unless this member could
        not reach it for ``failure_timeout_s`` (a suspect), then the next oldest live
        member. Suspicion stays local to the failure detector: the map is not changed,
        so reconcile never starts moves from a view no coordinator published."""
        with self.map_lock:
            live = [m for m in self.map.members.values() if m.alive and m.id not in self._suspects]
            return min(live, key=lambda m: (m.order, m.id)).id if live else None

    def _heartbeat_once(self) -> None:
        last_ok = self._last_ok
        dirty = False
        try:
            if self.coord is not None:
                if self._report_dirty.is_set():
                    self._report_dirty.clear()
                    self.coord.report(self.id, self.boot, self.report())
                self.coord.check_failures()
                self._last_ok = time.monotonic()
                return
            with self.map_lock:
                coord = self._heartbeat_target()
                addr = self.map.address(coord)
                epoch = self.map.epoch
            dirty = self._report_dirty.is_set()
            self._report_dirty.clear()
            r = self.pool.call(addr, "heartbeat", timeout=max(1.0, self.cfg.failure_timeout_s / 2),
                               node=self.id, boot=self.boot, epoch=epoch,
                               report=self.report() if dirty else None)
            if r.get("not_coordinator"):
                self._not_coordinator(coord, r, last_ok, dirty)
                return
            self._last_ok = time.monotonic()
            if not r["member"]:
                self._rejoin(f"coordinator {coord} does not know this boot (declared failed?)")
            elif r.get("map"):
                self.adopt(r["map"])
        except NodeError as e:
            if dirty:
                self._report_dirty.set()
            if time.monotonic() - last_ok > self.cfg.failure_timeout_s:
                self._last_ok = time.monotonic()
                self._coordinator_failed(e)

    def _not_coordinator(self, asked: str | None, r: dict[str, Any], last_ok: float, dirty: bool) -> None:
        """``asked`` (the successor of a coordinator this member suspects) is alive but
        not coordinator. Not a successful heartbeat: the report went nowhere and no
        coordinator heard this member. Either the successor has not noticed the old
        coordinator's death yet, or the old coordinator is alive and this member was cut
        off from it (a network partition that healed): it may have been declared failed
        meanwhile. A newer map from ``asked`` settles it (the next heartbeat goes to the
        coordinator it names); otherwise, after ``failure_timeout_s`` of such answers,
        this member drops its suspicion and tries the map's coordinator again."""
        if dirty:
            self._report_dirty.set()
        if r.get("map") and self.adopt(r["map"]):
            log.warning("stage=membership %s is not coordinator; adopted its newer map "
                        "(epoch %d, coordinator %s)", asked, self.map.epoch, self.map.coordinator)
            return
        if time.monotonic() - last_ok > self.cfg.failure_timeout_s:
            with self.map_lock:
                suspects = sorted(self._suspects)
                self._suspects.clear()
            self._last_ok = time.monotonic()
            log.warning("stage=membership %s is not coordinator and takes %s for coordinator; "
                        "trying %s again", asked, r.get("coordinator"), ", ".join(suspects) or "it")

    def _rejoin(self, why: str) -> None:
        """The coordinator does not count this node (declared failed while it was cut
        off, or a coordinator that does not know it). Writes may have been acknowledged
        without this node meanwhile, so every OWNING copy it holds is unconfirmed, as
        after a restart: the map learns they are stale, the coordinator keeps fresh
        copies as primaries, and reconcile resyncs or evicts them."""
        log.warning("stage=membership %s; rejoining", why)
        for (cache, p), s in self.states.items():
            if s == State.OWNING:
                self.stale.add((cache, p))
        self.join_cluster()
        self.wake()

    def _coordinator_failed(self, err: Exception) -> None:
        with self.map_lock:
            dead = self._heartbeat_target()
            if dead is None or dead == self.id:
                return
            self._suspects.add(dead)
            nxt = self._heartbeat_target()
        log.warning("stage=membership coordinator %s unreachable (%s); next is %s", dead, err, nxt)
        if nxt == self.id:
            with self.map_lock:
                dead_all = sorted(self._suspects)
                self._suspects.clear()
                self._become_coordinator()
            self.coord.take_over(dead_all)   # marks them dead in the map and bumps it
            self._report_dirty.set()
            self._save_cluster()

    # -- reconcile ----------------------------------------------------------------
    def wake(self) -> None:
        self._reconcile_event.set()

    def _reconcile_loop(self) -> None:
        while not self.stopping.is_set():
            self._reconcile_event.wait(1.0)
            self._reconcile_event.clear()
            if self.stopping.is_set() or not self.joined.is_set():
                continue
            try:
                self.reconcile()
            except Exception:
                log.exception("stage=reconcile failed")

    def reconcile(self) -> None:
        with self.map_lock:
            m = self.map.clone()
        me = self.id
        if me in m.members and not m.members[me].alive:
            # the coordinator declared this node failed (it learnt so from a peer's map):
            # its owners moved on without it, so it changes nothing until it has rejoined
            return
        for cache, data in self.data.items():
            for p in range(data.cache.partitions):
                key = (cache, p)
                st = self.states.get(cache, p)
                prim = m.primaries[cache][p]
                ideal = m.ideal(cache, p)
                # registered MOVING copies that now show OWNING (or died) need no registration
                regs = self.copies.get(key)
                if regs:
                    for n in list(regs):
                        # (not on None: the copy's MOVING report may not have reached the map yet)
                        if n not in m.alive() or m.state(cache, p, n) in (State.OWNING, State.EVICTED):
                            regs.pop(n, None)
                if key in self.stale:
                    if prim == me:
                        self.stale.discard(key)
                        self._report_dirty.set()
                    elif prim is not None and st == State.OWNING and me in ideal:
                        self.start_move(cache, p, "copy from before a restart may be stale")
                    elif prim is not None and st == State.OWNING:
                        self.stale.discard(key)
                        self.states.set(cache, p, State.RENTING, reason="stale copy, not an owner")
                        self._evict(cache, p, "stale copy of a partition owned elsewhere")
                    continue
                if key in self.moves:
                    if me not in ideal and m.state(cache, p, me) == State.MOVING and prim != me:
                        self.moves[key].cancelled = True
                    continue
                if me in ideal:
                    if st in (None, State.EVICTED, State.LOST):
                        if prim is not None:
                            self.start_move(cache, p, "assigned by the map")
                    elif st == State.MOVING:
                        self.start_move(cache, p, "resuming after restart or resync")
                    elif st == State.RENTING:
                        self._evict(cache, p, "assigned again while renting: re-pull")
                    elif (st == State.OWNING and ideal[0] == me and prim not in (me, None)
                          and m.state(cache, p, prim) == State.OWNING and key not in self.handoffs
                          and m.state(cache, p, me) == State.OWNING):
                        self.handoffs.add(key)
                        threading.Thread(target=self._take_primary, args=(cache, p, prim),
                                         daemon=True).start()
                else:
                    if st == State.MOVING:
                        self.states.set(cache, p, State.EVICTED, reason="move cancelled: not assigned")
                        with self.plock(cache, p):
                            data.drop(p)
                    elif st == State.OWNING and prim != me and ideal and all(
                            m.state(cache, p, n) == State.OWNING and n not in m.stale[cache][p]
                            for n in ideal):
                        self.states.set(cache, p, State.RENTING, reason="new owners are OWNING")
                        self._evict(cache, p, "no longer an owner")
                    elif st == State.RENTING:
                        self._evict(cache, p, "finishing eviction")
        if self.leaving.is_set() and not any(
                s in (State.OWNING, State.MOVING, State.RENTING) for _, s in self.states.items()):
            try:
                self.call_coordinator("leave_done", node=self.id)
                log.info("stage=leave node=%s holds nothing; left the cluster", self.id)
                self.left.set()
            except NodeError as e:
                log.info("stage=leave waiting for the coordinator: %s", e)

    def _evict(self, cache: str, p: int, why: str) -> None:
        """RENTING -> EVICTED: the file is deleted once no transfer reads it (else the
        partition stays RENTING and the next reconcile tries again)."""
        if self.in_use.get((cache, p)):
            log.info("stage=evict cache=%s partition=%d still being sent; eviction waits", cache, p)
            return
        with self.plock(cache, p):
            crashpoint("owner.mid_eviction")
            try:
                self.data[cache].drop(p)
            except Exception as e:
                if type(e).__name__ != "SnapshotBusyError":
                    raise
                log.info("stage=evict cache=%s partition=%d still being sent; eviction waits", cache, p)
                return
            self.states.set(cache, p, State.EVICTED, reason=why)
        log.info("stage=evict cache=%s partition=%d evicted: %s", cache, p, why)
