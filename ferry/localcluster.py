"""A cluster of real node processes on loopback in one folder (the node package's test
rig, not part of a node): what ``ferry demo`` and
bench/rebalance_bench.py drive (tests/node use their own, smaller harness).

    from ferry.localcluster import LocalCluster
    with LocalCluster(root, partitions=16, mode="files") as c:
        c.start(3)                              # n1 (new cluster), n2, n3 join
        c.load(200_000)                         # JSON values with a "city" field, indexed
        c.add_node()                            # n4 joins: the rebalance starts
        doc = c.wait_all_owning(timeout=300)    # every partition: B+1 ideal owners OWNING
    # leaving the block stops every node (SIGTERM, then SIGKILL after 30 s)

``wal_sync="none"`` (no fsync: survives a process crash, not a power cut) loads much
faster on a slow disk; "group" (default) is the durable mode. Every node gets
``--config ROOT/node.toml`` (caches, index ``by_city``, timings; with ``etcd_tls=True``
the embedded etcd serves https with client certificates and RBAC, and the file names
the node's certificate, etcd user and password file: :meth:`LocalCluster.etcd_access`),
``--data ROOT/<id>``, ``--listen 127.0.0.1:<free port>``, the secret ``ROOT/secret``,
and logs to ``ROOT/<id>.log``.

``tls=True``: the nodes' own links (node RPC, client RPC, file transfers) are mutual
TLS instead of the shared secret. The cluster gets a CA (:class:`ClusterCerts`, made
with ``node.certs`` as ``ferry certs`` does; with ``etcd_tls`` the same CA signs
etcd's certificates), each node a certificate ``ferry://node/<id>`` named in
``[tls]`` of its own ``ROOT/<id>.toml`` (``node.toml`` plus that section; no secret
is passed), and the cluster's clients (:meth:`LocalCluster.client`, :meth:`pool`,
the status and move polls; :meth:`client_env` for ``ferry cluster`` commands) a
client certificate ``ferry://client/localcluster``. A live validation of the cluster
(``validation.live.LiveSettings(seeds=c.seeds, tls=c.validator_tls)``) uses a validator
certificate ``ferry://validator/spark``.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable
from node.listen_ports import free_port

if TYPE_CHECKING:
    from node.wire import Pool
    from transfer.tls import TlsFiles

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CITIES = ("oslo", "lima", "pune", "kyiv", "accra", "quito", "hanoi", "perth")

TOML = """
log_level = "{log_level}"
[wal]
sync = "{wal_sync}"
[checkpoint]
interval_s = {checkpoint_interval}{extra_checkpoint}
[transfer]
concurrency = {concurrency}
[rebalance]
mode = "{mode}"{extra_rebalance}
[control_plane]
lease_ttl_s = {lease_ttl}{extra_control_plane}
[[caches]]
name = "default"
partitions = {partitions}
backups = {backups}
[[caches.indexes]]
name = "by_city"
field = "city"
"""


CLIENT_NAME = "localcluster"
VALIDATOR_NAME = "spark"


class ClusterCerts:
    """A cluster CA in ``ca_dir`` (``node.certs.init_ca``, made once) and the
    certificates it signs into ``out_dir`` (``node.certs.issue``, made once per name):
    what ``ferry certs init`` and ``ferry certs issue --node ID | --client NAME |
    --validator NAME`` write."""

    def __init__(self, ca_dir: str, out_dir: str, name: str = "ferry-local-ca", revocation: bool = False) -> None:
        from node import certs, crl
        self.ca_dir, self.out_dir = ca_dir, out_dir
        self.ca = certs.ca_paths(ca_dir).cert
        if not os.path.exists(certs.ca_paths(ca_dir).key):
            certs.init_ca(ca_dir, name=name)
        # ``revocation``: every file set names the CA's revocation list (written empty
        # now; :meth:`revoke` adds to it), as ``ferry certs crl`` and ``revoke`` do
        self.crl: str | None = None
        if revocation:
            self.crl = crl.crl_path(ca_dir)
            if not os.path.exists(self.crl):
                crl.write_crl(ca_dir)

    def revoke(self, files: "TlsFiles") -> None:
        """Revoke the certificate of ``files`` and write the list again (``ferry certs revoke``)."""
        from node import crl
        crl.revoke(self.ca_dir, files.cert)

    def _files(self, name: str, role: str) -> "TlsFiles":
        from node import certs
        from transfer.tls import TlsFiles
        sub = os.path.join(self.out_dir, f"{role}s")           # nodes/, clients/, validators/
        crt, key = os.path.join(sub, f"{name}.crt"), os.path.join(sub, f"{name}.key")
        if not (os.path.exists(crt) and os.path.exists(key)):
            out = certs.issue(self.ca_dir, name, sub, role=role)
            crt, key = out.cert, out.key
        return TlsFiles(self.ca, crt, key, self.crl)

    def node(self, node_id: str) -> "TlsFiles":
        """The files of node ``node_id`` (``ferry://node/<id>``: server and client use)."""
        return self._files(node_id, "node")

    def client(self, name: str = CLIENT_NAME) -> "TlsFiles":
        """The files of client ``name`` (``ferry://client/<name>``: the client methods)."""
        return self._files(name, "client")

    def validator(self, name: str = VALIDATOR_NAME) -> "TlsFiles":
        """The files of live validator ``name`` (``ferry://validator/<name>``: the map,
        the validation fence and fetching partition files)."""
        return self._files(name, "validator")


def tls_section(files: "TlsFiles") -> str:
    """A node config's ``[tls]`` section naming ``files``."""
    return (f"\n[tls]\nca = {json.dumps(files.ca)}\ncert = {json.dumps(files.cert)}\n"
            f"key = {json.dumps(files.key)}\n" + (f"crl = {json.dumps(files.crl)}\n" if files.crl else ""))


def tls_env(files: "TlsFiles") -> dict[str, str]:
    """The environment a ``ferry cluster`` command reads its client certificate from
    (node/wire.py ``TLS_ENV``)."""
    env = {"FERRY_TLS_CA": files.ca, "FERRY_TLS_CERT": files.cert, "FERRY_TLS_KEY": files.key}
    if files.crl:
        env["FERRY_TLS_CRL"] = files.crl
    return env



class LocalNode:
    def __init__(self, cluster: "LocalCluster", node_id: str) -> None:
        self.cluster, self.id = cluster, node_id
        self.address = f"127.0.0.1:{free_port()}"
        self.data = os.path.join(cluster.root, node_id)
        self.log = os.path.join(cluster.root, f"{node_id}.log")
        self.proc: subprocess.Popen[bytes] | None = None
        self._env: dict[str, str] | None = None
        self._port_retries = 0
        self._log_from = 0

    def start(self, wait: bool = True, env: dict[str, str] | None = None) -> "LocalNode":
        self._env = env
        args = [sys.executable, "-m", "ferry", "node", "start", "--config", self.cluster.node_config(self.id),
                "--id", self.id, "--data", self.data, "--listen", self.address]
        if not self.cluster.tls:        # with [tls] the node reads no secret
            args += ["--secret-file", self.cluster.secret_file]
        args += ["--control-plane", ",".join(self.cluster.control_plane)]
        if self.cluster.initial_members:
            args += ["--initial-members", ",".join(self.cluster.initial_members)]
        e = dict(os.environ)
        e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
        e.update(env or {})
        with open(self.log, "ab") as log:
            # where this life's lines begin: a restart appends to the log, whose earlier
            # "serving on" line is not this life's
            self._log_from = log.tell()
            self.proc = subprocess.Popen(args, stdout=log, stderr=log, env=e, cwd=ROOT)
        if wait:
            self.wait_serving()
        return self

    def wait_serving(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                if self._port_taken() and self._port_retries < 3:
                    # the port picked was taken meanwhile (another node's transfer
                    # supplier, started at the same time, bound an ephemeral port):
                    # the same node again on another one
                    self._port_retries += 1
                    self.address = f"127.0.0.1:{free_port()}"
                    self.start(wait=False, env=self._env)
                    continue
                raise RuntimeError(f"node {self.id} exited with status {self.proc.returncode}; see {self.log}")
            try:
                with open(self.log, "rb") as f:
                    f.seek(self._log_from)
                    if f"node {self.id} serving on".encode() in f.read():
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"node {self.id} did not start in {timeout}s; see {self.log}")

    def _port_taken(self) -> bool:
        try:
            with open(self.log, errors="replace") as f:
                return "Address already in use" in f.read()
        except OSError:
            return False

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def cpu_seconds(self) -> float:
        """User + system CPU of the running process and of its child processes (the
        index scan workers: their CPU is the node's work too), live or ended (psutil)."""
        import psutil
        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        proc = psutil.Process(self.proc.pid)
        t = proc.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        for child in proc.children(recursive=True):
            try:
                c = child.cpu_times()
            except psutil.Error:            # ended meanwhile (then counted as reaped, or lost)
                continue
            total += c.user + c.system
        return total


class LocalCluster:
    def __init__(self, root: str, *, partitions: int = 16, backups: int = 1, mode: str = "files",
                 concurrency: int = 4, checkpoint_interval: float = 5.0, log_level: str = "INFO",
                 wal_sync: str = "group", index_workers: int | None = None,
                 index_offload: str | None = None, page_size: int | None = None,
                 lease_ttl: int = 3, control_plane: list[str] | None = None,
                 stream_index: bool | None = None, caches: int = 1,
                 protect: bool | None = None, tls: bool = False,
                 etcd_tls: bool | None = None, tls_crl: bool = False) -> None:
        """``tls``: mutual TLS between the nodes and for the clients (certificates of
        the cluster's CA) instead of the shared secret. ``etcd_tls`` (default: as
        ``tls``): the embedded etcd serves https with client certificates and RBAC.
        ``tls_crl``: every node and client also checks the CA's revocation list
        (``self.certs.revoke(files)`` revokes a certificate)."""
        self.root = os.path.abspath(root)
        os.makedirs(self.root, exist_ok=True)
        self.partitions, self.backups = partitions, backups
        self.secret_file = os.path.join(self.root, "secret")
        if not os.path.exists(self.secret_file):
            fd = os.open(self.secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, secrets.token_hex(32).encode())
            os.close(fd)
        self.lease_ttl = lease_ttl
        # the embedded default: a single-member etcd in this folder, unless given one
        self.etcd: Any = None
        self._control_plane = list(control_plane or [])
        # (a given control plane comes with its own credentials)
        self.etcd_tls = (tls if etcd_tls is None else etcd_tls) and not control_plane
        self.tls = tls
        # one CA for the cluster: with the embedded etcd's TLS, the one it uses (made
        # here first, so EtcdCluster finds it and signs etcd's certificates with it)
        self.certs: ClusterCerts | None = None
        if tls:
            ca_dir = os.path.join(self.root, "etcd", "pki") if self.etcd_tls else os.path.join(self.root, "pki")
            self.certs = ClusterCerts(ca_dir, os.path.join(self.root, "certs"), revocation=tls_crl)
        self.config = os.path.join(self.root, "node.toml")
        with open(self.config, "w") as f:
            f.write(TOML.format(mode=mode, partitions=partitions, backups=backups,
                                concurrency=concurrency, checkpoint_interval=checkpoint_interval,
                                log_level=log_level, wal_sync=wal_sync, lease_ttl=lease_ttl,
                                extra_control_plane=self._tls_keys(),
                                extra_checkpoint="" if page_size is None else f"\npage_size = {page_size}",
                                extra_rebalance=("" if index_workers is None
                                                 else f"\nindex_workers = {index_workers}")
                                + ("" if index_offload is None
                                   else f"\nindex_offload = {json.dumps(index_offload)}")
                                + ("" if stream_index is None
                                   else f"\nstream_index = {json.dumps(stream_index)}")
                                + ("" if protect is None else f"\nprotect = {json.dumps(protect)}")))
            # more caches (no index), as many partitions each: "c2", "c3", ...
            for i in range(2, caches + 1):
                f.write(f'[[caches]]\nname = "c{i}"\npartitions = {partitions}\nbackups = {backups}\n')
        self.caches = caches
        self.nodes: list[LocalNode] = []
        # the nodes ``start`` begins with: each creates its own share of the partitions
        # (``--initial-members``), so a new cluster moves nothing to settle
        self.initial_members: list[str] = []

    # -- processes --------------------------------------------------------------------
    @property
    def control_plane(self) -> list[str]:
        if not self._control_plane:
            from node.etcdserver import EtcdCluster
            self.etcd = EtcdCluster(os.path.join(self.root, "etcd"), tls=self.etcd_tls,
                                    auth_prefix="/ferry/default" if self.etcd_tls else None).start()
            self._control_plane = self.etcd.endpoints
        return self._control_plane

    def _tls_keys(self) -> str:
        """The node's [control_plane] credentials (the files the embedded etcd makes)."""
        if not self.etcd_tls:
            return ""
        from node.etcdserver import EtcdCluster
        a = EtcdCluster.planned_access(os.path.join(self.root, "etcd"), "/ferry/default")
        return "".join(f"\n{k} = {json.dumps(getattr(a, k))}" for k in ("ca", "cert", "key", "user", "password_file"))

    def etcd_access(self, who: str = "node") -> Any:
        """``node.control.EtcdAccess`` of "node", "reader" or "root" for ``Etcd(c.control_plane,
        access=...)``; without ``etcd_tls``, the empty one."""
        _ = self.control_plane            # the embedded etcd, started on first use
        from node.control import EtcdAccess
        return self.etcd.access(who) if self.etcd is not None else EtcdAccess()

    def node_config(self, node_id: str) -> str:
        """The config file of node ``node_id``: ``node.toml``, or with ``tls`` a copy
        of it with ``[tls]`` naming the node's certificate (issued on first use)."""
        if self.certs is None:
            return self.config
        path = os.path.join(self.root, f"{node_id}.toml")
        with open(self.config) as f:
            base = f.read()
        with open(path, "w") as f:
            f.write(base + tls_section(self.certs.node(node_id)))
        return path

    @property
    def client_tls(self) -> "TlsFiles | None":
        """The client certificate of this cluster's clients (None: the secret)."""
        return self.certs.client() if self.certs is not None else None

    @property
    def validator_tls(self) -> "TlsFiles | None":
        """The certificate a live validation of this cluster uses (None: the secret)."""
        return self.certs.validator() if self.certs is not None else None

    def client_env(self) -> dict[str, str]:
        """Environment for a ``ferry cluster`` command run against this cluster: with
        ``tls`` the client certificate (``$FERRY_TLS_*``); else empty (the command
        takes ``--secret-file`` :attr:`secret_file`)."""
        files = self.client_tls
        return tls_env(files) if files is not None else {}

    def pool(self, timeout: float = 10.0) -> "Pool":
        """A client ``Pool`` of this cluster's credentials (close it when done)."""
        from node import Pool, load_secret
        files = self.client_tls
        if files is None:
            return Pool(load_secret(self.secret_file), role="client", timeout=timeout)
        from transfer.tls import TlsContexts
        return Pool(b"", role="client", timeout=timeout, tls=TlsContexts(files))

    def start(self, n: int = 3) -> list[LocalNode]:
        """Start ``n`` nodes as the cluster's initial members (each creates its share of
        the partitions) and wait until settled."""
        if not self.nodes:
            self.initial_members = [f"n{i + 1}" for i in range(n)]
        new = [LocalNode(self, f"n{len(self.nodes) + i + 1}") for i in range(n)]
        self.nodes += new
        for node in new:                 # all at once, as a cluster boots
            node.start(wait=False)
        for node in new:
            node.wait_serving()
        self.wait_all_owning(timeout=120)
        return self.nodes

    def add_node(self, node_id: str | None = None, *, wait: bool = True,
                 env: dict[str, str] | None = None) -> LocalNode:
        """Start one more node joining the cluster; ``wait``: until it serves."""
        node_id = node_id or f"n{len(self.nodes) + 1}"
        node = LocalNode(self, node_id)
        self.nodes.append(node)
        node.start(wait=True, env=env)
        if wait:
            self.wait_all_owning(timeout=120)
        return node

    def stop(self) -> None:
        try:
            for n in reversed(self.nodes):
                n.stop()
        finally:
            if self.etcd is not None:
                self.etcd.stop()

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def seeds(self) -> list[str]:
        return [n.address for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    # -- data -------------------------------------------------------------------------
    def client(self, timeout: float = 60.0) -> Any:
        from node import Client
        if self.tls:
            return Client(self.seeds, timeout=timeout, tls=self.client_tls)
        return Client(self.seeds, secret_file=self.secret_file, timeout=timeout)

    def load(self, entries: int, *, value_size: int = 64, threads: int = 8, start: int = 0,
             progress: Callable[[int, int], None] | None = None, chunk: int = 2048) -> int:
        """Put ``entries`` keys ``key-<i>`` (:func:`key_of`) with JSON values ``{"i",
        "city", "pad"}`` of about ``value_size`` bytes (:func:`value_of`) from
        ``threads`` clients, in ``put_batch`` requests (``Client.put_many``, which
        groups each ``chunk`` of a client's entries by partition).
        ``progress(done, total)`` after each chunk."""
        done = [0]
        lock = threading.Lock()

        def worker(t: int) -> None:
            with self.client() as c:
                mine = range(start + t, start + entries, threads)
                for lo in range(0, len(mine), chunk):
                    ids = mine[lo:lo + chunk]
                    c.put_many("default", ((key_of(i), value_of(i, value_size)) for i in ids))
                    with lock:
                        done[0] += len(ids)
                        if progress:
                            progress(done[0], entries)
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(worker, range(threads)))
        return done[0]

    # -- status -----------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        from node.status import collect
        pool = self.pool()
        try:
            last: Exception | None = None
            for s in self.seeds:
                try:
                    return collect(pool, s)
                except Exception as e:   # a node may be stopping; ask the next
                    last = e
            raise RuntimeError(f"no node answered: {last}")
        finally:
            pool.close()

    def moves_done(self) -> list[dict[str, Any]]:
        """Every finished move of every running node: cache, partition, from, to, mode,
        bytes, wire_bytes, replayed, seconds_to_owning, stage_seconds, finished."""
        pool = self.pool()
        out: list[dict[str, Any]] = []
        try:
            for n in self.nodes:
                if n.proc is not None and n.proc.poll() is None:
                    start = 0
                    while True:      # in pages: a node keeps its last 4,096 moves
                        page = pool.call(n.address, "moves_done", timeout=10.0, start=start, count=500)
                        out += page
                        start += len(page)
                        if len(page) < 500:
                            break
        finally:
            pool.close()
        return out

    def wait_all_owning(self, timeout: float = 300.0,
                        progress: Callable[[dict[str, Any]], None] | None = None,
                        poll: float = 0.3) -> dict[str, Any]:
        """Until every live node is a member and each partition has exactly its B+1 ideal
        owners OWNING, nothing else (no MOVING/RENTING), primary first, no move running.
        Asks every ``poll`` seconds (each ask reads the whole map from a node)."""
        deadline = time.monotonic() + timeout
        doc: dict[str, Any] = {}
        want_nodes = len(self.seeds)
        while time.monotonic() < deadline:
            try:
                doc = self.status()
            except Exception:
                time.sleep(poll)
                continue
            if progress:
                progress(doc)
            if settled(doc, want_nodes, self.backups):
                return doc
            time.sleep(poll)
        raise TimeoutError(f"partitions not all OWNING after {timeout}s: {json.dumps(doc)[:2000]}")


def settled(doc: dict[str, Any], nodes: int, backups: int) -> bool:
    live = [n["id"] for n in doc["nodes"] if n["alive"] and not n["leaving"]]
    want = min(backups + 1, len(live))
    return len(live) == nodes and not doc["moves"] and all(
        sorted(n for n, s in part["states"].items() if s == "OWNING") == sorted(part["owners"])
        and len(part["owners"]) == want and set(part["states"].values()) == {"OWNING"}
        and part["primary"] == part["owners"][0]
        and sorted(part.get("in_sync", part["owners"])) == sorted(part["owners"])
        for part in doc["partitions"])


def key_of(i: int) -> bytes:
    return f"key-{i:09d}".encode()


def value_of(i: int, size: int = 64) -> bytes:
    doc = {"i": i, "city": CITIES[i % len(CITIES)]}
    pad = max(0, size - len(json.dumps(doc)) - 10)
    doc["pad"] = "x" * pad
    return json.dumps(doc).encode()
