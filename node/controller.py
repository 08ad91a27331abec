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

from .assignment import ranked
from .cluster_map import PartRecord
from .config import CacheConfig
from .control import Etcd, View
from .jsonvalue import Json, JsonDoc
from .errors import BadRequest, NodeError, StaleEpoch, Unavailable
from .states import State

log = logging.getLogger("ferry.node.controller")
TXN_BATCH = 48          # records per transaction (etcd's default --max-txn-ops is 128)


def part_key(prefix: str, cache: str, p: int) -> str:
    return f"{prefix}/parts/{cache}/{p}"


class Controller:
    def __init__(self, me: str, prefix: str, etcd: Etcd, view: View,
                 caches: dict[str, CacheConfig], election_rev: int) -> None:
        self.me, self.prefix, self.etcd, self.view = me, prefix, etcd, view
        self.caches = caches
        self.election_rev = election_rev
        self.lock = threading.Lock()     # one decision at a time on this node

    # -- reading the view ---------------------------------------------------------
    def _guard(self) -> JsonDoc:
        return Etcd.create_is(f"{self.prefix}/controller", self.election_rev)

    def _members(self) -> JsonDoc:
        return {k: v.value for k, v in self.view.items("members") if isinstance(v.value, dict)}

    def _owning(self) -> dict[tuple[str, int], set[str]]:
        """(cache, p) -> live nodes reporting OWNING."""
        out: dict[tuple[str, int], set[str]] = {}
        members = self._members()
        for node, kv in self.view.items("reports"):
            if node not in members or not isinstance(kv.value, dict):
                continue
            for cache, parts in (kv.value.get("caches") or {}).items():
                for ps, st in parts.items():
                    if isinstance(st, list) and st and st[0] == State.OWNING.value:
                        out.setdefault((cache, int(ps)), set()).add(node)
        return out

    def _record(self, cache: str, p: int) -> tuple[PartRecord | None, int]:
        kv = self.view.get(part_key(self.prefix, cache, p))
        return (PartRecord.from_json(kv.value), kv.mod) if kv else (None, 0)

    # -- the periodic decision ----------------------------------------------------
    def decide(self) -> int:
        """Bring every record in line with membership and reports; returns how many
        records changed. Idempotent: run it on every change and once a second."""
        with self.lock:
            members = self._members()
            owning = self._owning()
            meta = self.view.get(f"{self.prefix}/meta")
            creator = meta.value.get("created_by") if meta and isinstance(meta.value, dict) else None
            writes: list[tuple[str, int, PartRecord, PartRecord | None]] = []
            for cache, cc in self.caches.items():
                for p in range(cc.partitions):
                    rec, mod = self._record(cache, p)
                    new = self._next(cache, p, rec, members, owning.get((cache, p), set()), creator)
                    if new is not None:
                        writes.append((part_key(self.prefix, cache, p), mod, new, rec))
            done = 0
            for i in range(0, len(writes), TXN_BATCH):
                chunk = writes[i:i + TXN_BATCH]
                ok, _ = self.etcd.txn([self._guard()] + [Etcd.mod_is(k, mod) for k, mod, _, _ in chunk],
                                      [(k, new.to_json(), 0) for k, _, new, _ in chunk])
                if not ok:
                    log.info("stage=controller a record changed under this decision; next round")
                    return done
                for k, _, new, old in chunk:
                    log.info("stage=controller %s: primary %s -> %s, in-sync %s -> %s, epoch %d%s",
                             k[len(self.prefix) + 7:], old.primary if old else None, new.primary,
                             list(old.isr) if old else [], list(new.isr), new.epoch,
                             " LOST" if new.lost else "")
                done += len(chunk)
            return done

    def _next(self, cache: str, p: int, rec: PartRecord | None, members: JsonDoc,
              owning: set[str], creator: str | None) -> PartRecord | None:
        if rec is None:
            if not owning:
                return None
            # a new cluster: the node that created it made every partition
            prim = creator if creator in owning else ranked(cache, p, sorted(owning))[0]
            return PartRecord(prim, (prim,), 1, False, 1)
        live_isr = [n for n in rec.isr if n in members and n in owning]
        isr = tuple(live_isr) if live_isr else rec.isr      # never empty the set
        # the primary stays while its lease lives and it is OWNING; otherwise the first
        # live in-sync copy takes over (a non-OWNING node does not lead: safe at once)
        prim = rec.primary
        if prim not in live_isr:
            cands = ranked(cache, p, live_isr)
            prim = cands[0] if cands else None
        lost = not live_isr and bool(rec.isr) and all(n in members for n in rec.isr)
        if prim == rec.primary and isr == rec.isr and lost == rec.lost:
            return None
        return PartRecord(prim, isr, rec.epoch + 1, lost, rec.term + (prim != rec.primary))

    # -- requests from primaries ----------------------------------------------------
    def handle_requests(self) -> int:
        """Requests nodes left under ``P/requests/<cache>/<p>/<node>`` (through etcd, so
        a primary cut off from its peers but not from etcd still reaches the controller).
        Each is applied or refused, and deleted either way. Only as read: the write
        that applies one also compares the request's mod revision, so a request its
        node withdrew meanwhile (its wait ran out: ``ControlPlane.request``) or
        replaced is never applied, whatever this view still shows."""
        n = 0
        for key, kv in self.view.items("requests"):
            full = f"{self.prefix}/requests/{key}"
            req = kv.value if isinstance(kv.value, dict) else {}
            try:
                cache, ps, node = key.split("/")
                p = int(ps)
                if req.get("op") == "alter_isr":
                    self.alter_isr(cache, p, node, int(req["term"]), list(req.get("remove", [])),
                                   list(req.get("add", [])), req_key=full, req_mod=kv.mod)
                elif req.get("op") == "set_primary":
                    self.set_primary(cache, p, node, req.get("previous"), req_key=full, req_mod=kv.mod)
                else:
                    raise BadRequest(f"unknown request {req!r}")
                n += 1
            except (NodeError, ValueError, KeyError, TypeError) as e:
                log.info("stage=controller request %s refused: %s", key, e)
                self.etcd.txn([Etcd.mod_is(full, kv.mod)], [], [full])
        return n

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
            rec = PartRecord.from_json(kv.value) if kv else PartRecord()
            if rec.term != term or rec.primary != primary:
                raise StaleEpoch(f"{cache}/{p} is in term {rec.term} with primary {rec.primary}; "
                                 f"{primary} asked in term {term}")
            members = self._members()
            bad = [n for n in add if n not in members]
            if bad:
                raise Unavailable(f"cannot admit {', '.join(bad)} to {cache}/{p}: not a live member")
            if primary in remove:
                raise BadRequest("a primary cannot remove itself from the in-sync set")
            isr = tuple([n for n in rec.isr if n not in remove] + [n for n in add if n not in rec.isr])
            new = PartRecord(rec.primary, isr, rec.epoch + 1, False, rec.term)
            ok, _ = self.etcd.txn([self._guard(), Etcd.mod_is(key, kv.mod if kv else 0)] + req,
                                  [(key, new.to_json(), 0)], [req_key] if req_key else [])
            if not ok:
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
            rec = PartRecord.from_json(kv.value) if kv else PartRecord()
            if rec.primary != previous or node not in rec.isr or node not in self._members():
                raise StaleEpoch(f"{cache}/{p}: {node} cannot take over from {previous} "
                                 f"(record: primary {rec.primary}, in sync {list(rec.isr)})")
            if node not in self._owning().get((cache, p), set()):
                raise StaleEpoch(f"{cache}/{p}: {node} does not report OWNING")
            new = PartRecord(node, rec.isr, rec.epoch + 1, False, rec.term + 1)
            ok, _ = self.etcd.txn([self._guard(), Etcd.mod_is(key, kv.mod if kv else 0)] + req,
                                  [(key, new.to_json(), 0)], [req_key] if req_key else [])
            if not ok and self._withdrawn(req_key, req_mod):
                log.info("stage=handoff %s/%d: request %s was withdrawn (or replaced) before it "
                         "was applied; not applied", cache, p, req_key)
        if ok:
            log.info("stage=handoff %s/%d primary %s -> %s epoch=%d", cache, p, previous, node, new.epoch)
        return new if ok else None

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

    def pin(self, plan: str, moves: list[JsonDoc]) -> int:
        """A plan: each named partition gets exactly the named owners (primary first).
        All or nothing: any bad entry refuses the whole plan. Returns the revision."""
        members = self._members()
        placeable = {n for n, v in members.items() if not v.get("leaving")}
        staged: list[tuple[str, Json, int]] = []
        for i, mv in enumerate(moves):
            cache, p, to = mv["cache"], mv["partition"], mv["to"]
            cc = self.caches.get(cache)
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
            staged.append((f"{self.prefix}/pins/{cache}/{p}", list(to), 0))
        rev = 0
        for i in range(0, len(staged), TXN_BATCH):
            ok, rev = self.etcd.txn([self._guard()], staged[i:i + TXN_BATCH])
            if not ok:
                raise Unavailable(f"{self.me} is no longer the controller; send the plan again")
        log.info("stage=controller plan %s: %d partition(s) pinned", plan, len(staged))
        return rev

    def _check_partition(self, cache: str, p: int) -> None:
        cc = self.caches.get(cache)
        if cc is None or not isinstance(p, int) or not 0 <= p < cc.partitions:
            raise BadRequest(f"no partition {cache}/{p}")


__all__ = ["Controller", "part_key"]
