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
``--config ROOT/node.toml`` (caches, index ``by_city``, timings; with ``tls=True`` the
embedded etcd serves https with client certificates and RBAC, and the file names the
node's certificate, etcd user and password file: :meth:`LocalCluster.etcd_access`),
``--data ROOT/<id>``, ``--listen 127.0.0.1:<free port>``, the secret ``ROOT/secret``,
and logs to ``ROOT/<id>.log``.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalNode:
    def __init__(self, cluster: "LocalCluster", node_id: str) -> None:
        self.cluster, self.id = cluster, node_id
        self.address = f"127.0.0.1:{free_port()}"
        self.data = os.path.join(cluster.root, node_id)
        self.log = os.path.join(cluster.root, f"{node_id}.log")
        self.proc: subprocess.Popen[bytes] | None = None
        self._env: dict[str, str] | None = None
        self._port_retries = 0

    def start(self, wait: bool = True, env: dict[str, str] | None = None) -> "LocalNode":
        self._env = env
        args = [sys.executable, "-m", "ferry", "node", "start", "--config", self.cluster.config,
                "--id", self.id, "--data", self.data, "--listen", self.address,
                "--secret-file", self.cluster.secret_file,
                "--control-plane", ",".join(self.cluster.control_plane)]
        if self.cluster.initial_members:
            args += ["--initial-members", ",".join(self.cluster.initial_members)]
        e = dict(os.environ)
        e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
        e.update(env or {})
        with open(self.log, "ab") as log:
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
                with open(self.log, errors="replace") as f:
                    if f"node {self.id} serving on" in f.read():
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
                 protect: bool | None = None, tls: bool = False) -> None:
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
        self.tls = tls and not control_plane       # (a given control plane comes with its own)
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
            self.etcd = EtcdCluster(os.path.join(self.root, "etcd"), tls=self.tls,
                                    auth_prefix="/ferry/default" if self.tls else None).start()
            self._control_plane = self.etcd.endpoints
        return self._control_plane

    def _tls_keys(self) -> str:
        """The node's [control_plane] credentials (the files the embedded etcd makes)."""
        if not self.tls:
            return ""
        from node.etcdserver import EtcdCluster
        a = EtcdCluster.planned_access(os.path.join(self.root, "etcd"), "/ferry/default")
        return "".join(f"\n{k} = {json.dumps(getattr(a, k))}" for k in ("ca", "cert", "key", "user", "password_file"))

    def etcd_access(self, who: str = "node") -> Any:
        """``node.control.EtcdAccess`` of "node", "reader" or "root" for ``Etcd(c.control_plane,
        access=...)``; without ``tls``, the empty one."""
        _ = self.control_plane            # the embedded etcd, started on first use
        from node.control import EtcdAccess
        return self.etcd.access(who) if self.etcd is not None else EtcdAccess()

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
        from node import Pool, load_secret
        from node.status import collect
        pool = Pool(load_secret(self.secret_file), role="client")
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
        from node import Pool, load_secret
        pool = Pool(load_secret(self.secret_file), role="client")
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
