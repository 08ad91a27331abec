"""The one module that talks to etcd (the control plane). Nothing else touches etcd.

Three small pieces over the ``etcd3gw`` client (etcd's v3 JSON gateway):

- :class:`Etcd`: range, put, compare-and-swap transactions, leases and a resumable
  watch, tried against each configured endpoint in turn. Transport failures become
  :class:`ControlPlaneDown` at this boundary.
- :class:`Session`: one lease kept alive by a thread. :meth:`Session.valid` is the
  fence of a primary: it is true only until ``sent + TTL - margin`` of the last
  successful keepalive, measured on this process's monotonic clock from the moment
  the keepalive was *sent* (etcd's expiry cannot come earlier than that, clock rate
  drift aside, which the margin covers; docs/node.md has the argument).
- :class:`View`: a local copy of every key under the cluster prefix, loaded with one
  range and kept current by a watch from the next revision. A broken or silent stream
  is resumed from the last revision seen; a compacted one reloads everything.

Values are JSON. The key layout (``docs/node.md``, "Control plane"):
``P/meta``, ``P/members/<node>`` (lease), ``P/reports/<node>`` (lease),
``P/controller`` (lease; the election), ``P/parts/<cache>/<p>``, ``P/pins/<cache>/<p>``,
``P/settings/<name>``. What each value must hold is checked by :mod:`node.schema`; a
value that is not JSON is delivered with ``KV.bad`` saying why, never as an exception.
"""
from __future__ import annotations

import base64
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, TypeVar
from urllib.parse import urlparse

from .errors import (ConfigError, ControlPlaneDown, ControlPlaneError, ControlPlaneTLSError, LeaseGone,
                     NodeError, WatchCompacted)
from .jsonvalue import Json, JsonDoc

log = logging.getLogger("ferry.node.control")
T = TypeVar("T")
if TYPE_CHECKING:
    from etcd3gw import Etcd3Client

REQUEST_TIMEOUT_S = 2.0      # one etcd request; a lease TTL is 2 s or more
WATCH_IDLE_S = 3.0           # a watch stream silent this long is re-opened from its revision


def _b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def _unb64(s: str) -> bytes:
    return base64.b64decode(s) if s else b""


def _prefix_end(prefix: str) -> str:
    b = bytearray(prefix.encode())
    b[-1] += 1
    return bytes(b).decode()


@dataclass(frozen=True)
class KV:
    value: Json         # decoded JSON (None for a value that is not JSON)
    mod: int            # mod_revision
    create: int         # create_revision
    lease: int
    bad: str = ""       # why the value is not JSON ("" when it is): node/schema.py refuses it


def _decode(raw: bytes) -> tuple[Json, str]:
    """(the JSON value, "") or (None, why it is not JSON). Never raises: a value nested
    deeper than the parser's recursion limit is refused like any other garbage."""
    if not raw:
        return None, "empty value, not JSON"
    try:
        return json.loads(raw), ""
    except RecursionError:
        return None, f"not JSON: nested too deep ({len(raw)} bytes)"
    except ValueError as e:
        return None, f"not JSON ({str(e)[:80]})"


def _kv(item: JsonDoc) -> tuple[str, KV]:
    val, bad = _decode(_unb64(item.get("value", "")))
    # a key that is not UTF-8 keeps its bytes visible (and distinct); it matches no
    # key the nodes read, so it is ignored
    return (_unb64(item["key"]).decode("utf-8", "backslashreplace"),
            KV(val, int(item.get("mod_revision", 0)), int(item.get("create_revision", 0)),
               int(item.get("lease", 0)), bad))


def _chain_text(e: BaseException | None) -> str:
    """The messages of an exception and of every exception it came from."""
    out, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        out.append(f"{type(e).__name__}: {e}")
        e = e.__cause__ or e.__context__
    return " <- ".join(out)


def parse_endpoints(endpoints: list[str] | tuple[str, ...]) -> list[tuple[str, str, int]]:
    out = []
    for e in endpoints:
        u = urlparse(e if "://" in e else "http://" + e)
        if u.scheme not in ("http", "https") or not u.hostname or not u.port:
            raise ConfigError(f"control plane endpoint {e!r}: expected http://HOST:PORT "
                              "(an etcd client URL, e.g. http://127.0.0.1:2379)")
        out.append((u.scheme, u.hostname, u.port))
    if not out:
        raise ConfigError("no control plane endpoint: pass --control-plane http://HOST:PORT "
                          "(an etcd 3.4+ cluster's client URL)")
    return out


class Etcd:
    """etcd's v3 API through etcd3gw, with failover between endpoints."""

    def __init__(self, endpoints: list[str] | tuple[str, ...], timeout: float = REQUEST_TIMEOUT_S) -> None:
        import etcd3gw
        self.endpoints = list(endpoints)
        self.timeout = timeout
        self._clients = [etcd3gw.client(host=h, port=p, protocol=s, timeout=timeout, api_path="/v3/")
                         for s, h, p in parse_endpoints(endpoints)]
        for c in self._clients:
            # requests would read the proxy variables and ~/.netrc again for every call:
            # a fifth of the controller's CPU at 1,000 nodes; the endpoints are explicit
            c.session.trust_env = False
        self._cur = 0

    def _call(self, fn: Callable[[Etcd3Client], T]) -> T:
        """``fn`` against each endpoint in turn. Every failure leaves as one of the
        node's own errors, so no caller (a reporter thread, a controller round) dies of
        an exception type it does not know: transport failures and "leader changed" /
        "no leader" / timeouts as :class:`ControlPlaneDown` (retryable, after trying
        every endpoint), an expired or unknown lease as :class:`LeaseGone`, anything
        else etcd refuses (request too large, permission denied, a malformed answer) as
        :class:`ControlPlaneError`."""
        from etcd3gw import exceptions as ex
        last: Exception | None = None
        n = len(self._clients)
        start = self._cur
        for i in range(n):
            idx = (start + i) % n
            c = self._clients[idx]
            try:
                out = fn(c)
                self._cur = idx
                return out
            except (ex.ConnectionFailedError, ex.ConnectionTimeoutError, ex.InternalServerError) as e:
                last = e
            except ex.Etcd3Exception as e:
                # "etcdserver: leader changed", "no leader", request timed out: try another member
                msg = str(getattr(e, "detail_text", "") or e)
                if any(w in msg for w in ("leader", "timed out", "unavailable", "stopped")):
                    last = e
                    continue
                if "lease not found" in msg or "Not Found" in msg or "requested lease" in msg:
                    raise LeaseGone(f"etcd: the lease is gone ({msg.strip()[:160]})") from None
                raise ControlPlaneError(f"etcd refused the request: {msg.strip()[:200] or type(e).__name__}") from None
            except NodeError:
                raise
            except (ValueError, KeyError, TypeError) as e:
                raise ControlPlaneError(f"etcd sent an answer that cannot be read: {type(e).__name__}: "
                                        f"{str(e)[:160]}") from None
        why = (str(last).strip() or type(last).__name__)[:200] if last else "no endpoint answered"
        chain = _chain_text(last)
        if "CERTIFICATE_VERIFY_FAILED" in chain or "certificate verify failed" in chain.lower():
            why = chain[chain.lower().find("certificate verify failed"):][:160] or why
        if "CERTIFICATE_VERIFY_FAILED" in why or "certificate verify failed" in why.lower():
            # not a matter of waiting: say so at once instead of "unreachable" for 60 s
            raise ControlPlaneTLSError(
                f"control plane {', '.join(self.endpoints)}: TLS certificate verification failed "
                f"({why[:160]}): the server's certificate is not signed by a CA this node trusts, "
                "names another host, or has expired (the node verifies against the CA bundle of "
                "Python's requests; the environment's REQUESTS_CA_BUNDLE is not read)")
        raise ControlPlaneDown(f"control plane (etcd at {', '.join(self.endpoints)}) unreachable: "
                               f"{why}; is etcd running there?")

    def post(self, path: str, body: JsonDoc) -> JsonDoc:
        return self._call(lambda c: c.post(c.get_url(path), json=body))

    # -- keys ---------------------------------------------------------------------
    def range_prefix(self, prefix: str) -> tuple[int, dict[str, KV]]:
        r = self.post("/kv/range", {"key": _b64(prefix), "range_end": _b64(_prefix_end(prefix))})
        return int(r["header"]["revision"]), dict(_kv(i) for i in r.get("kvs", []))

    def get(self, key: str) -> KV | None:
        r = self.post("/kv/range", {"key": _b64(key)})
        kvs = r.get("kvs", [])
        return _kv(kvs[0])[1] if kvs else None

    def put(self, key: str, value: Json, lease: int = 0) -> int:
        body: JsonDoc = {"key": _b64(key), "value": _b64(json.dumps(value, sort_keys=True))}
        if lease:
            body["lease"] = str(lease)
        return int(self.post("/kv/put", body)["header"]["revision"])

    def delete(self, key: str) -> None:
        self.post("/kv/deleterange", {"key": _b64(key)})

    def txn(self, compare: list[JsonDoc], puts: list[tuple[str, Json, int]],
            deletes: list[str] = (), prefixes: list[str] = ()) -> tuple[bool, int]:   # type: ignore[assignment]
        """All of ``compare`` hold -> every put (key, value, lease), delete and delete
        of every key under each of ``prefixes``; returns (succeeded, revision)."""
        ops: list[JsonDoc] = []
        for k, v, lease in puts:
            put: JsonDoc = {"key": _b64(k), "value": _b64(json.dumps(v, sort_keys=True))}
            if lease:
                put["lease"] = str(lease)
            ops.append({"request_put": put})
        ops += [{"request_delete_range": {"key": _b64(k)}} for k in deletes]
        ops += [{"request_delete_range": {"key": _b64(k), "range_end": _b64(_prefix_end(k))}}
                for k in prefixes]
        r = self.post("/kv/txn", {"compare": compare, "success": ops})
        return bool(r.get("succeeded", False)), int(r["header"]["revision"])

    @staticmethod
    def mod_is(key: str, rev: int) -> JsonDoc:
        """Compare: ``key``'s mod revision is ``rev`` (0: the key does not exist)."""
        return {"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(rev)}

    @staticmethod
    def create_is(key: str, rev: int) -> JsonDoc:
        return {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": str(rev)}

    # -- leases -------------------------------------------------------------------
    def grant(self, ttl: int) -> tuple[int, int]:
        r = self.post("/lease/grant", {"TTL": str(int(ttl))})
        return int(r["ID"]), int(r["TTL"])

    def keepalive(self, lease: int) -> int:
        """The lease's TTL after the refresh; <= 0 when it has expired."""
        r = self.post("/lease/keepalive", {"ID": str(lease)})
        return int(r.get("result", {}).get("TTL", -1))

    def revoke(self, lease: int) -> None:
        self.post("/kv/lease/revoke", {"ID": str(lease)})

    # -- watch --------------------------------------------------------------------
    def watch(self, prefix: str, start_revision: int, stop: threading.Event,
              idle: float = WATCH_IDLE_S) -> Iterator[tuple[int, list[tuple[str, str, KV | None]]]]:
        """(revision, [(type PUT/DELETE, key, KV or None)]) batches from ``start_revision``
        until the stream breaks or stays silent ``idle`` seconds (then it just ends: the
        caller resumes). Raises :class:`~node.errors.WatchCompacted` when etcd no longer
        has ``start_revision``.

        The revision of a batch is the mod revision of its **last event**, never the
        response header's: a header names the store's revision when the response was
        built, which can be far ahead of the events delivered so far (etcd sends a
        backlog in several responses, each with the current header). Resuming from
        header + 1 would skip the events in between; etcd's own Go client resumes from
        the last event's revision + 1, as this does. Responses without events (the
        creation, progress notifications) are not yielded."""
        c = self._clients[self._cur]
        req = {"create_request": {"key": _b64(prefix), "range_end": _b64(_prefix_end(prefix)),
                                  "start_revision": str(start_revision), "progress_notify": True}}
        import requests
        try:
            resp = c.session.post(c.get_url("/watch"), json=req, stream=True,
                                  timeout=(self.timeout, idle))
        except requests.RequestException as e:
            self._cur = (self._cur + 1) % len(self._clients)
            raise ControlPlaneDown(f"watch on {c.base_url}: {e}") from None
        try:
            for line in resp.iter_lines(chunk_size=None):
                if stop.is_set():
                    return
                if not line.strip():
                    continue
                res = json.loads(line).get("result", {})
                if res.get("compact_revision") and res.get("canceled"):
                    raise WatchCompacted(int(res["compact_revision"]))
                if res.get("canceled"):
                    return
                evs = []
                last = 0
                for e in res.get("events", []):
                    key, kv = _kv(e["kv"])
                    typ = e.get("type", "PUT")
                    evs.append((typ, key, kv if typ == "PUT" else None))
                    last = max(last, kv.mod)
                if evs:
                    yield last, evs
        except (requests.RequestException, OSError, ValueError):
            return          # broken or idle: the caller resumes from its revision
        finally:
            resp.close()


class Session:
    """A lease kept alive by a thread. ``valid()`` is the fence: true only while the
    lease is certainly alive in etcd. ``on_expired`` runs (in the keepalive thread)
    when etcd says the lease is gone; the owner registers again under a new one."""

    def __init__(self, etcd: Etcd, ttl: int, margin: float,
                 on_expired: Callable[[], None] | None = None) -> None:
        if ttl < 2:
            raise ConfigError(f"control_plane.lease_ttl_s must be >= 2 (etcd's lease "
                              f"granularity and minimum), not {ttl}")
        if not 0 <= margin < ttl / 2:
            raise ConfigError(f"control_plane.lease_margin_s must be 0..{ttl / 2:.1f} s "
                              f"(less than half the TTL), not {margin}")
        self.etcd, self.ttl, self.margin = etcd, ttl, margin
        self.on_expired = on_expired
        self.lease = 0
        self._valid_until = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._renewing = threading.Event()

    def valid(self) -> bool:
        return time.monotonic() < self._valid_until

    def remaining(self) -> float:
        return max(0.0, self._valid_until - time.monotonic())

    def grant(self) -> int:
        t0 = time.monotonic()
        lease, ttl = self.etcd.grant(self.ttl)
        with self._lock:
            self.lease = lease
            self._valid_until = t0 + ttl - self.margin
        # kept alive from now on: a registration that takes longer than the TTL (a node
        # writing thousands of report keys) must not lose the lease it writes under
        self.start()
        return lease

    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._loop, name="lease-keepalive", daemon=True)
        self._thread.start()

    def _expired(self) -> None:
        """Run ``on_expired`` on a thread of its own, so keepalives of the lease it
        grants go on meanwhile; one at a time."""
        if self.on_expired is None or self._renewing.is_set():
            return
        self._renewing.set()

        def run() -> None:
            try:
                self.on_expired()      # type: ignore[misc]
            except Exception:
                log.exception("stage=control re-registration failed; retrying")
            finally:
                self._renewing.clear()
        threading.Thread(target=run, name="lease-renew", daemon=True).start()

    def _loop(self) -> None:
        # several keepalives per TTL, so one lost request does not cost the fence
        period = max(0.2, self.ttl / 5)
        while not self._stop.wait(period):
            lease = self.lease
            if not lease:
                continue
            t0 = time.monotonic()
            try:
                ttl = self.etcd.keepalive(lease)
            except LeaseGone:
                ttl = -1                # etcd no longer knows it: expired
            except ControlPlaneDown as e:
                if self.valid() and self._valid_until - time.monotonic() < period * 2:
                    log.warning("stage=control lease %x keepalive failing (%s); fence in %.1fs",
                                lease, str(e)[:120], self.remaining())
                continue
            except Exception as e:     # a malformed answer must not stop the keepalives
                log.warning("stage=control lease keepalive error: %s", e)
                continue
            if ttl > 0:
                with self._lock:
                    if self.lease == lease:
                        self._valid_until = t0 + ttl - self.margin
            else:
                with self._lock:
                    if self.lease != lease:
                        continue
                    self._valid_until = 0.0
                log.warning("stage=control lease %x expired in etcd; registering again", lease)
                self._expired()

    def stop(self, revoke: bool = False) -> None:
        self._stop.set()
        self._valid_until = 0.0
        if revoke and self.lease:
            try:
                self.etcd.revoke(self.lease)
            except Exception:
                pass


Event = tuple[str, "KV | None"]     # (key, its value now; None: deleted)


class View:
    """Every key under ``prefix``, kept current by a watch that resumes from the last
    event it delivered. ``on_change(events)`` runs in the watch thread (or the
    caller of :meth:`load`) after each batch with ``[(key, KV or None), ...]``: the
    keys that changed and their values now (None: deleted). The first load delivers
    every key; a reload after a compaction delivers only what differs from the copy
    held (reload and diff), so a consumer that applies events in place stays exact."""

    def __init__(self, etcd: Etcd, prefix: str, on_change: Callable[[list[Event]], None]) -> None:
        self.etcd, self.prefix, self.on_change = etcd, prefix, on_change
        self.kvs: dict[str, KV] = {}
        # first path segment under the prefix ("members", "parts", ...) -> key -> KV
        self._by_sub: dict[str, dict[str, KV]] = {}
        self.revision = 0
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reloads = 0
        self.snapshot = False     # True while on_change delivers a load, not watch events

    def _sub(self, key: str) -> str:
        rest = key[len(self.prefix) + 1:]
        i = rest.find("/")
        return rest if i < 0 else rest[:i]

    def _set(self, key: str, kv: KV | None) -> None:
        sub = self._by_sub.setdefault(self._sub(key), {})
        if kv is None:
            self.kvs.pop(key, None)
            sub.pop(key, None)
        else:
            self.kvs[key] = kv
            sub[key] = kv

    def load(self) -> None:
        """Read everything (one range) and deliver what differs from the copy held."""
        rev, kvs = self.etcd.range_prefix(self.prefix)
        with self.lock:
            events: list[Event] = [(k, None) for k in self.kvs if k not in kvs]
            events += [(k, v) for k, v in kvs.items() if self.kvs.get(k) != v]
            for k, v in events:
                self._set(k, v)
            self.revision = rev
            self.reloads += 1
        # a load delivers values, not the history between them: a consumer that needs
        # to know whether it saw every change of a key reads ``snapshot`` (True here)
        self.snapshot = True
        try:
            self.on_change(events)
        finally:
            self.snapshot = False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="control-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def apply(self, rev: int, evs: list[tuple[str, str, KV | None]]) -> list[Event]:
        """Apply one watch batch (events at revisions up to ``rev``); the changes."""
        with self.lock:
            out: list[Event] = []
            for typ, key, kv in evs:
                v = None if typ == "DELETE" else kv
                self._set(key, v)
                out.append((key, v))
            if rev > self.revision:
                self.revision = rev
        return out

    def _loop(self) -> None:
        reload = not self.revision
        while not self._stop.is_set():
            try:
                if reload:
                    self.load()
                    reload = False
                for rev, evs in self.etcd.watch(self.prefix, self.revision + 1, self._stop):
                    changed = self.apply(rev, evs)
                    if changed:
                        self.on_change(changed)
            except WatchCompacted:
                log.info("stage=control watch fell behind a compaction; reloading and diffing")
                reload = True
            except ControlPlaneDown as e:
                log.debug("stage=control watch: %s", e)
                self._stop.wait(0.2)
            except Exception:
                log.exception("stage=control watch failed; reloading")
                reload = True
                self._stop.wait(0.2)

    def get(self, key: str) -> KV | None:
        with self.lock:
            return self.kvs.get(key)

    def items(self, sub: str) -> list[tuple[str, KV]]:
        """(key without ``prefix/sub/``, KV) of every key under ``prefix/sub/``; costs
        the number of such keys, not of all keys."""
        head = f"{self.prefix}/{sub}/"
        with self.lock:
            return [(k[len(head):], v) for k, v in self._by_sub.get(sub, {}).items() if k.startswith(head)]


__all__ = ["Etcd", "Session", "View", "KV", "parse_endpoints"]
