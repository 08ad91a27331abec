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
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Sequence, TypeVar
from urllib.parse import urlparse

from .errors import (ConfigError, ControlPlaneDown, ControlPlaneError, ControlPlaneTLSError, LeaseGone,
                     NodeError, WatchCompacted)
from .jsonvalue import Json, JsonDoc, WireDoc

log = logging.getLogger("ferry.node.control")
T = TypeVar("T")
if TYPE_CHECKING:
    from etcd3gw import Etcd3Client

    from .etcdhttp import LeanSession

REQUEST_TIMEOUT_S = 2.0      # one etcd request; a lease TTL is 2 s or more
WATCH_IDLE_S = 3.0           # a watch stream silent this long is re-opened from its revision
MAX_PASSWORD_FILE = 4096

# the environment's credentials, read when a caller names none (the ferry cluster and
# validate commands; a node's [control_plane] keys win over them)
ENV_CA, ENV_CERT, ENV_KEY = "FERRY_ETCD_CA", "FERRY_ETCD_CERT", "FERRY_ETCD_KEY"
ENV_USER, ENV_PASSWORD_FILE = "FERRY_ETCD_USER", "FERRY_ETCD_PASSWORD_FILE"


class ControlPlaneAccessError(ConfigError):
    """etcd refused who this client is or what it asked for: a client certificate it
    does not trust, a wrong user or password, no user where auth is on, a key outside
    the user's roles. Not a matter of waiting: a node stops at start (exit status 2)."""

    code = "config"


@dataclass(frozen=True)
class EtcdAccess:
    """How a client proves itself to etcd: the CA that signed etcd's server certificate
    (``ca``; None: the system's bundle), a client certificate and its key (etcd's
    ``--client-cert-auth``), and an etcd user with a file holding its password (etcd's
    RBAC; the HTTP gateway Ferry uses ignores a certificate's common name, so the user
    logs in with the password and sends the token etcd returns)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    user: str | None = None
    password_file: str | None = None

    @classmethod
    def from_env(cls, env: "os._Environ[str] | dict[str, str] | None" = None) -> "EtcdAccess":
        e = os.environ if env is None else env
        return cls(e.get(ENV_CA) or None, e.get(ENV_CERT) or None, e.get(ENV_KEY) or None,
                   e.get(ENV_USER) or None, e.get(ENV_PASSWORD_FILE) or None)

    @property
    def empty(self) -> bool:
        return not (self.ca or self.cert or self.key or self.user or self.password_file)

    def check(self, endpoints: list[str] | tuple[str, ...] = (),
              name: Callable[[str], str] = lambda k: f"control_plane.{k}") -> None:
        """ConfigError naming the setting when the settings cannot work together.
        ``name``: how the messages name a setting (``ca``, ``cert``, ``key``, ``user``,
        ``password_file``, ``endpoints``): the config key by default, a command's
        option where a command line gave them."""
        for key, path in (("ca", self.ca), ("cert", self.cert), ("key", self.key),
                          ("password_file", self.password_file)):
            if path is not None and (not isinstance(path, str) or not os.path.isfile(path)):
                raise ConfigError(f"{name(key)} {path!r} is not a file")
        if bool(self.cert) != bool(self.key):
            raise ConfigError(f"{name('cert')} and {name('key')} go together (the client "
                              "certificate and its private key, e.g. from ferry certs issue)")
        if self.user is not None and (not isinstance(self.user, str) or not self.user):
            raise ConfigError(f"{name('user')} must be an etcd user name, not {self.user!r}")
        if bool(self.user) != bool(self.password_file):
            raise ConfigError(f"{name('user')} and {name('password_file')} go together "
                              "(an etcd user and a file holding its password; never a literal)")
        if (self.ca or self.cert) and endpoints:
            plain = [e for e in endpoints if not e.startswith("https://")]
            if plain:
                raise ConfigError(f"{name('endpoints')} {', '.join(plain)}: with a ca or "
                                  "client certificate set, etcd is reached over https://")

    def password(self) -> str:
        assert self.password_file is not None
        try:
            with open(self.password_file, "rb") as f:
                raw = f.read(MAX_PASSWORD_FILE + 1)
        except OSError as e:
            raise ConfigError(f"cannot read control_plane.password_file {self.password_file}: "
                              f"{e.strerror}") from None
        pw = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not pw or len(raw) > MAX_PASSWORD_FILE or "\n" in pw:
            raise ConfigError(f"control_plane.password_file {self.password_file} must hold one "
                              "line: the etcd user's password")
        return pw


def _describe(path: str, body: WireDoc) -> str:
    """What a request asked for, in words, naming its keys."""
    def key_of(d: WireDoc) -> str:
        k = _unb64(str(d.get("key", ""))).decode("utf-8", "backslashreplace")
        end = d.get("range_end")
        return f"the keys under {k}" if end else k
    if path == "/kv/txn":
        keys: list[str] = []
        for c in body.get("compare", []) or []:         # type: ignore[union-attr]
            keys.append(key_of(c))                       # type: ignore[arg-type]
        for op in body.get("success", []) or []:        # type: ignore[union-attr]
            for v in op.values():                        # type: ignore[union-attr]
                keys.append(key_of(v))
        uniq = list(dict.fromkeys(keys))
        return "write " + ", ".join(uniq[:3]) + (f" (+{len(uniq) - 3} more)" if len(uniq) > 3 else "")
    verb = {"/kv/range": "read", "/kv/put": "write", "/kv/deleterange": "delete"}.get(path)
    if verb:
        return f"{verb} {key_of(body)}"
    if path.startswith("/lease") or path.startswith("/kv/lease"):
        return f"{path.rsplit('/', 1)[-1]} a lease (its keys' write permission)"
    return f"call {path}"


def _b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def _unb64(s: str) -> bytes:
    return base64.b64decode(s) if s else b""


def _prefix_end(prefix: str) -> str:
    b = bytearray(prefix.encode())
    b[-1] += 1
    return bytes(b).decode()


def b64(s: str | bytes) -> str:
    """A key or value as the etcd gateway takes it (base64)."""
    return _b64(s)


def prefix_end(prefix: str) -> str:
    """The end of the key range of everything under ``prefix`` (exclusive)."""
    return _prefix_end(prefix)


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


def _kv(item: WireDoc) -> tuple[str, KV]:
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


def _session(a: EtcdAccess) -> "LeanSession":
    """One endpoint's HTTP session: plain-http calls over kept-alive connections
    (:mod:`node.etcdhttp`), TLS through requests with ``a``'s CA and certificate (as
    etcd3gw configures its own)."""
    from .etcdhttp import LeanSession
    s = LeanSession()
    # requests would read the proxy variables and ~/.netrc again for every call:
    # a fifth of the controller's CPU at 1,000 nodes; the endpoints are explicit
    s.trust_env = False
    if a.ca is not None:
        s.verify = a.ca
    if a.cert is not None and a.key is not None:
        s.cert = (a.cert, a.key)
    return s


class Etcd:
    """etcd's v3 API through etcd3gw, with failover between endpoints. ``access``: the
    CA, client certificate and etcd user (None: the environment's, ``FERRY_ETCD_*``)."""

    def __init__(self, endpoints: list[str] | tuple[str, ...], timeout: float = REQUEST_TIMEOUT_S,
                 access: EtcdAccess | None = None) -> None:
        import etcd3gw
        self.endpoints = list(endpoints)
        self.timeout = timeout
        self.access = EtcdAccess.from_env() if access is None else access
        self._answered = False        # etcd has answered this client once (its credentials work)
        self.access.check(self.endpoints)
        a = self.access
        self._clients = [etcd3gw.client(host=h, port=p, protocol=s, timeout=timeout, api_path="/v3/",
                                        session=_session(a))
                         for s, h, p in parse_endpoints(endpoints)]
        self._cur = 0
        self._auth_off_warned = False
        self._auth_off: set[int] = set()     # clients whose etcd said auth is off

    @property
    def auth_was_off(self) -> bool:
        """True when an endpoint answered this client's login with "authentication is not
        enabled" (and has not asked for a user since)."""
        return bool(self._auth_off)

    # -- who this client is -------------------------------------------------------
    def _login(self, c: "Etcd3Client") -> None:
        """Get a token for ``access.user`` from this endpoint (once per endpoint; again
        when etcd forgets it, e.g. after a restart)."""
        from etcd3gw import exceptions as ex
        try:
            r = c.post(c.get_url("/auth/authenticate"),
                       json={"name": self.access.user, "password": self.access.password()})
        except ex.Etcd3Exception as e:
            msg = str(getattr(e, "detail_text", "") or e)
            if "authentication is not enabled" in msg:
                if not self._auth_off_warned:
                    self._auth_off_warned = True
                    log.warning("stage=control etcd at %s has authentication off: anyone who reaches it "
                                "can write the cluster's keys (ferry etcd setup turns it on)", c.base_url)
                self._auth_off.add(id(c))       # logged in again once etcd says auth is on
                return
            if "authentication failed" in msg or "invalid user" in msg:
                raise ControlPlaneAccessError(
                    f"etcd at {c.base_url} refused the login of user {self.access.user!r}: wrong password "
                    f"(control_plane.password_file {self.access.password_file}) or no such user") from None
            raise
        c.session.headers["Authorization"] = str(r["token"])

    def _roles(self, c: "Etcd3Client") -> str:
        """This user's roles and what they grant, in words (best effort: the user may read
        its own record and roles)."""
        try:
            roles = c.post(c.get_url("/auth/user/get"), json={"name": self.access.user}).get("roles", [])
            out = []
            for r in roles:
                perms = c.post(c.get_url("/auth/role/get"), json={"role": r}).get("perm", [])
                grants = []
                for p in perms:
                    k = _unb64(p.get("key", "")).decode("utf-8", "backslashreplace")
                    end = _unb64(p.get("range_end", "")).decode("utf-8", "backslashreplace")
                    where = f"{k}*" if end and end == _prefix_end(k) else (f"[{k}, {end})" if end else k)
                    grants.append(f"{p.get('permType', 'READ').lower()} {where}")
                out.append(f"{r}: {', '.join(grants) or 'no permission'}")
            return "; ".join(out) or "no role"
        except Exception as e:  # noqa: BLE001 - only words for an error message; the client raises its own
            log.debug("stage=control roles of %s not readable: %r", self.access.user, e)
            return "roles not readable"

    def _access_error(self, c: "Etcd3Client", msg: str, what: str) -> ControlPlaneAccessError | None:
        """The error for a refusal of who this client is, or None."""
        where = f"etcd at {c.base_url}"
        if "permission denied" in msg:
            who = (f"user {self.access.user!r} (role {self._roles(c)})" if self.access.user
                   else "this client (no user)")
            return ControlPlaneAccessError(
                f"{where}: permission denied: {who} may not {what} (ferry etcd setup gives a cluster's "
                "node role read and write on its prefix, its reader role read only)")
        if "user name is empty" in msg:
            return ControlPlaneAccessError(
                f"{where} has authentication on and this client names no etcd user: set "
                "[control_plane] user and password_file (or $FERRY_ETCD_USER and $FERRY_ETCD_PASSWORD_FILE)")
        if "CommonName of client" in msg:
            return ControlPlaneAccessError(
                f"{where} refuses a client certificate with a common name on its HTTP gateway "
                f"(control_plane.cert {self.access.cert}): issue one with `ferry certs issue` (no CN) "
                "and name the etcd user in [control_plane] user")
        if "HTTP request to an HTTPS server" in msg:
            return ControlPlaneAccessError(f"{where} serves https: write the endpoint as https://")
        return None

    def _call(self, fn: Callable[[Etcd3Client], T], what: str = "") -> T:
        """``fn`` against each endpoint in turn. Every failure leaves as one of the
        node's own errors, so no caller (a reporter thread, a controller round) dies of
        an exception type it does not know: transport failures and "leader changed" /
        "no leader" / timeouts as :class:`ControlPlaneDown` (retryable, after trying
        every endpoint), an expired or unknown lease as :class:`LeaseGone`, a refusal of
        this client's certificate, user or permissions as :class:`ControlPlaneAccessError`
        or :class:`~node.errors.ControlPlaneTLSError` (at once, naming what to fix),
        anything else etcd refuses (request too large, a malformed answer) as
        :class:`ControlPlaneError`."""
        from etcd3gw import exceptions as ex
        last: Exception | None = None
        n = len(self._clients)
        start = self._cur
        for i in range(n):
            idx = (start + i) % n
            c = self._clients[idx]
            for attempt in range(2):
                try:
                    if self.access.user and "Authorization" not in c.session.headers \
                            and id(c) not in self._auth_off:
                        self._login(c)
                    out = fn(c)
                    self._cur = idx
                    self._answered = True
                    return out
                except (ex.ConnectionFailedError, ex.ConnectionTimeoutError, ex.InternalServerError) as e:
                    last = e
                    if attempt == 0 and "EOF occurred in violation of protocol" in _chain_text(e):
                        # etcd closed the TLS handshake: a refused client certificate, unless
                        # it was going down; asked once more before saying so
                        time.sleep(0.1)
                        continue
                except ex.Etcd3Exception as e:
                    msg = str(getattr(e, "detail_text", "") or e)
                    if (("invalid auth token" in msg or "user name is empty" in msg) and self.access.user
                            and attempt == 0 and ("Authorization" in c.session.headers or id(c) in self._auth_off)):
                        # etcd forgot the token (a restart) or turned auth on since: log in again
                        c.session.headers.pop("Authorization", None)
                        self._auth_off.discard(id(c))
                        continue
                    # "etcdserver: leader changed", "no leader", request timed out: try another member
                    if any(w in msg for w in ("leader", "timed out", "unavailable", "stopped")):
                        last = e
                        break
                    if "lease not found" in msg or "Not Found" in msg or "requested lease" in msg:
                        raise LeaseGone(f"etcd: the lease is gone ({msg.strip()[:160]})") from None
                    denied = self._access_error(c, msg, what or "make this request")
                    if denied is not None:
                        raise denied from None
                    raise ControlPlaneError(f"etcd refused the request: {msg.strip()[:200] or type(e).__name__}") from None
                except NodeError:
                    raise
                except (ValueError, KeyError, TypeError) as e:
                    raise ControlPlaneError(f"etcd sent an answer that cannot be read: {type(e).__name__}: "
                                            f"{str(e)[:160]}") from None
                break
        why = (str(last).strip() or type(last).__name__)[:200] if last else "no endpoint answered"
        self._tls_failure(_chain_text(last))
        raise ControlPlaneDown(f"control plane (etcd at {', '.join(self.endpoints)}) unreachable: "
                               f"{why}; is etcd running there?")

    def _tls_failure(self, chain: str) -> None:
        """Raise ControlPlaneTLSError when the transport failure is a TLS refusal: not a
        matter of waiting, so said at once instead of "unreachable" for a minute."""
        low = chain.lower()
        eps = ", ".join(self.endpoints)
        if "certificate_verify_failed" in low or "certificate verify failed" in low:
            i = low.find("certificate verify failed")
            why = re.split(r"[()'\"]", chain[i:])[0].strip() if i >= 0 else "CERTIFICATE_VERIFY_FAILED"
            trust = (f"the CA in control_plane.ca ({self.access.ca})" if self.access.ca else
                     "the CA bundle of Python's requests (set control_plane.ca to etcd's CA; the "
                     "environment's REQUESTS_CA_BUNDLE is not read)")
            raise ControlPlaneTLSError(
                f"control plane {eps}: TLS certificate verification failed ({why}): etcd's server "
                f"certificate is not signed by {trust}, names another host, or has expired")
        # A handshake closed without an alert (EOF) is etcd refusing this client's
        # certificate (or its lack of one), or a cut link: a proxy or a network fault
        # closing it. Once etcd has answered this client, its credentials work, so an
        # EOF is the network, retried as "unreachable" instead of reported as a refusal
        eof = "eof occurred in violation of protocol" in low and not self._answered
        if eof or any(w in low for w in ("unknown ca", "bad certificate", "certificate required",
                                         "certificate unknown", "handshake failure", "expired certificate",
                                         "unsupported certificate")):
            if self.access.cert:
                raise ControlPlaneTLSError(
                    f"control plane {eps}: etcd refused this client's certificate in the TLS handshake: "
                    f"control_plane.cert {self.access.cert} is not signed by a CA etcd trusts (its "
                    "--trusted-ca-file), or has expired")
            raise ControlPlaneTLSError(
                f"control plane {eps}: etcd closed the TLS handshake: it asks for a client certificate "
                "(--client-cert-auth) and this client has none: set control_plane.cert and key")
        if "wrong version number" in low or "record layer failure" in low:
            raise ControlPlaneTLSError(f"control plane {eps}: etcd does not speak TLS there: write "
                                       "the endpoint as http:// or start etcd with a certificate")

    def post(self, path: str, body: WireDoc) -> WireDoc:
        return self._call(lambda c: c.post(c.get_url(path), json=body), _describe(path, body))

    # -- keys ---------------------------------------------------------------------
    def range_prefix(self, prefix: str) -> tuple[int, dict[str, KV]]:
        r = self.post("/kv/range", {"key": _b64(prefix), "range_end": _b64(_prefix_end(prefix))})
        return int(r["header"]["revision"]), dict(_kv(i) for i in r.get("kvs", []))

    def get(self, key: str) -> KV | None:
        r = self.post("/kv/range", {"key": _b64(key)})
        kvs = r.get("kvs", [])
        return _kv(kvs[0])[1] if kvs else None

    def put(self, key: str, value: object, lease: int = 0) -> int:
        body: WireDoc = {"key": _b64(key), "value": _b64(json.dumps(value, sort_keys=True))}
        if lease:
            body["lease"] = str(lease)
        return int(self.post("/kv/put", body)["header"]["revision"])

    def delete(self, key: str) -> None:
        self.post("/kv/deleterange", {"key": _b64(key)})

    def txn(self, compare: list[JsonDoc], puts: Sequence[tuple[str, object, int]],
            deletes: list[str] = (), prefixes: list[str] = ()) -> tuple[bool, int]:   # type: ignore[assignment]
        """All of ``compare`` hold -> every put (key, value, lease), delete and delete
        of every key under each of ``prefixes``; returns (succeeded, revision)."""
        ops: list[WireDoc] = []
        for k, v, lease in puts:
            put: WireDoc = {"key": _b64(k), "value": _b64(json.dumps(v, sort_keys=True))}
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
        first = self._clients[self._cur]
        if self.access.user and "Authorization" not in first.session.headers and id(first) not in self._auth_off:
            self._call(lambda c: None, f"watch the keys under {prefix}")     # log in first
        c = self._clients[self._cur]
        req: WireDoc = {"create_request": {"key": _b64(prefix), "range_end": _b64(_prefix_end(prefix)),
                                           "start_revision": str(start_revision), "progress_notify": True}}
        what = f"watch the keys under {prefix}"
        import requests
        try:
            resp = c.session.post(c.get_url("/watch"), json=req, stream=True,
                                  timeout=(self.timeout, idle))
        except requests.RequestException as e:
            self._cur = (self._cur + 1) % len(self._clients)
            self._tls_failure(_chain_text(e))
            raise ControlPlaneDown(f"watch on {c.base_url}: {e}") from None
        try:
            if resp.status_code != 200:
                self._watch_refused(c, resp.text[:300], what)
                return
            # chunk_size None: each line as soon as it arrives (the stubs say int only)
            for line in resp.iter_lines(chunk_size=None):  # type: ignore[call-overload]
                if stop.is_set():
                    return
                if not line.strip():
                    continue
                doc = json.loads(line)
                if doc.get("error"):
                    self._watch_refused(c, json.dumps(doc["error"])[:300], what)
                    return
                res = doc.get("result", {})
                if res.get("compact_revision") and res.get("canceled"):
                    raise WatchCompacted(int(res["compact_revision"]))
                if res.get("canceled"):
                    self._watch_refused(c, str(res.get("cancel_reason", "")), what)
                    return
                evs = []
                last = 0
                for ev in res.get("events", []):
                    key, kv = _kv(ev["kv"])
                    typ = ev.get("type", "PUT")
                    evs.append((typ, key, kv if typ == "PUT" else None))
                    last = max(last, kv.mod)
                if evs:
                    yield last, evs
        except (requests.RequestException, OSError, ValueError):
            return          # broken or idle: the caller resumes from its revision
        finally:
            resp.close()

    def _watch_refused(self, c: "Etcd3Client", msg: str, what: str) -> None:
        """A watch etcd refused or cancelled: a forgotten token is dropped (the next call
        logs in again), a refusal of this client raises; anything else ends the stream."""
        if "invalid auth token" in msg or ("user name is empty" in msg and id(c) in self._auth_off):
            c.session.headers.pop("Authorization", None)
            self._auth_off.discard(id(c))
            return
        denied = self._access_error(c, msg, what)
        if denied is not None:
            raise denied


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
            except Exception:  # noqa: BLE001 - the lease thread must go on: retried
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
            except Exception as e:  # noqa: BLE001 - a malformed answer must not stop the keepalives
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
            except NodeError as e:      # etcd unreachable: the lease ends by its TTL
                log.info("stage=control lease %x not revoked: %s", self.lease, e)


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
        rev, kvs = self.etcd.range_prefix(self.prefix + "/")
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
                for rev, evs in self.etcd.watch(self.prefix + "/", self.revision + 1, self._stop):
                    changed = self.apply(rev, evs)
                    if changed:
                        self.on_change(changed)
            except WatchCompacted:
                log.info("stage=control watch fell behind a compaction; reloading and diffing")
                reload = True
            except ControlPlaneDown as e:
                log.debug("stage=control watch: %s", e)
                self._stop.wait(0.2)
            except ConfigError as e:       # refused (certificate, user, permission): say so, slowly
                log.error("stage=control watch refused: %s", e)
                self._stop.wait(5.0)
            except Exception:  # noqa: BLE001 - the watch thread goes on: it reloads the view
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


__all__ = ["Etcd", "EtcdAccess", "ControlPlaneAccessError", "Session", "View", "KV", "parse_endpoints",
           "b64", "prefix_end"]
