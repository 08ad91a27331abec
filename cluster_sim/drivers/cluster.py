"""The ``cluster`` driver: real ``ferry node`` processes on loopback.

Nodes get a TOML config (a 2 s control-plane lease, so a killed node is failed in about
two seconds), register in the run's own etcd (started in the run folder, stopped at
cleanup), and are driven by ``node.Client``. Settled
means what ``cluster status`` shows: every live member in the map, no move in
progress, every partition with exactly its ideal owners OWNING and the ideal primary.
Fault events (``cut``/``heal`` a node's RPC links through per-node proxies, ``fill``/
``free`` a node's tmpfs disk) live in :mod:`.clusterfaults`.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

from ..errors import ProcessError, SimError
from ..invariants import Copy, Layout
from ..procs import ROOT, Proc, child_env, free_port
from ..workload import Op
from .base import Driver
from .clusterfaults import ClusterFaults

LEASE_TTL_S = 2


class ClusterDriver(ClusterFaults, Driver):
    def setup(self) -> None:
        s = self.scenario
        cache = s.caches[0]
        idx = "".join(f'[[caches.indexes]]\nname = "{i.name}"\nfield = "{i.field}"\n' for i in cache.indexes)
        self.config = os.path.join(self.dir, "node.toml")
        with open(self.config, "w") as f:
            f.write(f"[control_plane]\nlease_ttl_s = {LEASE_TTL_S}\n"
                    f"[checkpoint]\ninterval_s = 1.0\n"
                    + (f"[transfer]\nrate_limit = {s.transfer_rate}\n" if s.transfer_rate else "")
                    +
                    f'[[caches]]\nname = "{cache.name}"\npartitions = {cache.partitions}\n'
                    f"backups = {cache.backups}\n{idx}")
        self.ports = {n: free_port() for n in s.all_nodes()}
        self.procs: dict[str, Proc] = {}
        self.left: set[str] = set()       # left gracefully: gone for good
        if s.proxy and self.net is not None:
            raise SimError("proxy = true runs on loopback only, not with network namespaces")
        from node.etcdserver import EtcdCluster
        self.etcd = EtcdCluster(os.path.join(self.dir, "etcd"), n=getattr(s, "control_plane_members", 1))
        self.etcd.start()
        self.setup_faults(self.ports)

    def address(self, node: str) -> str:
        """Where the node listens (the harness's clients and status use it)."""
        return f"{self.host(node)}:{self.ports[node]}"

    def advertised(self, node: str) -> str:
        """Where peers reach the node: its proxy when the scenario has one."""
        return self.proxies[node].address if node in self.proxies else self.address(node)

    def _proc(self, node: str) -> Proc:
        if node not in self.procs:
            argv = [sys.executable, "-m", "ferry", "node", "start", "--config", self.config,
                    "--id", node, "--data", self.data_dir(node), "--listen", self.address(node),
                    "--secret-file", self.secret_file]
            if node in self.proxies:
                argv += ["--advertise", self.advertised(node)]
            argv += ["--control-plane", ",".join(self.control_plane_for(node))]
            self.procs[node] = Proc(node, argv, os.path.join(self.dir, f"{node}.log"),
                                    trace=self.trace, crash=self.crash_for(node), prefix=self.prefix(node))
        return self.procs[node]

    def control_plane_for(self, node: str) -> list[str]:
        """The etcd endpoints ``node`` uses (a proxy per node when faults need one)."""
        return self.etcd.endpoints

    def start_node(self, node: str, *, wait: bool = True) -> None:
        p = self._proc(node)
        p.start()
        self.timeline.mark(node, "start" if p.lives == 1 else "restart")
        if wait:
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
        for n in self.scenario.nodes:
            self.start_node(n)

    def poll(self) -> None:
        super().poll()
        for n, p in self.procs.items():
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
    def client(self, writer: int) -> Any:
        from node import Client
        return Client([self.address(n) for n in self.scenario.all_nodes()],
                      secret_file=self.secret_file, timeout=20)

    def apply(self, client: Any, op: Op) -> None:
        cache = self.scenario.caches[0].name
        if op.value is None:
            client.remove(cache, op.key)
        else:
            client.put(cache, op.key, op.value)

    # -- events ------------------------------------------------------------------------------
    def event(self, action: str, node: str) -> None:
        if self.fault_event(action, node):
            return
        if action == "join":
            self.start_node(node, wait=False)
        elif action == "kill":
            self.procs[node].kill()
        elif action == "restart":
            self.start_node(node, wait=False)
        elif action == "leave":
            live = [self.address(n) for n, p in self.procs.items() if p.alive() and n != node]
            r = subprocess.run([sys.executable, "-m", "ferry", "cluster", "leave", "--seed", live[0],
                                "--secret-file", self.secret_file, node], capture_output=True,
                               text=True, env=child_env(None, None), cwd=ROOT, timeout=60)
            if r.returncode != 0:
                raise ProcessError(f"cluster leave {node} failed: {r.stderr.strip()[-500:]}")
            self.left.add(node)
        else:
            raise ProcessError(f"the cluster driver cannot {action} {node}")

    def restart_after_crash(self, node: str) -> None:
        if node not in self.left:
            self.start_node(node, wait=False)

    def processes(self) -> dict[str, Proc]:
        return self.procs

    # -- settle ------------------------------------------------------------------------------
    def status(self) -> dict[str, Any] | None:
        for n, p in self.procs.items():
            if p.alive() and n not in self.left:
                doc = self.status_of(n)
                if doc is not None:
                    return doc
        return None

    def status_of(self, node: str) -> dict[str, Any] | None:
        """``cluster status`` as seen from ``node`` (None when it does not answer)."""
        from node.status import collect
        from node.wire import Pool, load_secret
        pool = Pool(load_secret(self.secret_file), role="client")
        try:
            return collect(pool, self.address(node))
        except Exception:  # noqa: BLE001 - down or restarting: the caller tries another
            return None
        finally:
            pool.close()

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

    def settled(self) -> bool:
        expect = {n for n, p in self.procs.items() if n not in self.left}
        if not all(self.procs[n].alive() for n in expect):
            return False
        doc = self.status()
        if doc is None:
            return False
        live = {n["id"] for n in doc["nodes"] if n["alive"] and not n["leaving"]}
        want = min(self.scenario.caches[0].backups + 1, len(live))
        self.last_status = doc
        return live == expect and not doc["moves"] and all(
            sorted(n for n, s in part["states"].items() if s == "OWNING") == sorted(part["owners"])
            and len(part["owners"]) == want and set(part["states"].values()) == {"OWNING"}
            and part["primary"] == part["owners"][0] for part in doc["partitions"])

    def stop(self) -> dict[str, int | None]:
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
            try:
                with open(os.path.join(d, "states.json")) as f:
                    states = json.load(f)["caches"].get(cache.name, {})
            except FileNotFoundError:
                continue
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
