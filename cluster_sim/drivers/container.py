"""Container mode of the cluster driver: every node in its own container (see
:mod:`cluster_sim.containerprocs`), and the faults only containers give.

Used like the network-namespace mode, as the run's ``net``::

    engine = Engine.find_or_start()
    with ContainerMode(engine, ContainerSpec(slow_disk={"n3": SlowDisk(256 << 10)})) as mode:
        result = cluster_sim.run(scenario, seed=1, net=mode)

The cluster driver asks the mode for each node's :class:`ContainerProc` (``proc``),
calls ``attach`` at its setup, ``fault`` for the container events and ``release`` at
its cleanup. Faults:

- ``pause NODE`` / ``unpause NODE`` (events): ``docker pause`` freezes every process of
  the node (cgroup freezer): the classic GC pause. Its sockets stay open and the
  kernel still accepts connections for it; it answers nothing, renews no lease. Check
  ``pause_lease_expired``: a pause of 2 lease TTLs or more must end with another
  node's map without it (its lease expired in etcd); after ``unpause`` the cluster must
  converge within 3 TTLs (``converged_after_unpause``), the frozen node having woken
  with a stale view of the map.
- a slow disk (``ContainerSpec.slow_disk``): the node's data directory on its own loop
  device (:mod:`cluster_sim.loopdisk`) throttled by ``--device-write-bps`` /
  ``--device-read-bps``. Check ``slow_disk_effective``: the node's container did write
  through the throttled device (docker's blkio stats, sampled every second).
- a memory limit (``ContainerSpec.memory_mib``/``memory``): ``--memory`` with no swap;
  a node the kernel OOM-kills is a crash like any other (restarted, timeline mark
  ``oom-killed``).
"""
from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from ..builtins import BUILTINS, PARTITIONED, TTL
from ..builtins import load as load_scenario
from ..containerprocs import LABEL, Box, ContainerLife, ContainerProc
from ..containers import Engine, configure_testcontainers, node_mounts
from ..errors import SimError
from ..loopdisk import LoopDisk, require as require_loop
from ..scenario import CONTROLLER, Event, Scenario

SAMPLE_S = 1.0            # blkio stats of throttled nodes
MEMORY_MIB = 512          # every node's limit in the built-in container runs (a node: ~60 MB)
SLOW_WRITE_BPS = 64 << 10     # the slow disk: 64 KiB/s


@dataclass(frozen=True)
class SlowDisk:
    """A node's data device limited to ``write_bps`` (and ``read_bps``, 0: none) bytes/s."""
    write_bps: int
    read_bps: int = 0
    size_mib: int = 256     # the transfer wants a partition plus 64 MiB free


@dataclass(frozen=True)
class ContainerSpec:
    """Per-node container options of a run."""
    slow_disk: dict[str, SlowDisk] = field(default_factory=dict)
    memory_mib: int = 0                                   # every node (0: no limit)
    memory: dict[str, int] = field(default_factory=dict)  # per node, over memory_mib

    def memory_of(self, node: str) -> int:
        return self.memory.get(node, self.memory_mib)


def _option(argv: list[str], name: str) -> str:
    try:
        return argv[argv.index(name) + 1]
    except (ValueError, IndexError):
        raise SimError(f"container mode: the node's command has no {name}: {argv}") from None


class ContainerMode:
    """The ``net`` of a run in container mode; a context manager that releases what is
    left (containers, loop devices) at exit."""

    def __init__(self, engine: Engine, spec: ContainerSpec | None = None) -> None:
        configure_testcontainers()
        engine.activate()
        self.engine, self.spec = engine, spec or ContainerSpec()
        self.image = engine.image()
        if self.spec.slow_disk:
            require_loop()
        self.tag = uuid.uuid4().hex[:6]
        self.procs: dict[str, ContainerProc] = {}
        self.disks: dict[str, LoopDisk] = {}
        self.driver: Any = None
        self.paused: dict[str, float] = {}        # node -> when it was frozen
        self.gone: dict[str, float] = {}          # node -> s from its pause to its lease's end
        self.written: dict[str, dict[str, int]] = {}   # node -> container -> bytes on its device
        self._stop = threading.Event()
        self._lock = threading.Lock()

    # -- what the driver asks of a multi-host mode ---------------------------------------
    def host(self, node: str) -> str:
        return "127.0.0.1"              # host networking: each node on its own port

    def gateway(self, node: str) -> str:
        """Where the node reaches the host (the run's etcd, its control proxies): host
        networking shares the host's loopback."""
        return "127.0.0.1"

    def prefix(self, node: str) -> list[str]:
        return []

    def attach(self, driver: Any) -> None:
        """At the driver's setup: the slow disks, mounted before any node starts, and
        the checks this mode reports (in the driver's ``checks``). A mode may serve one
        run after another: each gets its own tag and state."""
        self.driver = driver
        self.tag = uuid.uuid4().hex[:6]
        self.procs, self.paused, self.gone, self.written = {}, {}, {}, {}
        self._stop = threading.Event()
        for node, slow in self.spec.slow_disk.items():
            disk = LoopDisk(driver.data_dir(node), slow.size_mib)
            disk.mount()
            self.disks[node] = disk
            driver.timeline.mark(node, "slow disk", f"{disk.device}: {slow.write_bps} B/s write"
                                 + (f", {slow.read_bps} B/s read" if slow.read_bps else ""))
        if self.disks:
            driver.checks["slow_disk_effective"] = []
            threading.Thread(target=self._sample, name="blkio", daemon=True).start()

    def proc(self, name: str, argv: list[str], log: str, *, trace: str | None = None,
             crash: str | None = None, prefix: list[str] | None = None) -> ContainerProc:
        """The node's process: a container per life (see :mod:`cluster_sim.containerprocs`)."""
        data = _option(argv, "--data")
        os.makedirs(data, exist_ok=True)
        for path in (log, trace):
            if path:
                open(path, "ab").close()        # a bind mount needs the file to exist
        mounts = [*node_mounts(),
                  (_option(argv, "--config"), _option(argv, "--config"), "ro"),
                  (data, data, "rw"), (log, log, "rw")]
        # the node's credentials, read-only, one file each (never a CA's key): the
        # secret, or with tls its certificate, key and CA, and with etcd's TLS the node
        # role's certificate, key, password file and etcd's CA
        mounts += [(f, f, "ro") for f in self.driver.credentials_of(name)]
        if "--secret-file" in argv:
            secret = _option(argv, "--secret-file")
            mounts.append((secret, secret, "ro"))
        if trace:
            mounts.append((trace, trace, "rw"))
        slow = self.spec.slow_disk.get(name)
        disk = self.disks.get(name)
        if slow is not None and disk is None:
            raise SimError(f"container mode: {name}'s slow disk is not mounted (attach not called)")
        box = Box(self.image, self.tag, tuple(mounts), memory_mib=self.spec.memory_of(name),
                  device=disk.device if disk else "",
                  write_bps=slow.write_bps if slow else 0, read_bps=slow.read_bps if slow else 0)
        p = ContainerProc(name, argv, log, trace=trace, crash=crash, box=box,
                          host=self.engine.host,
                          on_exit=lambda life, node=name: self._exited(node, life))
        self.procs[name] = p
        return p

    # -- faults ------------------------------------------------------------------------
    def fault(self, ev: Event, node: str) -> None:
        """``pause NODE`` (thawed by ``unpause NODE``, or by itself after ``duration_s``:
        exact, whatever the workload does meanwhile)."""
        d = self.driver
        if ev.action == "pause":
            life = self._life(node)
            d.convergence.cancel()          # a new fault: the last heal's clock stops
            life.pause()
            self.paused[node] = time.monotonic()
            d.timeline.mark(node, "paused", life.name + (f" for {ev.duration_s:.1f}s" if ev.duration_s else ""))
            threading.Thread(target=self._await_gone, args=(node,), name=f"gone-{node}",
                             daemon=True).start()
            if ev.duration_s > 0:
                threading.Thread(target=self._thaw_after, args=(node, ev.duration_s),
                                 name=f"thaw-{node}", daemon=True).start()
        elif ev.action == "unpause":
            if not self._thaw(node):
                raise SimError(f"unpause {node}: it is not paused")
        else:
            raise SimError(f"container mode cannot {ev.action} {node}")

    def _thaw_after(self, node: str, seconds: float) -> None:
        if not self._stop.wait(seconds):
            self._thaw(node)

    def _thaw(self, node: str) -> bool:
        """Unpause ``node``, check its lease ran out if the pause was long enough, and
        start the convergence clock. False when it was not paused."""
        with self._lock:
            since = self.paused.pop(node, None)
        if since is None:
            return False
        d = self.driver
        self._life(node).unpause()
        lasted = time.monotonic() - since
        d.timeline.mark(node, "unpaused", f"after {lasted:.1f}s")
        probs = d.checks.setdefault("pause_lease_expired", [])
        if lasted >= 2 * d.lease_ttl and node not in self.gone:
            probs.append(f"{node} was frozen for {lasted:.1f}s (lease TTL {d.lease_ttl:.0f}s) "
                         "and no other node's map dropped it")
        # the list the heal checks fill too: what this clock finds lands there as well
        d.checks["converged_after_unpause"] = d.convergence.problems
        d.convergence.start("unpause")
        return True

    def _life(self, node: str) -> ContainerLife:
        p = self.procs.get(node)
        if p is None or p.popen is None or p.popen.poll() is not None:
            raise SimError(f"{node} has no running container to pause or thaw")
        return p.popen

    def _await_gone(self, node: str) -> None:
        """While ``node`` is frozen: until another node's map drops it (timeline mark)."""
        since = self.paused.get(node, time.monotonic())
        while node in self.paused and not self._stop.is_set():
            if (peer := self.driver.dropped_by(node)) is not None:
                self.gone[node] = round(time.monotonic() - since, 2)
                self.driver.timeline.mark(node, "lease expired",
                                          f"{self.gone[node]:.1f}s into the pause (seen by {peer})")
                return
            self._stop.wait(0.2)

    # -- slow disk and memory --------------------------------------------------------------
    def _sample(self) -> None:
        """Bytes each throttled node's containers wrote to their device (blkio stats)."""
        while not self._stop.wait(SAMPLE_S):
            self._sample_once()

    def _sample_once(self) -> None:
        for node, disk in self.disks.items():
            p = self.procs.get(node)
            if p is None or p.popen is None or p.popen.poll() is not None or not disk.device:
                continue
            st = os.stat(disk.device).st_rdev
            dev = (os.major(st), os.minor(st))
            stats = p.popen.stats().get("blkio_stats") or {}
            n = sum(int(e.get("value", 0)) for e in stats.get("io_service_bytes_recursive") or []
                    if (e.get("major"), e.get("minor")) == dev and str(e.get("op")).lower() == "write")
            seen = self.written.setdefault(node, {})
            seen[p.popen.name] = max(seen.get(p.popen.name, 0), n)

    def _exited(self, node: str, life: ContainerLife) -> None:
        if life.oom_killed and self.driver is not None:
            self.driver.timeline.mark(node, "oom-killed", life.name)

    # -- the end ---------------------------------------------------------------------------
    def release(self) -> None:
        """Remove every container of the run (each life's waiter removes its own; this
        catches the rest), then unmount the slow disks keeping their files."""
        self._stop.set()
        self._finish_checks()
        self._remove_containers()
        for disk in self.disks.values():
            disk.unmount()
        self.disks.clear()

    def _finish_checks(self) -> None:
        if self.driver is None or not self.disks:
            return
        probs = self.driver.checks.setdefault("slow_disk_effective", [])
        for node, slow in self.spec.slow_disk.items():
            n = sum(self.written.get(node, {}).values())
            self.driver.timeline.mark(node, "slow disk written", f"{n} bytes through the "
                                      f"{slow.write_bps} B/s limit ({n / slow.write_bps:.1f}s "
                                      "at that rate)")
            if n == 0 and node in self.procs:
                probs.append(f"{node} wrote nothing through its throttled device "
                             f"(blkio stats of its containers)")

    def _remove_containers(self) -> None:
        try:
            client = self.engine.client()
        except Exception:  # noqa: BLE001 - the engine is gone: so are its containers
            return
        try:
            for c in client.containers.list(all=True, filters={"label": f"{LABEL}={self.tag}"}):
                try:
                    c.remove(force=True)
                except Exception:  # noqa: BLE001 - removed meanwhile by its waiter
                    pass
        finally:
            client.close()

    def __enter__(self) -> ContainerMode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# The container runs: a scenario and what its nodes' containers get. `join` and
# `kill-restart` are the built-ins as they are, each node in a container under a memory
# limit; `pause` and `slow-disk-join` need containers.
SCENARIOS: dict[str, tuple[Scenario, ContainerSpec]] = {
    "join": (BUILTINS["join"], ContainerSpec(memory_mib=MEMORY_MIB)),
    "kill-restart": (BUILTINS["kill-restart"], ContainerSpec(memory_mib=MEMORY_MIB)),
    "pause": (Scenario(
        name="pause",
        description="the controller is frozen (docker pause: a GC pause) for 3 lease TTLs under "
                    "writes sent through every node: its lease expires, another node takes over; "
                    "thawed, it wakes with a stale map, must not act on it, and rejoins",
        nodes=("n1", "n2", "n3"), workload=PARTITIONED,
        events=(Event(120, "pause", CONTROLLER, duration_s=3 * TTL),),
        settle_timeout=60.0), ContainerSpec(memory_mib=MEMORY_MIB)),
    "slow-disk-join": (replace(
        BUILTINS["join"], name="slow-disk-join",
        # values of 2-4 KB: n3's share (partition files, WAL, indexes) is about a MiB,
        # several seconds at the disk's rate
        workload=replace(BUILTINS["join"].workload, value_size=(2000, 4000)),
        description="two nodes under writes; a third joins with its data on a disk that writes "
                    f"{SLOW_WRITE_BPS >> 10} KiB/s (its fsyncs wait) and pulls its share"),
        ContainerSpec(memory_mib=MEMORY_MIB,
                      slow_disk={"n3": SlowDisk(SLOW_WRITE_BPS, read_bps=SLOW_WRITE_BPS)})),
}


def load(name_or_file: str) -> tuple[Scenario, ContainerSpec]:
    """A container run by name (:data:`SCENARIOS`), else any scenario (built-in name or
    file) with every node in a container and no limits."""
    if name_or_file in SCENARIOS:
        return SCENARIOS[name_or_file]
    return load_scenario(name_or_file), ContainerSpec()


def run_in_containers(scenario: Scenario, spec: ContainerSpec, **run_kw: Any) -> Any:
    """One run in container mode on the engine there is, or a private one started for it
    (and stopped after); ``run_kw`` as :func:`cluster_sim.run`. Raises SimSkipped with
    the reason where no engine can start."""
    from ..runner import run
    engine = Engine.find_or_start()
    try:
        with ContainerMode(engine, spec) as mode:
            return run(scenario, net=mode, **run_kw)
    finally:
        engine.stop()
