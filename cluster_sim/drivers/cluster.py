"""The ``cluster`` driver: real ``ferry node`` processes on loopback.

Nodes get a TOML config (a 2 s control-plane lease, so a killed node is failed in about
two seconds), register in the run's own etcd (``control_plane_members`` members,
started in the run folder, stopped at cleanup), and are driven by ``node.Client``, each
write through one node's view (:mod:`.writes`). Settled means what ``cluster status``
shows: every live member in the map, no move in progress, every partition with exactly
its ideal owners OWNING, all of them in sync, and the ideal primary
(:func:`.convergence.settled_problems`). Fault events (partitions of a node from its
peers and/or etcd, etcd members killed, a node's tmpfs disk filled) live in
:mod:`.clusterfaults`.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from node.listen_ports import free_port
from node.states import read_states

from ..diskfull import SimSkipped
from ..errors import ProcessError, SimError
from ..invariants import Copy, Layout
from ..procs import ROOT, Proc, child_env
from ..scenario import CONTAINER_ACTIONS, LEASE_TTL_S, Event, Scenario
from ..workload import Op, Receipt
from .base import Driver
from .clusterfaults import ClusterFaults
from .convergence import settled_problems
from .writes import NodeClients, WriteStats, verify_reads

if TYPE_CHECKING:
    from node.client import Client
    from node.wire import Pool
    from node.control import EtcdAccess
    from transfer.tls import TlsFiles

TLS_CLIENT = "harness"          # the harness's client certificate: ferry://client/harness
ETCD_PREFIX = "/ferry/default"  # the nodes' control_plane.prefix (the default)
ETCD_KEYS = ("ca", "cert", "key", "user", "password_file")   # [control_plane] credentials


class RunCerts:
    """The run's CA (``node.certs.init_ca``, what ``ferry certs init`` makes) in
    ``<run>/pki`` and the certificates it signs (``node.certs.issue``): one per node,
    ``ferry://node/<id>``, and the harness's client certificate."""

    def __init__(self, run_dir: str) -> None:
        from node import certs
        self.dir = os.path.join(run_dir, "pki")
        self.ca = certs.init_ca(self.dir, name="ferry-sim-ca").cert

    def files(self, name: str, role: str) -> "TlsFiles":
        from node import certs
        from transfer.tls import TlsFiles
        sub = os.path.join(self.dir, f"{role}s")
        crt, key = os.path.join(sub, f"{name}.crt"), os.path.join(sub, f"{name}.key")
        if not os.path.exists(key):
            out = certs.issue(self.dir, name, sub, role=role)
            crt, key = out.cert, out.key
        return TlsFiles(self.ca, crt, key)


def tls_toml(files: "TlsFiles") -> str:
    """The ``[tls]`` section of a node's config."""
    return (f"[tls]\nca = {json.dumps(files.ca)}\ncert = {json.dumps(files.cert)}\n"
            f"key = {json.dumps(files.key)}\n")


def node_toml(s: Scenario, etcd_access: "EtcdAccess | None" = None) -> str:
    """The ``node.toml`` every node of the run reads: a 2 s control-plane lease (and
    with ``etcd_access`` the node's etcd credentials), a checkpoint every second, the
    scenario's transfer rate, streaming install and index transfer, its first cache."""
    cache = s.caches[0]
    idx = "".join(f'[[caches.indexes]]\nname = "{i.name}"\nfield = "{i.field}"\n' for i in cache.indexes)
    creds = "" if etcd_access is None else "".join(
        f"{k} = {json.dumps(getattr(etcd_access, k))}\n" for k in ETCD_KEYS)
    return (f"[control_plane]\nlease_ttl_s = {LEASE_TTL_S}\n{creds}"
            f"[checkpoint]\ninterval_s = 1.0\n"
            + (f"[transfer]\nrate_limit = {s.transfer_rate}\n" if s.transfer_rate else "")
            + ("[rebalance]\n" if s.stream_index or s.index_transfer != "rebuild" else "")
            + ("stream_index = true\n" if s.stream_index else "")
            + (f"index_transfer = {json.dumps(s.index_transfer)}\n"
               if s.index_transfer != "rebuild" else "")
            + f'[[caches]]\nname = "{cache.name}"\npartitions = {cache.partitions}\n'
            f"backups = {cache.backups}\n{idx}")


class ClusterDriver(ClusterFaults, Driver):
    # with the scenario's tls: the run's CA and the harness's client certificate
    certs: RunCerts | None = None
    # etcd over https with RBAC (with tls, in every mode): the nodes' credentials
    etcd_access: "EtcdAccess | None" = None

    @property
    def etcd_tls(self) -> bool:
        return self.etcd_access is not None
    client_tls: "TlsFiles | None" = None

    def setup(self) -> None:
        s = self.scenario
        if not hasattr(self.net, "attach") and any(e.action in CONTAINER_ACTIONS for e in s.events):
            raise SimSkipped(f"scenario {s.name!r}: pause/unpause need container mode "
                             "(nodes in containers: docs/harness.md)")
        if s.tls:
            self.certs = RunCerts(self.dir)
            self.client_tls = self.certs.files(TLS_CLIENT, "client")
        # with tls, etcd too: https with client certificates and RBAC, the nodes with
        # the node role of the cluster's prefix (what LocalCluster and the demo run). In
        # network namespaces the nodes reach etcd through a proxy on their gateway
        # address: etcd's server certificate names those addresses besides loopback.
        from node.etcdserver import EtcdCluster
        etcd_dir = os.path.join(self.dir, "etcd")
        if s.tls:
            self.etcd_access = EtcdCluster.planned_access(etcd_dir, ETCD_PREFIX)
        self.config = os.path.join(self.dir, "node.toml")
        with open(self.config, "w") as f:
            f.write(node_toml(s, self.etcd_access))
        self.ports = {n: free_port() for n in s.all_nodes()}
        self.procs: dict[str, Proc] = {}
        self.left: set[str] = set()       # left gracefully: gone for good
        if s.proxy and self.net is not None:
            raise SimError("proxy = true runs on loopback only, not with network namespaces")
        self.etcd = EtcdCluster(etcd_dir, n=s.control_plane_members, tls=self.etcd_tls,
                                auth_prefix=ETCD_PREFIX if self.etcd_tls else None,
                                server_ips=self.etcd_gateways())
        self.etcd.start()
        self.setup_faults(self.ports, LEASE_TTL_S)
        if hasattr(self.net, "attach"):
            self.net.attach(self)       # container mode (drivers/container.py): slow disks, checks
        self.last_problems: list[str] = []
        self.write_stats = WriteStats()
        # the harness's own calls (status, maps): settling, the convergence clock and the
        # lease watchers poll every 0.2 s; one pool reuses their connections instead of
        # dialling and authenticating (and reading the secret) for every call
        self.pool = self.client_pool()

    def etcd_gateways(self) -> tuple[str, ...]:
        """The addresses nodes dial etcd on besides loopback: in network namespaces the
        gateway of each node, where its control proxies listen (etcd's server
        certificate names them)."""
        if self.net is None:
            return ()
        from node.certs import LOOPBACK_IPS
        gws = dict.fromkeys(self.net.gateway(n) for n in self.scenario.all_nodes())
        return tuple(g for g in gws if g not in LOOPBACK_IPS)

    # -- the harness's credentials: the secret, or with tls its client certificate ------------
    def client_pool(self, timeout: float = 10.0) -> "Pool":
        """A client ``Pool`` (close it when done)."""
        from node import Pool, load_secret
        if self.client_tls is None:
            return Pool(load_secret(self.secret_file), role="client", timeout=timeout)
        from transfer.tls import TlsContexts
        return Pool(b"", role="client", timeout=timeout, tls=TlsContexts(self.client_tls))

    def new_client(self, addresses: list[str], timeout: float = 30.0) -> "Client":
        """A ``node.Client`` of the given seeds."""
        from node.client import Client
        return Client(addresses, self.secret_file, timeout=timeout, tls=self.client_tls)

    def config_of(self, node: str) -> str:
        """The node's config file: ``node.toml``, with tls a copy of it per node with
        ``[tls]`` naming the node's certificate."""
        if self.certs is None:
            return self.config
        path = os.path.join(self.dir, f"node-{node}.toml")
        if not os.path.exists(path):
            with open(path, "w") as f:
                with open(self.config) as base:
                    f.write(base.read() + tls_toml(self.certs.files(node, "node")))
        return path

    def credentials_of(self, node: str) -> list[str]:
        """The files a node reads its credentials from, besides its config and the
        secret (container mode mounts them): with tls its certificate, key and the CA
        certificate, with etcd's TLS the node role's files."""
        out: list[str] = []
        if self.certs is not None:
            f = self.certs.files(node, "node")
            out += [f.ca, f.cert, f.key]
        a = self.etcd_access
        if a is not None:
            out += [x for x in (a.ca, a.cert, a.key, a.password_file) if x]
        return out

    def address(self, node: str) -> str:
        """Where the node listens (the harness's clients and status use it)."""
        return f"{self.host(node)}:{self.ports[node]}"

    def advertised(self, node: str) -> str:
        """Where peers reach the node: its proxy when the scenario has one."""
        return self.proxies[node].address if node in self.proxies else self.address(node)

    def _proc(self, node: str) -> Proc:
        if node not in self.procs:
            argv = [sys.executable, "-m", "ferry", "node", "start", "--config", self.config_of(node),
                    "--id", node, "--data", self.data_dir(node), "--listen", self.address(node)]
            if self.certs is None:          # with [tls] a node reads no secret
                argv += ["--secret-file", self.secret_file]
            if node in self.proxies:
                argv += ["--advertise", self.advertised(node)]
            argv += ["--control-plane", ",".join(self.control_plane_for(node))]
            if self.scenario.initial_members:
                argv += ["--initial-members", ",".join(self.scenario.nodes)]
            make = getattr(self.net, "proc", Proc)      # container mode: a container per life
            self.procs[node] = make(node, argv, os.path.join(self.dir, f"{node}.log"),
                                    trace=self.trace, crash=self.crash_for(node), prefix=self.prefix(node))
        return self.procs[node]

    def control_plane_for(self, node: str) -> list[str]:
        """The etcd endpoints ``node`` uses: its own proxies when the scenario cuts
        nodes from the control plane, else the members' client URLs."""
        return self.partitions.control_endpoints(node) or self.etcd.endpoints

    def start_node(self, node: str, *, wait: bool = True) -> None:
        p = self._proc(node)
        p.start()
        self.timeline.mark(node, "start" if p.lives == 1 else "restart")
        if wait:
            self._await_serving(node)

    def _await_serving(self, node: str) -> None:
        p = self._proc(node)
        try:
            p.wait_for_line("serving on", timeout=60)
        except ProcessError:
            if "Address already in use" in p.current_life() and p.port_retries < 3:
                self._new_port(node, wait=True)
                return
            if not p.self_killed():
                raise
            self.on_crash(node)

    def start(self) -> None:
        if self.scenario.initial_members:
            # a new cluster's initial members start together, as an operator starts
            # them: one after another, each waiting for the last, a slow start (a loaded
            # machine, thousands of partitions) could outlast the controller's wait for
            # the initial owners, and a late member would then resync every copy it made
            for n in self.scenario.nodes:
                self.start_node(n, wait=False)
            for n in self.scenario.nodes:
                self._await_serving(n)
        else:
            for n in self.scenario.nodes:
                self.start_node(n)
        if self.scenario.workload.preload:
            self._preload()

    def _preload(self) -> None:
        """The workload's preload entries, put in bulk before the clock starts (so the
        partitions have files of many pages: a returning copy then catches up by a
        delta); the model knows them as acknowledged once put_batch returned."""
        from ..workload import preload
        entries = preload(self.scenario.workload, self.seed)
        from ..history import WRITE
        addresses = [self.address(n) for n in self.scenario.nodes]
        deadline = time.monotonic() + 60.0
        # in the history like any write (invoked now, returned below), so a read of a
        # preloaded key is checked against it
        handles = [self.history.invoke("preload", WRITE, k, v) for k, v in entries]
        while True:
            try:
                with self.new_client(addresses) as c:
                    c.put_many(self.scenario.caches[0].name, entries)
                break
            except Exception as e:       # the cluster may still be electing primaries
                if time.monotonic() > deadline:
                    raise SimError(f"preload of {len(entries)} entries failed for 60 s: {e}") from e
                # a crash plan may fire during the preload (an early WAL sync): the
                # crash is noticed and the node restarted, as during the workload
                self.poll()
                time.sleep(0.5)
        for h in handles:
            self.history.ok(h)
        self.model.load(entries)
        self.timeline.mark("harness", "preload", f"{len(entries)} entries")

    def poll(self) -> None:
        super().poll()
        for n, p in self.procs.items():
            if p.self_killed():
                # the armed point fired between the look above and this one: a crash, not
                # an exit of its own
                self.on_crash(n)
                continue
            if p.popen is None or p.popen.poll() in (None, 0) or p._killed_by_us or p.crashed:
                continue
            if "Address already in use" in p.current_life() and p.port_retries < 3:
                self._new_port(n)
            else:               # exited with an error by itself: waiting to settle is pointless
                raise ProcessError(f"{n} exited with status {p.popen.returncode}:\n{p.tail()}")

    def _new_port(self, node: str, *, wait: bool = False) -> None:
        """The port picked at setup was taken by someone else before the node bound it
        (free_port() releases it; a busy machine reuses ephemeral ports): pick another
        and start the same life again (the crash plan, if any, stays armed)."""
        p = self.procs[node]
        old = self.address(node)
        self.ports[node] = free_port()
        if node in self.proxies:
            self.proxies[node].target = ("127.0.0.1", self.ports[node])
        p.argv = [self.address(node) if a == old else a for a in p.argv]
        p.port_retries += 1
        p.lives -= 1
        self.timeline.mark(node, "port retry", f"{old} taken; now {self.address(node)}")
        self.start_node(node, wait=wait)

    # -- workload ----------------------------------------------------------------------------
    def client(self, writer: int) -> NodeClients:
        nodes = self.scenario.all_nodes()
        return NodeClients(nodes, lambda: {n: self.address(n) for n in nodes}, self.secret_file,
                           self.scenario.caches[0].name, self.write_stats,
                           advertised=lambda: {n: self.advertised(n) for n in nodes},
                           up=lambda: {n for n, p in self.procs.items() if p.alive() and n not in self.left},
                           pinned=self.scenario.workload.pinned, tls=self.client_tls)

    def apply(self, client: NodeClients, op: Op) -> Receipt:
        return client.apply(op)

    def read(self, client: NodeClients, op: Op) -> bytes | None:
        return client.read(op)

    def via(self, client: NodeClients) -> str:
        return client.via()

    # -- events ------------------------------------------------------------------------------
    def event(self, ev: Event) -> None:
        if self.fault_event(ev):
            return
        action, node = ev.action, self.resolve(ev.node)
        if action == "join":
            self.start_node(node, wait=False)
        elif action == "kill":
            self.procs[node].kill()
        elif action == "restart":
            self.start_node(node, wait=False)
        elif action == "leave":
            live = [self.address(n) for n, p in self.procs.items() if p.alive() and n != node]
            env = child_env(None, None)
            if self.client_tls is not None:     # a client command's certificate: $FERRY_TLS_*
                f = self.client_tls
                env.update(FERRY_TLS_CA=f.ca, FERRY_TLS_CERT=f.cert, FERRY_TLS_KEY=f.key)
            r = subprocess.run([sys.executable, "-m", "ferry", "cluster", "leave", "--seed", live[0],
                                "--secret-file", self.secret_file, node], capture_output=True,
                               text=True, env=env, cwd=ROOT, timeout=60)
            if r.returncode != 0:
                raise ProcessError(f"cluster leave {node} failed: {r.stderr.strip()[-500:]}")
            self.left.add(node)
        elif action in CONTAINER_ACTIONS:
            self.net.fault(ev, node)            # pause / unpause (drivers/container.py)
        else:
            raise ProcessError(f"the cluster driver cannot {action} {node}")

    def cleanup(self) -> None:
        try:
            super().cleanup()
        finally:
            self.pool.close()
            if hasattr(self.net, "release"):
                self.net.release()      # container mode: containers, slow disks

    def busy(self) -> bool:
        return self.faults_busy()

    def restart_after_crash(self, node: str) -> None:
        if node not in self.left:
            self.start_node(node, wait=False)

    def processes(self) -> dict[str, Proc]:
        return self.procs

    # -- settle ------------------------------------------------------------------------------
    def status(self) -> dict[str, Any] | None:
        for n, p in self.procs.items():
            if p.alive() and n not in self.left and n not in self.freezer.frozen:
                doc = self.status_of(n)
                if doc is not None:
                    return doc
        return None

    def status_of(self, node: str) -> dict[str, Any] | None:
        """``cluster status`` as seen from ``node`` (None when it does not answer)."""
        from node.status import collect
        try:
            return collect(self.pool, self.address(node))
        except Exception:  # noqa: BLE001 - down or restarting: the caller tries another
            return None

    def sample(self) -> None:
        doc = self.status()
        if doc is None:
            return
        states: dict[str, dict[str, int]] = {}
        for part in doc["partitions"]:
            for n, s in part["states"].items():
                states.setdefault(n, {}).setdefault(s, 0)
                states[n][s] += 1
        self.timeline.sample(acked=self.model.n_acked, states=states,
                             bytes_moved=sum(m.get("bytes", 0) for m in doc["moves"]),
                             backlog=sum(m.get("backlog", 0) for m in doc["moves"]))

    def map_of(self, node: str) -> Any:
        """``node``'s own map (a ``ClusterMap``), None when it does not answer."""
        from node import ClusterMap
        try:
            return ClusterMap.fetch(lambda **a: self.pool.call(self.address(node), "get_map", timeout=5.0, **a))
        except Exception:  # noqa: BLE001 - down or restarting
            return None

    def expected(self) -> set[str]:
        """The nodes that should be live members: started, not left."""
        return {n for n in self.procs if n not in self.left}

    def settled(self) -> bool:
        expect = self.expected()
        if not all(self.procs[n].alive() for n in expect):
            self.last_problems = [f"{n} is not running" for n in expect if not self.procs[n].alive()]
            return False
        doc = self.status()
        self.last_status = doc
        self.last_problems = settled_problems(doc, expect, self.scenario.caches[0].backups)
        return not self.last_problems

    def unsettled(self) -> str:
        return "; ".join(self.last_problems[:6]) or str(self.last_status)[:1500]

    def after_settle(self) -> None:
        """Every node's view reads every key as the model says (nodes still running)."""
        self.convergence.finish()         # the last heal's verdict, before anything stops
        self.timeline.mark("-", "writes", self.write_stats.summary())
        live = {n: self.address(n) for n in sorted(self.expected())}
        self.checks["reads_serve_last_acked"] = verify_reads(
            live, self.secret_file, self.scenario.caches[0].name, self.model, self.history,
            tls=self.client_tls)

    def stop(self) -> dict[str, int | None]:
        self.freezer.thaw_all()           # a stopped process would wait for SIGCONT first
        self.convergence.cancel()
        # SIGTERM to all at once: stopping one by one would start moves we then cut.
        for n, p in self.procs.items():
            if p.alive():
                p._killed_by_us = True
                assert p.popen is not None
                p.popen.terminate()
        return {n: p.stop(timeout=60) for n, p in self.procs.items()}

    # -- the end state -----------------------------------------------------------------------
    def layout(self) -> Layout:
        cache = self.scenario.caches[0]
        copies: list[Copy] = []
        dirs = {n: self.data_dir(n) for n in self.procs}
        lost: dict[tuple[str, int], str] = {}
        for n, d in dirs.items():
            states = read_states(d).get(cache.name, {})
            for p, st in states.items():
                copies.append(Copy(n, d, cache.name, int(p), st))
                if st == "LOST":
                    lost[(cache.name, int(p))] = _lost_reason(self.procs[n].log, int(p))
        live = [n for n in self.procs if n not in self.left]
        return Layout(copies, cache.partitions, min(cache.backups + 1, len(live)), dirs, lost,
                      cache=cache.name)


def _lost_reason(log: str, p: int) -> str:
    try:
        text = open(log, errors="replace").read()
    except OSError:
        return "LOST (no log)"
    m = re.findall(rf"partition={p} LOST: ([^\n]*)", text)
    return m[-1] if m else "LOST (reason not logged)"
