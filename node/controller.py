"""The controller: the one node (elected through etcd) that writes partition records.

For each partition the record ``P/parts/<cache>/<p>`` holds the primary, the in-sync
set (ISR) and an epoch (the PacificA / Elasticsearch / Kafka-ISR model). The rules:

- **Removal is always safe** as long as the primary stays: a copy leaves the ISR when
  its node's lease is gone, when it no longer reports OWNING, or when the primary asks
  (it could not replicate to it). The last in-sync copy is never removed: a partition
  whose in-sync copies are all down waits for one of them instead of being served from
  a stale copy.
- **Addition goes through the primary** (:meth:`alter_isr` with ``add``): it admits a
  copy under its partition lock, so no write is acknowledged without the new member
  once the record names it.
- **Primaries come only from the ISR**, and a new one is appointed only when the old
  one's lease has expired (its member key is gone), it stopped being OWNING, or it
  handed over (:meth:`set_primary`).
- Every write is a compare-and-swap on the record's mod revision, plus a check that
  this node still holds the election key: a deposed controller changes nothing.

With every in-sync copy alive and none holding the partition, it is LOST (reported).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

from .assignment import owners, ranked
from . import schema
from .cluster_map import ClusterMap, PartRecord
from .config import CacheConfig
from .control import KV, Etcd, View
from .jsonvalue import JsonDoc
from .errors import BadRequest, NodeError, StaleEpoch, Unavailable
from .mapview import map_from_keys
from .reassign_driver import PlanDriver
from .states import State

if TYPE_CHECKING:
    from .context import MapHolder

RETURNING = "RETURNING"       # the report state of an unconfirmed copy (docs/node.md, "Returning copies")
log = logging.getLogger("ferry.node.controller")
TXN_BATCH = 48          # records per transaction (etcd's default --max-txn-ops is 128)
# a new cluster with initial members: a partition's record waits this long for all of
# its initial owners to report their (empty) copy, then is made with those that did
INITIAL_WAIT_S = 30.0
REQUEST_BATCH = 40      # requests per transaction: 2 compares + a put and a delete each


def part_key(prefix: str, cache: str, p: int) -> str:
    return f"{prefix}/parts/{cache}/{p}"


class Controller:
    """The elected controller's decisions. It reads the cluster from a map kept by
    the node's watch (``live``: the node's :class:`~node.context.MapHolder`, changed in
    place by each batch, with ``controller_dirty`` naming the partitions each batch
    touched), so a round looks only at partitions that changed: the cost of a round
    is the size of the change, not of the cluster. Without ``live`` (tests, tools) it
    builds a map from ``view`` at each round and looks at every partition."""

    def __init__(self, me: str, prefix: str, etcd: Etcd, view: View,
                 caches: dict[str, CacheConfig], election_rev: int,
                 live: "MapHolder | None" = None) -> None:
        self.me, self.prefix, self.etcd, self.view = me, prefix, etcd, view
        self.caches = caches
        self.election_rev = election_rev
        self.live = live
        self.lock = threading.Lock()     # one decision at a time on this node
        self.rounds = 0
        self.looked_at = 0               # partitions looked at, over all rounds (a metric)
        self._born = time.monotonic()
        self._unborn: set[tuple[str, int]] = set()   # new partitions waiting for initial owners
        # records this controller wrote that its map may not show yet: (cache, p) -> (mod
        # revision, record). Decided against these, a round right after a write compares
        # the revision etcd holds, not an older one that would fail the whole batch. An
        # entry goes when p is looked at with the map showing the write (the write's own
        # event makes p dirty), so keeping it costs O(1) per write.
        self._written: dict[tuple[str, int], tuple[int, PartRecord]] = {}
        # requests this controller deleted (applied or refused) that its view may still
        # show: key -> the mod revision read; not looked at again
        self._deleted: dict[str, int] = {}
        # operator plans (P/reassign/*): applied by pinning owners, a bounded number at a time
        self.plans = PlanDriver(prefix, etcd, view, caches, self._guard)

    # -- reading the map ----------------------------------------------------------
    def _guard(self) -> JsonDoc:
        return Etcd.create_is(f"{self.prefix}/controller", self.election_rev)

    def _view_map(self) -> "ClusterMap":
        """A map built from the whole view (no live map: tests, tools)."""
        with self.view.lock:
            kvs, rev = dict(self.view.kvs), self.view.revision
        return map_from_keys(kvs, rev, self.prefix, self.caches.values())[0]

    def _whole_map(self) -> tuple["ClusterMap", "AbstractContextManager[object]"]:
        """(the map, the lock that guards it)."""
        if self.live is not None:
            return self.live.map, self.live.lock
        return self._view_map(), nullcontext()

    def _map(self) -> tuple["ClusterMap", "AbstractContextManager[object]", set[tuple[str, int]] | None]:
        """(the map, the lock that guards it, the partitions to look at: None = all)."""
        m, lock = self._whole_map()
        return m, lock, self.live.controller_dirty.take() if self.live is not None else None

    @staticmethod
    def _owning_of(m: "ClusterMap", cache: str, p: int) -> set[str]:
        """Live nodes reporting OWNING for (cache, p)."""
        return {n for n, st in m.states[cache][p].items() if st == State.OWNING.value and n in m.members}

    @staticmethod
    def _returning_of(m: "ClusterMap", cache: str, p: int) -> dict[str, tuple[int, str]]:
        """Live nodes reporting RETURNING for (cache, p): node -> (counter, boot)."""
        out: dict[str, tuple[int, str]] = {}
        for n, st in m.states[cache][p].items():
            mem = m.members.get(n)
            if st == RETURNING and mem is not None:
                out[n] = (m.counters[cache][p].get(n, 0), mem.boot)
        return out

    def _record(self, cache: str, p: int) -> tuple[PartRecord | None, int]:
        kv = self.view.get(part_key(self.prefix, cache, p))
        return (self._parsed(kv, part_key(self.prefix, cache, p)), kv.mod) if kv else (None, 0)

    @staticmethod
    def _parsed(kv: KV, key: str) -> PartRecord:
        """A record read from etcd; a malformed one reads as none (and is logged once)."""
        try:
            return schema.record(key, kv)
        except schema.Malformed as e:
            schema.log_malformed(e, "read as no record", log)
            return PartRecord()

    # -- the periodic decision ----------------------------------------------------
    def decide(self) -> int:
        """Bring the records of the partitions that changed (every record at the first
        round) in line with membership and reports, then take the running plans a step
        further (node/reassign.py); returns how many records changed. Idempotent: run
        it on every change and periodically."""
        done = self._decide_records()
        with self.lock:
            self.plans.step(self._whole_map)
        return done

    def _decide_records(self) -> int:
        with self.lock:
            m, lock, dirty = self._map()
            writes: list[tuple[str, int, PartRecord, PartRecord | None]] = []
            with lock:
                members = m.members
                if dirty is not None:
                    dirty |= self._unborn
                self._unborn = set()
                keys = ((c, p) for c, cc in self.caches.items() for p in range(cc.partitions)) \
                    if dirty is None else sorted(dirty)
                n = 0
                for cache, p in keys:
                    if cache not in self.caches:
                        continue
                    n += 1
                    mod = m.rec_mod[cache][p]
                    rec = m.parts[cache][p] if mod else None
                    bad = m.garbage.get((cache, p))
                    mine = self._written.get((cache, p)) if self._written else None
                    if mine is not None:
                        if mine[0] > mod:
                            mod, rec = mine      # written here since, not shown yet
                            bad = None
                        else:                    # shown now (its event made p dirty)
                            self._written.pop((cache, p), None)
                    if bad is not None and not bad.known:
                        # malformed, and this map never held the record it replaced
                        owning = {n: m.counters[cache][p].get(n, 0) for n in self._owning_of(m, cache, p)}
                        new, later = schema.rebuild_record(cache, p, bad, owning, time.monotonic())
                        if later:
                            self._unborn.add((cache, p))
                    else:
                        new = self._next(cache, p, rec, members, self._owning_of(m, cache, p),
                                         m.creator, m.initial_members, self._returning_of(m, cache, p))
                        if new is None and bad is not None and rec is not None:
                            new = replace(rec, epoch=rec.epoch + 1)   # malformed: rewritten as it was
                    if new is not None:
                        writes.append((part_key(self.prefix, cache, p), mod, new, rec))
                self.rounds += 1
                self.looked_at += n
            done = 0
            for i in range(0, len(writes), TXN_BATCH):
                chunk = writes[i:i + TXN_BATCH]
                try:
                    ok, rev = self.etcd.txn([self._guard()] + [Etcd.mod_is(k, mod) for k, mod, _, _ in chunk],
                                            [(k, new.to_json(), 0) for k, _, new, _ in chunk])
                except NodeError:
                    self._again(writes[i:])
                    raise
                if not ok:
                    log.info("stage=controller a record changed under this decision; next round")
                    self._again(writes[i:])
                    return done
                self._wrote([(k, new) for k, _, new, _ in chunk], rev)
                for k, _, new, old in chunk:
                    log.info("stage=controller %s: primary %s -> %s, in-sync %s -> %s, epoch %d%s",
                             k[len(self.prefix) + 7:], old.primary if old else None, new.primary,
                             list(old.isr) if old else [], list(new.isr), new.epoch,
                             " LOST" if new.lost else "")
                done += len(chunk)
            return done

    def _again(self, writes: list[tuple[str, int, PartRecord, PartRecord | None]]) -> None:
        """Writes not made: their partitions are looked at again next round."""
        if self.live is not None:
            head = len(self.prefix) + len("/parts/")
            keys = []
            for k, _, _, _ in writes:
                cache, _, ps = k[head:].rpartition("/")
                keys.append((cache, int(ps)))
            self.live.controller_dirty.add(keys)

    def _next(self, cache: str, p: int, rec: PartRecord | None, members: Mapping[str, object],
              owning: set[str], made_by: str | None, initial: tuple[str, ...],
              back: Mapping[str, tuple[int, str]] | None = None) -> PartRecord | None:
        if rec is None:
            if not owning:
                return None
            if initial:
                # a new cluster with initial members: each made its share, empty; every
                # copy of a partition that never had a record is the same (no write was
                # ever acknowledged without one), so all of them start in sync
                want = owners(cache, p, initial, self.caches[cache].backups)
                share = [n for n in want if n in owning]
                if len(share) < len(want) and time.monotonic() - self._born < INITIAL_WAIT_S:
                    self._unborn.add((cache, p))
                    return None
                if share:
                    return PartRecord(share[0], tuple(share), 1, False, 1)
            # a new cluster: the node that created it made every partition
            first = made_by if made_by in owning else ranked(cache, p, sorted(owning))[0]
            return PartRecord(first, (first,), 1, False, 1)
        live_isr = [n for n in rec.isr if n in members and n in owning]
        if not live_isr and rec.isr and back and all(n in members for n in rec.isr):
            # every in-sync copy is back and none is confirmed current (docs/node.md, "Returning copies"):
            # those with the highest counter are; never one while another in-sync copy
            # is still away (it may hold writes the returning ones lost: a restored
            # backup, a disk that went back in time)
            elected = self._elect_returning(cache, p, rec, back)
            if elected is not None or any(n in back for n in rec.isr):
                return elected
        isr = tuple(live_isr) if live_isr else rec.isr      # never empty the set
        # the primary stays while its lease lives and it is OWNING; otherwise the first
        # live in-sync copy takes over (a non-OWNING node does not lead: safe at once)
        prim: str | None = rec.primary
        if prim not in live_isr:
            cands = ranked(cache, p, live_isr)
            prim = cands[0] if cands else None
        lost = not live_isr and bool(rec.isr) and all(n in members for n in rec.isr)
        if prim == rec.primary and isr == rec.isr and lost == rec.lost:
            return None
        return PartRecord(prim, isr, rec.epoch + 1, lost, rec.term + (prim != rec.primary))

    @staticmethod
    def _elect_returning(cache: str, p: int, rec: PartRecord,
                         back: Mapping[str, tuple[int, str]]) -> PartRecord | None:
        """The record that confirms the returning in-sync copies with the highest
        counter (their boot ids in ``confirmed``, the first of them primary in a new
        term), or None when it is already written."""
        mine = {n: back[n] for n in rec.isr if n in back}
        if not mine:
            return None
        top = max(c for c, _ in mine.values())
        best = ranked(cache, p, [n for n, (c, _) in mine.items() if c == top])
        confirmed = tuple(sorted((n, mine[n][1]) for n in best))
        if rec.confirmed == confirmed and rec.primary == best[0] and rec.isr == tuple(best):
            return None
        log.warning("stage=controller %s/%d: every in-sync copy came back unconfirmed (%s); "
                    "the ones at the highest counter %d are in sync: %s", cache, p,
                    ", ".join(f"{n}@{c}" for n, (c, _) in sorted(mine.items())), top, ",".join(best))
        return PartRecord(best[0], tuple(best), rec.epoch + 1, False, rec.term + 1, confirmed)

    # -- requests from primaries ----------------------------------------------------
    def handle_requests(self) -> int:
        """Requests nodes left under ``P/requests/<cache>/<p>/<node>`` (through etcd, so
        a primary cut off from its peers but not from etcd still reaches the controller).
        Each is applied or refused, and deleted either way. Only as read: the write
        that applies one also compares the request's mod revision, so a request its
        node withdrew meanwhile (its wait ran out: ``ControlPlane.request``) or
        replaced is never applied, whatever this view still shows.

        Batched: the requests of a round are checked against the map's records and
        applied up to REQUEST_BATCH per transaction (each compared on its record's and
        its own mod revision); a transaction that fails is redone request by request,
        each against etcd itself, so one changed record costs only a retry."""
        n = 0
        planned: list[tuple[str, int, str, int, PartRecord, str]] = []
        seen: set[str] = set()
        refusals: list[tuple[str, int]] = []
        shown = sorted(self.view.items("requests"))
        if self._deleted:                # forget those the view shows gone (or put again)
            mods = {f"{self.prefix}/requests/{key}": kv.mod for key, kv in shown}
            self._deleted = {k: mod for k, mod in self._deleted.items() if mods.get(k) == mod}
        for key, kv in shown:
            full = f"{self.prefix}/requests/{key}"
            if self._deleted.get(full) == kv.mod:
                continue                 # decided here already; the view does not show it yet
            try:
                plan = self._plan(key, kv)
            except (NodeError, ValueError, KeyError, TypeError) as e:
                log.info("stage=controller request %s refused: %s", key, e)
                refusals.append((full, kv.mod))
                continue
            if plan[2] in seen:
                continue                 # one change of a record per round
            seen.add(plan[2])
            planned.append(plan)
        for i in range(0, len(refusals), REQUEST_BATCH):
            gone = refusals[i:i + REQUEST_BATCH]
            ok, _ = self.etcd.txn([Etcd.mod_is(k, mod) for k, mod in gone], [], [k for k, _ in gone])
            if not ok:                   # one was withdrawn meanwhile: each on its own
                for k, mod in gone:
                    self.etcd.txn([Etcd.mod_is(k, mod)], [], [k])
            self._deleted.update(gone)
        for i in range(0, len(planned), REQUEST_BATCH):
            chunk = planned[i:i + REQUEST_BATCH]
            with self.lock:
                cmp = [self._guard()]
                for req_key, req_mod, key, mod, _, _ in chunk:
                    cmp += [Etcd.mod_is(key, mod), Etcd.mod_is(req_key, req_mod)]
                ok, rev = self.etcd.txn(cmp, [(c[2], c[4].to_json(), 0) for c in chunk], [c[0] for c in chunk])
                if ok:
                    self._wrote([(c[2], c[4]) for c in chunk], rev)
                    self._deleted.update((c[0], c[1]) for c in chunk)
            if ok:
                for c in chunk:
                    log.info("stage=controller %s (epoch %d)", c[5], c[4].epoch)
                n += len(chunk)
                continue
            for req_key, req_mod, _, _, _, _ in chunk:
                key = req_key[len(self.prefix) + len("/requests/"):]
                now = self.view.get(req_key)
                if now is None or now.mod != req_mod:
                    continue
                try:
                    self._apply_one(key, now)
                    n += 1
                except (NodeError, ValueError, KeyError, TypeError) as e:
                    log.info("stage=controller request %s refused: %s", key, e)
                    self.etcd.txn([Etcd.mod_is(req_key, req_mod)], [], [req_key])
                self._deleted[req_key] = req_mod
        return n

    def _plan(self, key: str, kv: KV) -> tuple[str, int, str, int, PartRecord, str]:
        """(request key, its mod, record key, the record's mod, the new record, what it
        does) of one request, checked against the map; raises what refuses it."""
        full = f"{self.prefix}/requests/{key}"
        cache, p, node, req = schema.request_at(self.prefix, key, kv)
        self._check_partition(cache, p)
        rec, mod = self._current(cache, p)
        pkey = part_key(self.prefix, cache, p)
        if isinstance(req, schema.AlterIsr):
            remove, add = list(req.remove), list(req.add)
            new = self._altered(cache, p, rec, node, req.term, remove, add)
            return (full, kv.mod, pkey, mod, new,
                    f"{cache}/{p} in-sync {list(rec.isr)} -> {list(new.isr)} at {node}'s request"
                    + (f", removed {remove}" if remove else "") + (f", admitted {add}" if add else ""))
        previous = req.previous
        new = self._handed(cache, p, rec, node, previous)
        return (full, kv.mod, pkey, mod, new, f"hand-off of {cache}/{p}: primary {previous} -> {node}")

    def _apply_one(self, key: str, kv: KV) -> None:
        full = f"{self.prefix}/requests/{key}"
        cache, p, node, req = schema.request_at(self.prefix, key, kv)
        if isinstance(req, schema.AlterIsr):
            self.alter_isr(cache, p, node, req.term, list(req.remove), list(req.add), req_key=full,
                           req_mod=kv.mod)
        else:
            self.set_primary(cache, p, node, req.previous, req_key=full, req_mod=kv.mod)

    def _current(self, cache: str, p: int) -> tuple[PartRecord, int]:
        """p's record and its mod revision as this controller's map shows it, or as this
        controller wrote it since."""
        if self.live is not None:
            with self.live.lock:
                rec, mod = self.live.map.parts[cache][p], self.live.map.rec_mod[cache][p]
        else:
            got, mod = self._record(cache, p)
            rec = got or PartRecord()
        mine = self._written.get((cache, p))
        if mine is not None:
            if mine[0] > mod:
                return mine[1], mine[0]
            self._written.pop((cache, p), None)    # shown now
        return rec, mod

    def _wrote(self, writes: list[tuple[str, PartRecord]], rev: int) -> None:
        """Records written here at ``rev`` (keys under ``P/parts/``), until the map shows them."""
        head = len(self.prefix) + len("/parts/")
        for key, rec in writes:
            cache, _, p = key[head:].rpartition("/")
            self._written[(cache, int(p))] = (rev, rec)

    def _altered(self, cache: str, p: int, rec: PartRecord, primary: str, term: int,
                 remove: list[str], add: list[str]) -> PartRecord:
        if rec.term != term or rec.primary != primary:
            raise StaleEpoch(f"{cache}/{p} is in term {rec.term} with primary {rec.primary}; "
                             f"{primary} asked in term {term}")
        bad = [n for n in add if not self._is_member(n)]
        if bad:
            raise Unavailable(f"cannot admit {', '.join(bad)} to {cache}/{p}: not a live member")
        if primary in remove:
            raise BadRequest("a primary cannot remove itself from the in-sync set")
        isr = tuple([n for n in rec.isr if n not in remove] + [n for n in add if n not in rec.isr])
        return PartRecord(rec.primary, isr, rec.epoch + 1, False, rec.term)

    def _handed(self, cache: str, p: int, rec: PartRecord, node: str, previous: str | None) -> PartRecord:
        if rec.primary != previous or node not in rec.isr or not self._is_member(node):
            raise StaleEpoch(f"{cache}/{p}: {node} cannot take over from {previous} "
                             f"(record: primary {rec.primary}, in sync {list(rec.isr)})")
        if node not in self._owning_now(cache, p):
            raise StaleEpoch(f"{cache}/{p}: {node} does not report OWNING")
        return PartRecord(node, rec.isr, rec.epoch + 1, False, rec.term + 1)

    def alter_isr(self, cache: str, p: int, primary: str, term: int,
                  remove: list[str], add: list[str], req_key: str | None = None,
                  req_mod: int | None = None) -> PartRecord:
        """The primary of (cache, p) in ``term`` removes or admits copies. Checked
        against etcd itself (not the view), so a deposed primary gets StaleEpoch; a
        change of the in-sync set meanwhile (a dead copy removed) does not matter.
        At a request's behest (``req_key``, read at mod revision ``req_mod``): applied
        only if the request is still there as read, and deleted with the change."""
        self._check_partition(cache, p)
        req = self._request_guard(req_key, req_mod)
        key = part_key(self.prefix, cache, p)
        with self.lock:
            kv = self.etcd.get(key)
            rec = self._parsed(kv, key) if kv else PartRecord()
            new = self._altered(cache, p, rec, primary, term, remove, add)
            isr = new.isr
            ok, rev = self.etcd.txn([self._guard(), Etcd.mod_is(key, kv.mod if kv else 0)] + req,
                                    [(key, new.to_json(), 0)], [req_key] if req_key else [])
            if ok:
                self._wrote([(key, new)], rev)
            else:
                if self._withdrawn(req_key, req_mod):
                    raise Unavailable(f"request {req_key} was withdrawn (or replaced) before it was "
                                      "applied; not applied")
                raise StaleEpoch(f"{cache}/{p} changed meanwhile (or {self.me} is no longer "
                                 "controller); retry")
        log.info("stage=controller %s/%d in-sync %s -> %s at %s's request (epoch %d)%s%s",
                 cache, p, list(rec.isr), list(isr), primary, new.epoch,
                 f", removed {remove}" if remove else "", f", admitted {add}" if add else "")
        return new

    def set_primary(self, cache: str, p: int, node: str, previous: str | None,
                    req_key: str | None = None, req_mod: int | None = None) -> PartRecord | None:
        """Hand-off: ``previous`` fenced p and ``node`` (in sync, OWNING) takes over.
        At a request's behest, as :meth:`alter_isr`: only if it is still there as read
        (its node lifts the fence when its wait runs out and withdraws it)."""
        self._check_partition(cache, p)
        req = self._request_guard(req_key, req_mod)
        key = part_key(self.prefix, cache, p)
        with self.lock:
            kv = self.etcd.get(key)
            rec = self._parsed(kv, key) if kv else PartRecord()
            new = self._handed(cache, p, rec, node, previous)
            ok, rev = self.etcd.txn([self._guard(), Etcd.mod_is(key, kv.mod if kv else 0)] + req,
                                    [(key, new.to_json(), 0)], [req_key] if req_key else [])
            if ok:
                self._wrote([(key, new)], rev)
            if not ok and self._withdrawn(req_key, req_mod):
                log.info("stage=handoff %s/%d: request %s was withdrawn (or replaced) before it "
                         "was applied; not applied", cache, p, req_key)
        if ok:
            log.info("stage=handoff %s/%d primary %s -> %s epoch=%d", cache, p, previous, node, new.epoch)
        return new if ok else None

    def _live_members(self) -> dict[str, bool]:
        """Live members -> leaving."""
        if self.live is not None:
            with self.live.lock:
                return {n: mem.leaving for n, mem in self.live.map.members.items()}
        out = {}
        for k, v in self.view.items("members"):
            try:
                out[k] = schema.member(f"{self.prefix}/members/{k}", v).leaving
            except schema.Malformed:
                pass                     # not a member (the map logs it)
        return out

    def _is_member(self, node: str) -> bool:
        if self.live is not None:
            return node in self.live.map.members        # one dict lookup: no lock needed
        kv = self.view.get(f"{self.prefix}/members/{node}")
        try:
            return kv is not None and bool(schema.member(f"{self.prefix}/members/{node}", kv))
        except schema.Malformed:
            return False

    def _owning_now(self, cache: str, p: int) -> set[str]:
        if self.live is not None:
            with self.live.lock:
                return self._owning_of(self.live.map, cache, p)
        return self._owning_of(self._view_map(), cache, p)

    @staticmethod
    def _request_guard(req_key: str | None, req_mod: int | None) -> list[JsonDoc]:
        """The compare that applies a request only as it was read: its key still at
        the mod revision read (gone or put again since: not applied)."""
        if req_key is None:
            return []
        if not req_mod:
            raise BadRequest(f"request {req_key}: its mod revision is needed to apply it")
        return [Etcd.mod_is(req_key, req_mod)]

    def _withdrawn(self, req_key: str | None, req_mod: int | None) -> bool:
        """(after a failed write) Is the request gone or changed since it was read?"""
        if req_key is None:
            return False
        kv = self.etcd.get(req_key)
        return kv is None or kv.mod != req_mod

    def _check_partition(self, cache: str, p: int) -> None:
        cc = self.caches.get(cache)
        if cc is None or not isinstance(p, int) or not 0 <= p < cc.partitions:
            raise BadRequest(f"no partition {cache}/{p}")


__all__ = ["Controller", "part_key"]
