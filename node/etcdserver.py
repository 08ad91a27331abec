"""A local etcd for the embedded default: the demo, ``LocalCluster``, the tests and the
harness each start one in their work folder and stop it at the end.

Real clusters run their own etcd and point ``--control-plane`` at it; this module only
spawns Debian's ``etcd`` binary (package ``etcd-server``) on loopback. One member by
default; ``EtcdCluster(n=3)`` starts a three-member cluster whose members can be killed
and restarted one by one (the harness's ``etcd-member-loss`` scenario).

``EtcdCluster(root, tls=True)`` serves https only, with a CA of its own in ``root/pki``
(node/certs.py): a server certificate for loopback (``server_ips``: and these addresses
too, for clients that reach the members through a proxy on another address), client
and peer certificate authentication against that CA. ``auth_prefix="/ferry/NAME"`` (needs ``tls``) then runs
``ferry etcd setup`` for that cluster (node/etcdauth.py): roles and users for the nodes
and for readers, root's password in ``root/pki/root.password``, and etcd's auth on.
:meth:`EtcdCluster.access` gives the credentials of each.
"""
from __future__ import annotations

import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.request
from typing import TYPE_CHECKING

from .listen_ports import free_port
from .errors import ConfigError, Unavailable

if TYPE_CHECKING:
    from .control import EtcdAccess
    from .etcdauth import Setup

INSTALL_HINT = ("install it: `apt-get install etcd-server etcd-client` on Debian/Ubuntu "
                "(scripts/system-deps does this as root), or put an etcd 3.4+ binary on PATH "
                "or in $FERRY_ETCD")


def etcd_binary() -> str:
    """Path of the etcd binary, or ConfigError saying how to install one."""
    cand = os.environ.get("FERRY_ETCD") or shutil.which("etcd") or "/usr/bin/etcd"
    if os.path.isfile(cand) and os.access(cand, os.X_OK):
        return cand
    raise ConfigError(f"no etcd binary found (Ferry's control plane runs on etcd); {INSTALL_HINT}")


def _names(cert: str, ips: tuple[str, ...]) -> bool:
    """Whether the certificate ``cert`` names every address of ``ips``."""
    if not ips:
        return True
    from .certs import describe
    named = describe(cert).get("ips") or []
    assert isinstance(named, list)
    return set(ips) <= set(named)



class EtcdMember:
    def __init__(self, root: str, name: str, client_port: int, peer_port: int,
                 pki: tuple[str, str, str] | None = None) -> None:
        self.name = name
        self.dir = os.path.join(root, name)
        self.client_port, self.peer_port = client_port, peer_port
        scheme = "https" if pki else "http"
        self.url = f"{scheme}://127.0.0.1:{client_port}"
        self.peer_url = f"{scheme}://127.0.0.1:{peer_port}"
        self.log = os.path.join(root, f"{name}.log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.pki = pki          # (CA, server certificate, its key)

    def argv(self, initial_cluster: str, state: str) -> list[str]:
        return [etcd_binary(), "--name", self.name, "--data-dir", self.dir,
                "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
                "--initial-cluster", initial_cluster, "--initial-cluster-state", state,
                "--initial-cluster-token", "ferry-local",
                # loopback: a short heartbeat lets a 2 s lease TTL work and elections be quick
                "--heartbeat-interval", "50", "--election-timeout", "500",
                "--logger", "zap", "--log-outputs", self.log, "--log-level", "warn",
                # the control state is small; keep etcd from growing its db without bound
                "--auto-compaction-mode", "revision", "--auto-compaction-retention", "10000",
                "--quota-backend-bytes", str(1 << 30)] + self.tls_argv()

    def tls_argv(self) -> list[str]:
        if not self.pki:
            return []
        ca, crt, key = self.pki
        return ["--cert-file", crt, "--key-file", key, "--client-cert-auth", "--trusted-ca-file", ca,
                "--peer-cert-file", crt, "--peer-key-file", key, "--peer-client-cert-auth",
                "--peer-trusted-ca-file", ca]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


class EtcdCluster:
    """``n`` etcd members on loopback under ``root``; ``endpoints`` for the nodes.
    ``tls``: https with client-certificate authentication; ``auth_prefix``: etcd's
    RBAC on, with a node role and a reader role for the cluster under that prefix.
    ``server_ips``: addresses the server certificate names besides loopback (where a
    proxy in front of the members listens for clients that cannot reach loopback)."""

    def __init__(self, root: str, n: int = 1, *, tls: bool = False, auth_prefix: str | None = None,
                 server_ips: tuple[str, ...] = ()) -> None:
        self.root = os.path.abspath(root)
        os.makedirs(self.root, exist_ok=True)
        if auth_prefix and not tls:
            raise ConfigError("etcd's auth without TLS would send its passwords and tokens in clear: "
                              "EtcdCluster(auth_prefix=...) needs tls=True")
        self.tls, self.auth_prefix = tls, auth_prefix
        self.server_ips = tuple(dict.fromkeys(server_ips))
        self.pki = os.path.join(self.root, "pki")
        self.setup: Setup | None = None
        server = self._make_pki() if tls else None
        self.members = [EtcdMember(self.root, f"etcd{i + 1}", free_port(), free_port(), server)
                        for i in range(n)]
        self.initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        self._started: set[str] = set()

    def _make_pki(self) -> tuple[str, str, str]:
        from . import certs
        ca = certs.ca_paths(self.pki)
        if not os.path.exists(ca.key):
            certs.init_ca(self.pki, name="ferry-local-etcd-ca")
        out = {}
        # loopback (and localhost) as certs.issue names by default, and the extra addresses
        ips = tuple(dict.fromkeys((*certs.LOOPBACK_IPS, *self.server_ips))) if self.server_ips else ()
        for name, server in (("etcd-server", True), ("admin", False), ("node", False), ("reader", False)):
            path = os.path.join(self.pki, f"{name}.crt")
            if server and os.path.exists(path) and not _names(path, self.server_ips):
                os.remove(path)         # made for other addresses: issued again below
            out[name] = (certs.issue(self.pki, name, server=server, ips=ips if server else (),
                                     dns=("localhost",) if server and ips else ())
                         if not os.path.exists(path)
                         else certs.Issued(path, os.path.join(self.pki, f"{name}.key")))
        return ca.cert, out["etcd-server"].cert, out["etcd-server"].key

    def access(self, who: str = "node") -> "EtcdAccess":
        """Credentials for ``who``: "node" (read/write on the prefix), "reader" (read
        only), "root" (the administrator: never a node's); without auth, the
        certificate alone."""
        from .control import EtcdAccess
        if not self.tls:
            return EtcdAccess()
        cert = "admin" if who == "root" else who
        crt, key = os.path.join(self.pki, f"{cert}.crt"), os.path.join(self.pki, f"{cert}.key")
        ca = os.path.join(self.pki, "ca.crt")
        if self.setup is None:
            return EtcdAccess(ca, crt, key)
        user, pw = {"root": ("root", self.setup.root_password_file),
                    "node": (self.setup.node_user, self.setup.node_password_file),
                    "reader": (self.setup.reader_user, self.setup.reader_password_file)}[who]
        return EtcdAccess(ca, crt, key, user, pw)

    @staticmethod
    def planned_access(root: str, auth_prefix: str, who: str = "node") -> "EtcdAccess":
        """The credentials ``EtcdCluster(root, tls=True, auth_prefix=...)`` will make for
        ``who`` (known before it starts: a node's config can name them)."""
        from .control import EtcdAccess
        from .etcdauth import cluster_name
        pki = os.path.join(os.path.abspath(root), "pki")
        user = "root" if who == "root" else f"ferry-{cluster_name(auth_prefix)}-{who}"
        cert = "admin" if who == "root" else who
        return EtcdAccess(os.path.join(pki, "ca.crt"), os.path.join(pki, f"{cert}.crt"),
                          os.path.join(pki, f"{cert}.key"), user, os.path.join(pki, f"{user}.password"))

    def _setup_auth(self) -> None:
        from .etcdauth import setup
        assert self.auth_prefix is not None
        admin = self.access("root")
        self.setup = setup(self.endpoints, self.auth_prefix, self.pki, ca=admin.ca, cert=admin.cert,
                           key=admin.key, root_password_file=os.path.join(self.pki, "root.password"))

    @property
    def endpoints(self) -> list[str]:
        return [m.url for m in self.members]

    def start(self, timeout: float = 30.0) -> "EtcdCluster":
        for m in self.members:
            self.start_member(m, wait=False)
        self.wait_healthy(timeout)
        if self.auth_prefix and self.setup is None:
            self._setup_auth()
        return self

    def start_member(self, m: EtcdMember, wait: bool = True) -> None:
        """Start ``m`` unless it runs already (a second process on its data dir and
        ports would fail, and the first would be left without an owner)."""
        if m.alive():
            if wait:
                self.wait_healthy(30.0, members=[m])
            return
        state = "existing" if m.name in self._started or os.path.isdir(m.dir) else "new"
        logf = open(m.log + ".stderr", "ab")
        try:
            m.proc = subprocess.Popen(m.argv(self.initial, state), stdout=logf, stderr=logf,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            logf.close()
        self._started.add(m.name)
        if wait:
            self.wait_healthy(30.0, members=[m])

    def ssl_context(self) -> ssl.SSLContext | None:
        """For the members' HTTP endpoints (``/health``, ``/v3/maintenance/status``):
        the administrator's certificate against the cluster's CA; None without TLS."""
        if not self.tls:
            return None
        ctx = ssl.create_default_context(cafile=os.path.join(self.pki, "ca.crt"))
        ctx.load_cert_chain(os.path.join(self.pki, "admin.crt"), os.path.join(self.pki, "admin.key"))
        return ctx

    def wait_healthy(self, timeout: float, members: list[EtcdMember] | None = None) -> None:
        deadline = time.monotonic() + timeout
        ctx = self.ssl_context()
        for m in members or self.members:
            while True:
                if m.proc is not None and m.proc.poll() is not None:
                    raise Unavailable(f"etcd member {m.name} exited {m.proc.returncode}; "
                                      f"see {m.log} and {m.log}.stderr")
                try:
                    with urllib.request.urlopen(m.url + "/health", timeout=1.0, context=ctx) as r:
                        if b'"true"' in r.read():
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise Unavailable(f"etcd member {m.name} at {m.url} not healthy after "
                                      f"{timeout:.0f}s; see {m.log}")
                time.sleep(0.05)

    def kill(self, i: int = 0) -> None:
        self.members[i].kill()

    def restart(self, i: int = 0) -> None:
        self.start_member(self.members[i], wait=False)
        if len(self.members) == 1 or sum(x.alive() for x in self.members) > len(self.members) // 2:
            self.wait_healthy(30.0, members=[self.members[i]])

    def stop(self) -> None:
        for m in self.members:
            m.stop()

    def __enter__(self) -> "EtcdCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["EtcdCluster", "EtcdMember", "etcd_binary", "INSTALL_HINT"]
