"""The node's side of the control plane: registration under a lease, state reports,
the local copy of the map (built from etcd's keys), the controller election, the
in-sync protocol's requests, live cluster settings, and the reconcile loop that acts
on each map.

Nothing here talks to etcd directly: :mod:`node.control` does. The controller's own
decisions are in :mod:`node.controller`.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

from . import schema
from .cluster_map import PartRecord
from .config import LIVE_KEYS, NodeConfig, access, apply_each
from .context import NodeContext
from .control import KV, Etcd, Session, View
from .controller import Controller, part_key
from .errors import ConfigError, ControlPlaneDown, NodeError, OutcomeUnknown, Unavailable
from .mapview import MapBuilder
from .reqbatch import GroupCommit
from .states import State

log = logging.getLogger("ferry.node.membership")
REPORT_COALESCE_S = 0.02           # a state change is reported this soon (bursts coalesce)
REPORT_TXN_OPS = 100               # report keys per etcd transaction (etcd's --max-txn-ops: 128)
CONTROLLER_PERIOD_S = 0.5          # the controller re-decides at least this often
START_TIMEOUT_S = 60.0             # a node waits this long for the control plane at start
REQUEST_TIMEOUT_S = 3.0            # a request to the controller (in-sync change, hand-off)
# an admission to the in-sync set waits up to this long while the control plane makes
# progress (a busy controller, not a missing one); under the joining copy's 10 s call
ADMISSION_PATIENCE_S = 8.0
CATCH_UP_S = 1.0                   # a request applied as its wait ran out: the map has this long to show it

# live, cluster-wide settings (P/settings/<name>) -> NodeConfig field: the keys
# declared live in node/config.py
SETTINGS = LIVE_KEYS


VERIFIER_KDF = "scrypt1"       # the verifier's form: its prefix in P/meta's secret_check


def _secret_check(secret: bytes, salt: str) -> str:
    """The verifier of the cluster secret stored in etcd (``P/meta`` ``secret_check``):
    ``scrypt1:`` + HMAC-SHA256 under the handshake key (``transfer.auth.handshake_key``,
    scrypt of the secret) over a random salt. It proves a node holds the secret without
    storing the secret or the key; whoever reads etcd pays one scrypt (32 MiB, about
    70 ms) per guess of the secret, as for a recorded handshake (docs/threat-model.md)."""
    import hashlib
    import hmac

    from transfer.auth import handshake_key
    mac = hmac.new(handshake_key(secret), b"ferry-cluster-secret-check\0" + salt.encode(), hashlib.sha256)
    return f"{VERIFIER_KDF}:{mac.hexdigest()}"


def _legacy_secret_check(secret: bytes, salt: str) -> str:
    """The older verifier (an HMAC under the raw secret: one HMAC per offline guess).
    Only read, to accept a cluster that holds it and replace it (``_ensure_cluster``)."""
    import hashlib
    import hmac
    return hmac.new(secret, b"ferry-cluster-secret-check:" + salt.encode(), hashlib.sha256).hexdigest()


def secret_matches(secret: bytes, salt: str, check: str) -> bool | None:
    """True/False: ``secret`` does/does not match the verifier ``check``; None: a
    verifier form this node does not know (written by a newer Ferry)."""
    import hmac
    if check.startswith(VERIFIER_KDF + ":"):
        return hmac.compare_digest(_secret_check(secret, salt), check)
    if ":" not in check:
        return hmac.compare_digest(_legacy_secret_check(secret, salt), check)
    return None


def require_control_plane(cfg: NodeConfig) -> None:
    if not cfg.control_plane:
        raise ConfigError("no control plane: pass --control-plane http://HOST:PORT (the client "
                          "URL of an etcd 3.4+ cluster; `ferry demo` and LocalCluster start a "
                          "local one) or set [control_plane] endpoints")


class ControlPlane:
    """This node's side of the control plane. ``on_settings(old, new)`` applies a
    changed cluster setting to the rest of the node."""

    def __init__(self, ctx: NodeContext, on_settings: Callable[[NodeConfig, NodeConfig], None]) -> None:
        self.ctx = ctx
        self.on_settings = on_settings
        self.prefix = ctx.cfg.control_prefix
        self.etcd: Etcd                        # set by connect (etcd may not be up yet)
        self.session: Session | None = None
        self.view: View | None = None
        self.controller: Controller | None = None   # while this node is elected
        self._report_lock = threading.Lock()
        self._last_settings: dict[str, object] | None = None
        self.builder = MapBuilder(self.prefix, ctx.cfg.caches)
        ctx.map.map, ctx.map.pending_requests = self.builder.map, self.builder.requests
        # reports: what etcd holds for this node (under its lease), and the partitions
        # whose state changed since (StateTable's hook): only those are written
        self._sent: dict[tuple[str, int], list[object]] = {}
        self._report_pending: set[tuple[str, int]] = set()
        self._pending_lock = threading.Lock()
        # own keys that etcd no longer holds as this node wrote them (deleted, replaced,
        # malformed): the reporter writes them again under the live lease
        self._forced: set[tuple[str, int]] = set()   # report keys, written even if unchanged
        self._member_lost = False                     # the member key is to be put back
        self._deregistered = False                    # a completed leave: nothing is put back
        # requests to the controller made together go in one transaction (node/reqbatch.py)
        self.requests = GroupCommit(self._put_requests)

    # -- start --------------------------------------------------------------------
    def connect(self) -> None:
        """Make sure the cluster exists (create it when this is the first node), register
        under a lease, load the map and start watching. Waits for etcd up to
        START_TIMEOUT_S (a node started before its control plane comes up)."""
        cfg = self.ctx.cfg
        require_control_plane(cfg)
        if self.prefix != cfg.control_prefix:
            self.prefix = cfg.control_prefix
            self.builder = MapBuilder(self.prefix, cfg.caches)
            self.ctx.map.map, self.ctx.map.pending_requests = self.builder.map, self.builder.requests
        self.etcd = Etcd(cfg.control_plane, access=access(cfg))
        self.session = Session(self.etcd, cfg.lease_ttl_s, cfg.lease_margin_s, on_expired=self._reregister)
        self.ctx.session = self.session
        self.view = View(self.etcd, self.prefix, self._on_view_change)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                self._ensure_cluster()
                self._register()
                self.view.load()
                break
            except ControlPlaneDown as e:
                if time.monotonic() > deadline or self.ctx.events.stopping.is_set():
                    raise Unavailable(f"cannot reach the control plane: {e}") from None
                log.warning("stage=control waiting for the control plane: %s", str(e)[:160])
                self.ctx.events.stopping.wait(1.0)
        self.session.start()
        self.view.start()
        threading.Thread(target=self._reporter, name="reporter", daemon=True).start()
        threading.Thread(target=self._control_loop, name="controller", daemon=True).start()
        log.info("stage=join node=%s registered (lease TTL %ds, control plane %s)", self.ctx.id,
                 cfg.lease_ttl_s, ", ".join(cfg.control_plane))

    def _ensure_cluster(self) -> None:
        meta_key = f"{self.prefix}/meta"
        caches = [c.to_wire() for c in sorted(self.ctx.cfg.caches, key=lambda c: c.name)]
        fresh = not any(True for _ in self.ctx.states.items())
        salt = os.urandom(16).hex()
        doc: dict[str, object] = {"caches": caches, "created_by": self.ctx.id, "secret_salt": salt,
                                  "secret_check": _secret_check(self.ctx.secret, salt)}
        if self.ctx.cfg.initial_members:
            doc["initial_members"] = sorted(self.ctx.cfg.initial_members)
        ok, _ = self.etcd.txn([Etcd.mod_is(meta_key, 0)], [(meta_key, doc, 0)])
        kv = self.etcd.get(meta_key)
        if kv is None:
            raise ConfigError(f"the control plane's {meta_key} disappeared while this node started; "
                              "start it again")
        try:
            meta = schema.meta(meta_key, kv)
        except schema.Malformed as e:
            raise ConfigError(f"the control plane's {meta_key} is not a valid Ferry cluster record "
                              f"(revision {kv.mod}: {e.why}); repair or delete that key, or use another "
                              "[control_plane] prefix") from None
        # the cluster secret is checked before this node registers: a node with another
        # secret could not talk to any peer, and would only take partitions it cannot fetch
        want = meta.secret_check
        match = secret_matches(self.ctx.secret, meta.secret_salt, want) if want else True
        if match is None:
            raise ConfigError(f"{meta_key} holds a secret verifier of a form this node does not know "
                              f"({want.partition(':')[0]!r}, written by a newer Ferry): upgrade this node")
        if not match:
            raise ConfigError(f"node {self.ctx.id}'s secret file does not hold this cluster's secret "
                              f"(checked against {meta_key}); use the cluster's secret file")
        if want and not want.startswith(VERIFIER_KDF + ":") and isinstance(kv.value, dict):
            # the older verifier (an HMAC under the raw secret) is replaced by this node,
            # which has just proved it holds the secret; a compare-and-swap on the record
            up = dict(kv.value)
            up["secret_salt"] = os.urandom(16).hex()
            up["secret_check"] = _secret_check(self.ctx.secret, str(up["secret_salt"]))
            done, _ = self.etcd.txn([Etcd.mod_is(meta_key, kv.mod)], [(meta_key, up, 0)])
            if done:
                log.info("stage=join node=%s replaced %s's secret verifier by its scrypt form",
                         self.ctx.id, meta_key)
        have = meta.caches_wire()
        if have != caches:
            raise ConfigError(f"node {self.ctx.id} has a different cache layout than the cluster "
                              f"({caches} != {have}); caches must match on every node")
        creator = meta.created_by
        initial = list(meta.initial_members)
        if fresh and (self.ctx.id in initial or (not initial and creator == self.ctx.id)):
            # a new cluster (no partition record yet: no write was ever acknowledged, so
            # every copy of a partition is the same empty one). Without initial members
            # the creator makes every partition (the others then pull theirs); with
            # them, each makes its rendezvous share over the initial members
            rev, parts = self.etcd.range_prefix(f"{self.prefix}/parts/")
            if not parts or initial:
                n = 0
                from .placement import Placement
                for cache, data in self.ctx.data.items():
                    mine = range(data.cache.partitions) if not initial else \
                        Placement.share(cache, data.cache.partitions, data.cache.backups + 1, initial, self.ctx.id)
                    # (with initial members, a partition that has a record already is
                    # pulled like any other: only record-less ones are new)
                    mine = [p for p in mine if f"{self.prefix}/parts/{cache}/{p}" not in parts]
                    for p in mine:
                        data.create(p)
                    self.ctx.states.set_many([(cache, p, State.OWNING) for p in mine], reason="new cluster")
                    n += len(mine)
                log.info("stage=join node=%s created %d partition(s) of the new cluster%s", self.ctx.id, n,
                         f" (its share among initial members {', '.join(initial)})" if initial else "")

    def _member_doc(self) -> dict[str, object]:
        return {"address": self.ctx.cfg.address, "transfer": self.ctx.transfer_address, "boot": self.ctx.boot,
                "leaving": self.ctx.events.leaving.is_set()}

    def _register(self) -> None:
        """Put this node's whole report, then its member key, under a new lease: the
        controller never sees the member without the report (it removes an in-sync
        copy whose node does not report OWNING)."""
        lease = self._session().grant()
        with self._report_lock:
            with self._pending_lock:
                self._report_pending.clear()
            entries = self._entries()
            keys: list[tuple[str, object, int]] = [(self._report_key(k), v, lease)
                                                   for k, v in sorted(entries.items())]
            member = (f"{self.prefix}/members/{self.ctx.id}", self._member_doc(), lease)
            chunks = [keys[i:i + REPORT_TXN_OPS] for i in range(0, len(keys), REPORT_TXN_OPS)] or [[]]
            chunks[-1].append(member)
            for chunk in chunks:
                self.etcd.txn([], chunk)
            self._sent = dict(entries)
        self._registered_lease = lease

    def _session(self) -> Session:
        """The session (lease) of a connected node."""
        if self.session is None:
            raise ControlPlaneDown("not connected to the control plane yet")
        return self.session

    def _reregister(self) -> None:
        """The lease expired in etcd (cut off, paused, control plane down too long):
        register again. The controller removed this node from every in-sync set
        meanwhile, so its OWNING copies are resynced or evicted by reconcile."""
        while not self.ctx.events.stopping.is_set():
            try:
                self._register()
                log.warning("stage=control node=%s registered again under a new lease", self.ctx.id)
                self.ctx.wake()
                return
            except ControlPlaneDown as e:
                log.info("stage=control cannot register again yet: %s", str(e)[:120])
                self.ctx.events.stopping.wait(0.5)

    def stop(self, leave: bool = False) -> None:
        view = self.view
        if view is not None:
            view.stop()
        sess = self.session
        if sess is not None:
            # a graceful stop keeps the lease: a restart within the TTL keeps this node
            # in the in-sync sets (its copies are whole). A completed leave revokes it.
            sess.stop(revoke=leave)

    # -- reports ------------------------------------------------------------------
    # One key per partition held, ``P/reports/<node>/<cache>/<p>`` = [state, counter],
    # under the node's lease; a state change writes that partition's key only, so a
    # report costs the same at 16 partitions and at 100,000 and no key grows with them.
    def report(self) -> dict[str, dict[str, list[object]]]:
        out: dict[str, dict[str, list[object]]] = {cache: {} for cache in self.ctx.data}
        for (cache, p), e in self._entries().items():
            out.setdefault(cache, {})[str(p)] = e
        return out

    def _entry(self, cache: str, p: int) -> list[object] | None:
        s = self.ctx.states.get(cache, p)
        if s in (State.OWNING, State.MOVING, State.RENTING, State.LOST):
            counter = self.ctx.data[cache].counter(p) if s == State.OWNING else 0
            if s == State.OWNING and (cache, p) in self.ctx.returning:
                return ["RETURNING", counter]
            return [s.value, counter]
        return None

    def _entries(self) -> dict[tuple[str, int], list[object]]:
        out: dict[tuple[str, int], list[object]] = {}
        for (cache, p), _ in self.ctx.states.items():
            if cache in self.ctx.data:
                e = self._entry(cache, p)
                if e is not None:
                    out[(cache, p)] = e
        return out

    def _report_key(self, k: tuple[str, int]) -> str:
        return f"{self.prefix}/reports/{self.ctx.id}/{k[0]}/{k[1]}"

    def report_changed(self, cache: str, p: int) -> None:
        """The state of (cache, p) changed: its report key is written soon."""
        with self._pending_lock:
            self._report_pending.add((cache, p))
        self.ctx.events.report_dirty.set()

    def put_report(self) -> None:
        """Write the report keys of the partitions whose state changed, now. The lock
        orders build and put: an entry built earlier never lands after one built later
        (the controller removes an in-sync copy whose report does not say OWNING)."""
        with self._report_lock:
            with self._pending_lock:
                pending, self._report_pending = self._report_pending, set()
            try:
                puts: list[tuple[str, object, int]] = []
                dels: list[str] = []
                done: dict[tuple[str, int], list[object] | None] = {}
                forced, self._forced = self._forced, set()
                pending |= forced
                for k in sorted(pending):
                    e = self._entry(*k) if k[0] in self.ctx.data else None
                    if self._sent.get(k) == e and k not in forced:
                        continue
                    done[k] = e
                    if e is None:
                        dels.append(self._report_key(k))
                    else:
                        puts.append((self._report_key(k), e, self._session().lease))
                for i in range(0, max(len(puts), len(dels)), REPORT_TXN_OPS // 2):
                    self.etcd.txn([], puts[i:i + REPORT_TXN_OPS // 2], dels[i:i + REPORT_TXN_OPS // 2])
            except BaseException:
                with self._pending_lock:
                    self._report_pending |= pending
                    self._forced |= forced
                raise
            for k, e in done.items():
                if e is None:
                    self._sent.pop(k, None)
                else:
                    self._sent[k] = e

    def _reporter(self) -> None:
        while not self.ctx.events.stopping.is_set():
            self.ctx.events.report_dirty.wait(1.0)
            if self.ctx.events.stopping.wait(REPORT_COALESCE_S):
                return
            if not self.ctx.events.report_dirty.is_set():
                continue
            self.ctx.events.report_dirty.clear()
            try:
                self.put_report()
                if self._member_lost:
                    self._put_member()
            except NodeError as e:
                self.ctx.events.report_dirty.set()
                log.info("stage=control report not sent (%s); retrying", str(e)[:120])
                self.ctx.events.stopping.wait(0.5)

    def _put_member(self) -> None:
        """Put this node's member key back under the live lease (it was deleted or
        replaced while the lease lives): every report key first, as at registration,
        so the controller never sees the member without its report."""
        sess = self.session
        if sess is None or self._deregistered or not sess.valid():
            return       # an expired lease: the session registers again under a new one
        self._member_lost = False
        lease = sess.lease
        try:
            with self._report_lock:
                keys = [(self._report_key(k), v, lease) for k, v in sorted(self._entries().items())]
                for i in range(0, len(keys), REPORT_TXN_OPS):
                    self.etcd.txn([], keys[i:i + REPORT_TXN_OPS])
                if not self._deregistered:
                    self.etcd.txn([], [(f"{self.prefix}/members/{self.ctx.id}", self._member_doc(), lease)])
        except NodeError:
            self._member_lost = True
            raise
        log.warning("stage=control node=%s member key put back under lease %x (it was deleted "
                    "or replaced while the lease lived)", self.ctx.id, lease)

    def _check_own_keys(self, events: list[tuple[str, KV | None]], garbage: list[tuple[str, int]]) -> None:
        """(watch thread) This node's member and report keys must be what it wrote,
        under its lease: one deleted, replaced or malformed is written again (by the
        reporter). Partitions whose record went malformed get a fresh report of this
        node's copy, whose counter the controller may need to rebuild the record."""
        sess = self.session
        if sess is None or self._deregistered:
            return
        lease = sess.lease
        member_key = f"{self.prefix}/members/{self.ctx.id}"
        mine = f"{self.prefix}/reports/{self.ctx.id}/"
        wake = False
        for key, kv in events:
            if key == member_key:
                if kv is None or kv.lease != lease or kv.bad or not isinstance(kv.value, dict) \
                        or kv.value.get("boot") != self.ctx.boot:
                    self._member_lost = wake = True
            elif key.startswith(mine):
                cache, _, ps = key[len(mine):].partition("/")
                if not ps.isdigit():
                    continue
                k = (cache, int(ps))
                sent = self._sent.get(k)
                if (kv is None and sent is None) or (kv is not None and kv.lease == lease and kv.value == sent):
                    continue
                with self._pending_lock:
                    self._forced.add(k)
                wake = True
        for cache, p in garbage:
            if self.ctx.states.get(cache, p) == State.OWNING:
                with self._pending_lock:
                    self._forced.add((cache, p))
                wake = True
        if wake:
            self.ctx.events.report_dirty.set()

    # -- the local map -------------------------------------------------------------
    def _on_view_change(self, events: list[tuple[str, KV | None]]) -> None:
        """Apply a batch of the view's changes to the local map, in place (watch
        thread); the partitions it touched go to the reconcile loop and the controller."""
        rev = self.view.revision if self.view is not None else 0
        with self.ctx.map.lock:
            d = self.builder.apply(events, rev, snapshot=self.view is not None and self.view.snapshot)
            for cache, p, old, rec in d.records:
                if rec.primary != self.ctx.id and old.primary == self.ctx.id:
                    # no longer primary: registrations of moving copies belong to the new
                    # one, and a hand-off fence has done its job (left in place, it would
                    # refuse writes if the role came back here within FENCE_SECONDS)
                    self.ctx.repl.copies.drop((cache, p))
                    self.ctx.repl.fenced.lift((cache, p))
        self._check_own_keys(events, d.garbage)
        self.ctx.map.dirty.add(d.parts)
        self.ctx.map.controller_dirty.add(d.parts)
        with self.ctx.map.changed:
            self.ctx.map.changed.notify_all()
        if d.settings:
            self._apply_settings(dict(self.builder.settings))
        # the controller decides on every change; an election (none, or just won) is
        # looked at at once
        if self.controller is not None or self.builder.map.controller in (None, self.ctx.id):
            self.ctx.events.controller_wake.set()
        if d.parts or d.members or d.controller:
            self.ctx.wake()

    def _apply_settings(self, settings: dict[str, object]) -> None:
        """Apply the stored cluster settings that differ from this node's, each on its
        own (``config.apply_each``): a malformed one is logged once and does not hold
        back the others."""
        with self.ctx.cfg_lock:     # one change of ctx.cfg at a time (the config file too)
            changes: dict[str, object] = {}
            for name, val in settings.items():
                fld = SETTINGS.get(name)
                if fld is None:
                    continue
                if getattr(self.ctx.cfg, fld) != val:
                    changes[name] = val
            if not changes or changes == self._last_settings:
                return
            self._last_settings = changes
            new, refused = apply_each(self.ctx.cfg, changes)
            for name, why in refused.items():
                log.error("stage=settings refused cluster setting %s = %r: %s", name, changes[name], why)
            if new == self.ctx.cfg:
                return
            old, self.ctx.cfg = self.ctx.cfg, new
            self.on_settings(old, new)
            log.info("stage=settings applied cluster settings %s",
                     {k: v for k, v in changes.items() if k not in refused})

    # -- the controller ----------------------------------------------------------------
    def _control_loop(self) -> None:
        """Campaign for the election key; while holding it, decide partition records
        on every change of the view and at least every CONTROLLER_PERIOD_S."""
        key = f"{self.prefix}/controller"
        while not self.ctx.events.stopping.is_set():
            self.ctx.events.controller_wake.wait(CONTROLLER_PERIOD_S)
            self.ctx.events.controller_wake.clear()
            if self.ctx.events.stopping.is_set():
                return
            try:
                # the election key as the watch shows it: no etcd read per round; a won
                # campaign shows up (and wakes this loop) with the next watch event
                view = self.view
                if view is None:
                    continue             # not connected yet
                kv = view.get(key)
                lease = self._session().lease
                if kv is None and self.ctx.lease_valid():
                    self.etcd.txn([Etcd.create_is(key, 0)], [(key, {"id": self.ctx.id, "boot": self.ctx.boot}, lease)])
                    continue
                held = self._election_holder(key, kv)
                if kv is not None and held is None:
                    # nobody holds the election through this key: delete it (as read), so
                    # a new election runs; a put over it would keep its create revision,
                    # which a deposed controller's writes still compare equal to
                    if self.ctx.lease_valid():
                        self.etcd.txn([Etcd.mod_is(key, kv.mod)], [], [key])
                    continue
                mine = (kv is not None and held is not None and held.id == self.ctx.id
                        and held.boot == self.ctx.boot and kv.lease == lease)
                if kv is not None and mine and (self.controller is None
                                                or self.controller.election_rev != kv.create):
                    self.ctx.map.controller_dirty.everything()
                    self.controller = Controller(self.ctx.id, self.prefix, self.etcd, view,
                                                 {c.name: c for c in self.ctx.cfg.caches}, kv.create,
                                                 live=self.ctx.map)
                    log.info("stage=controller node=%s is controller (election revision %d)",
                             self.ctx.id, kv.create)
                elif not mine and self.controller is not None:
                    log.warning("stage=controller node=%s is no longer controller", self.ctx.id)
                    self.controller = None
                if self.controller is not None and self.ctx.lease_valid():
                    self.controller.handle_requests()
                    self.controller.decide()
            except NodeError as e:
                log.info("stage=controller round failed: %s", str(e)[:160])
                self.ctx.events.stopping.wait(0.2)
            except Exception:  # noqa: BLE001 - the controller's loop goes on after a bug
                log.exception("stage=controller round crashed")
                self.ctx.events.stopping.wait(0.5)

    def _election_holder(self, key: str, kv: KV | None) -> schema.ControllerDoc | None:
        """The node the election key names, if it holds the election: a valid value,
        under a lease, naming a live member whose member key is under the same lease
        (a node puts both under its one lease). None for anything else: a malformed
        value, a key put by hand without a lease, a node that is not a member."""
        if kv is None:
            return None
        try:
            doc = schema.controller(key, kv)
        except schema.Malformed as e:
            schema.log_malformed(e, "deleted: a new election runs", log)
            return None
        member = self.view.get(f"{self.prefix}/members/{doc.id}") if self.view is not None else None
        if kv.lease == 0 or member is None or member.lease != kv.lease:
            why = ("it is not under a lease" if kv.lease == 0 else f"{doc.id} is not a live member"
                   if member is None else f"{doc.id}'s member key is under another lease")
            schema.log_malformed(schema.Malformed(key, kv.mod, f"names {doc.id}, but {why}"),
                                 "deleted: a new election runs", log)
            return None
        return doc

    # -- requests to the controller, through etcd ---------------------------------------------
    def _put_requests(self, items: list[tuple[str, dict[str, object]]]) -> int:
        """One transaction putting every request of ``items`` under this node's lease."""
        lease = self._session().lease
        rev = self.etcd.txn([], [(k, doc, lease) for k, doc in items])[1]
        self.ctx.metrics.inc("ferry_node_controller_request_txns_total")
        self.ctx.metrics.inc("ferry_node_controller_requests_total", len(items))
        return rev

    def request(self, cache: str, p: int, doc: dict[str, object], done: Callable[[PartRecord], bool],
                timeout: float = REQUEST_TIMEOUT_S, patience: float = 0.0) -> PartRecord:
        """Leave a request for the controller at ``P/requests/<cache>/<p>/<me>`` and wait
        until the map shows a record for which ``done(record)`` holds; that record is in
        this node's map on return. Refused (the controller deleted the request without
        such a record), or the control plane unreachable when it is put: Unavailable.

        ``patience`` (seconds, 0: none): when ``timeout`` runs out while the control
        plane is making progress (a live controller, and the map moved on during the
        wait: the controller is busy, not missing), wait another ``timeout``, up to
        ``patience`` in all; a busy controller then works through its queue instead of
        finding every request withdrawn and put again.

        Not answered in time: the request is withdrawn (deleted only if it is
        still the one put here, by its mod revision), so it can never be applied later
        (the controller applies a request only as it read it). If the controller decided
        it just before, the record in etcd says how (:meth:`_decided`). If the
        withdrawal itself fails (etcd unreachable), the request may still be applied:
        :class:`~node.errors.OutcomeUnknown`, a kind of Unavailable, carrying the key and
        the revision of the put, for a caller that must assume the worst until its map
        is at or past that revision without the key."""
        key = f"{self.prefix}/requests/{cache}/{p}/{self.ctx.id}"
        # in one transaction with the other requests this node makes meanwhile; a
        # transaction, not a plain put: etcd before 3.4.27 / 3.5.10 costs a plain put under
        # a lease time proportional to the keys on that lease (every report key of this
        # node), which a put inside a transaction does not pay (etcd #15993)
        rev = self.requests.submit(key, doc)
        what = f"{doc.get('op')} of {cache}/{p}"
        m = self.ctx.map

        def look() -> PartRecord | None:
            rec = m.map.parts[cache][p]
            if done(rec):
                return rec
            if m.answered(key, rev):
                # applied records come in the same revision as the deletion: refused
                raise Unavailable(f"the controller refused {what} (record now: primary "
                                  f"{rec.primary}, in sync {list(rec.isr)}, epoch {rec.epoch}); "
                                  "see the controller's log")
            return None

        start = time.monotonic()
        seen = max(m.map.epoch, rev)          # the request's own put is no progress
        deadline = start + timeout
        while True:
            rec = m.wait_for(look, deadline)
            if rec is not None:
                return rec
            now = time.monotonic()
            with m.lock:
                busy = m.map.epoch > seen and m.map.controller in m.map.members
                seen = m.map.epoch
            if not busy or now - start >= patience:
                break
            deadline = min(start + patience, now + timeout)
        waited = time.monotonic() - start
        # out of time: withdraw it (outside the map's condition: the watch thread needs it)
        try:
            withdrawn, _ = self.etcd.txn([Etcd.mod_is(key, rev)], [], [key])
        except NodeError as e:
            raise OutcomeUnknown(f"no answer from the controller to {what} in {waited:.1f}s, and "
                                 f"the request could not be withdrawn ({str(e)[:120]}): it may "
                                 "still be applied", key=key, rev=rev) from None
        if withdrawn:
            raise Unavailable(f"no answer from the controller to {what} in {waited:.1f}s (no "
                              "controller, or etcd unreachable); the request was withdrawn")
        return self._decided(cache, p, key, rev, what, done)

    def _decided(self, cache: str, p: int, key: str, rev: int, what: str,
                 done: Callable[[PartRecord], bool]) -> PartRecord:
        """The request at ``key`` (put at ``rev``) was no longer there to withdraw: the
        controller decided it (or the lease took it) after the wait ran out. The record
        in etcd, not the map, says how; an applied one is returned once the map shows
        it too (up to CATCH_UP_S)."""
        try:
            kv = self.etcd.get(part_key(self.prefix, cache, p))
        except NodeError as e:
            raise OutcomeUnknown(f"the controller decided {what} as the wait ran out, and its "
                                 f"record cannot be read ({str(e)[:120]})", key=key, rev=rev) from None
        try:
            rec = schema.record(part_key(self.prefix, cache, p), kv) if kv is not None else PartRecord()
        except schema.Malformed as e:
            schema.log_malformed(e, f"{what}: read as no record", log)
            rec = PartRecord()
        if not done(rec):
            raise Unavailable(f"the controller refused {what} (record now: primary {rec.primary}, "
                              f"in sync {list(rec.isr)}, epoch {rec.epoch}); see the controller's log")
        m = self.ctx.map
        not_shown = OutcomeUnknown(f"the controller applied {what} as the wait ran out; this "
                                   "node's map does not show it yet", key=key, rev=rev)
        applied_at = kv.mod if kv is not None else 0

        def look() -> PartRecord | None:
            if m.map.epoch < applied_at:
                return None
            mine = m.map.parts[cache][p]
            if done(mine):
                return mine
            raise not_shown        # past it, with the record changed again: not to rely on

        mine = m.wait_for(look, time.monotonic() + CATCH_UP_S)
        if mine is None:           # the map is still behind etcd
            raise not_shown
        return mine

    # -- the in-sync set, primary side ----------------------------------------------------
    def alter_isr(self, cache: str, p: int, remove: list[str] = [], add: list[str] = []) -> PartRecord:  # noqa: B006 (read only)
        """Primary (partition lock held): have the controller change p's in-sync set;
        the new record is in this node's map before this returns."""
        with self.ctx.map.lock:
            epoch, term = self.ctx.map.map.parts[cache][p].epoch, self.ctx.map.map.parts[cache][p].term
        rm, ad = set(remove), set(add)
        # an admission runs outside p's lock (writes go on): it may wait for a busy
        # controller; a removal holds the lock of a write that waits for it: it may not
        return self.request(cache, p, {"op": "alter_isr", "term": term, "remove": sorted(rm),
                                       "add": sorted(ad)},
                            lambda r: r.epoch > epoch and not (rm & set(r.isr)) and ad <= set(r.isr)
                            and r.primary == self.ctx.id,
                            patience=ADMISSION_PATIENCE_S if ad and not rm else 0.0)

    # -- leave --------------------------------------------------------------------------
    def start_leave(self) -> None:
        self.ctx.events.leaving.set()
        try:
            self.etcd.put(f"{self.prefix}/members/{self.ctx.id}", self._member_doc(), lease=self._session().lease)
        except NodeError as e:
            log.warning("stage=leave cannot mark this node leaving yet: %s", e)

    def finish_leave(self) -> None:
        self._deregistered = True        # the deletions below are not put back
        try:
            self.etcd.txn([], [], [f"{self.prefix}/members/{self.ctx.id}", f"{self.prefix}/reports/{self.ctx.id}"],
                          prefixes=[f"{self.prefix}/reports/{self.ctx.id}/"])
        except NodeError as e:
            self._deregistered = False
            log.info("stage=leave waiting for the control plane: %s", e)
            return
        log.info("stage=leave node=%s holds nothing; left the cluster", self.ctx.id)
        self.ctx.events.left.set()


__all__ = ["ControlPlane", "SETTINGS", "require_control_plane"]
