"""What a simulation run is: a scenario (cluster, caches, workload, topology events,
network faults) plus a crash plan, loaded from a built-in name, a TOML or a JSON file.

A scenario names *roles* (``supplier``, ``demander``, ``third``) for its processes, so a
crash plan says "crash the demander at ``demander.mid_receive``, 2nd hit" without
knowing node ids; the runner puts ``FERRY_CRASH`` in that process's environment only.

One driver runs scenarios (see :mod:`cluster_sim.runner`), ``cluster``: real ``ferry
node`` processes on loopback with their own etcd, a workload through ``node.Client``
(each write through one node's view of the map), topology events (join, leave, kill,
restart) and partitions (cut from peers, from the control plane, both, flapping; etcd
members killed and restarted). Every crash point is reached through the nodes' own
code: moves, supplies, delta catch-up and eviction included.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from faults import POINTS

from .errors import ScenarioError

SIDES = ("supplier", "demander", "third")
ACTIONS = ("join", "leave", "kill", "restart", "cut", "heal", "fill", "free",
           "cut-control", "isolate", "flap", "kill-etcd", "restart-etcd", "pause", "unpause",
           "sigstop")
# Events whose node is a process of the scenario (the others name a fault's target)
NODE_ACTIONS = ("join", "leave", "kill", "restart")
# Network partitions of one node (cluster driver): peers, control plane, both, flapping
PARTITION_ACTIONS = ("cut", "cut-control", "isolate", "flap")
ETCD_ACTIONS = ("kill-etcd", "restart-etcd")
# Faults only a node in a container can have (container mode: drivers/container.py)
CONTAINER_ACTIONS = ("pause", "unpause")
# Placeholders resolved when the event fires (and kept for the rest of the run):
# the nodes' control-plane lease in harness clusters (short: fault scenarios last whole TTLs)
LEASE_TTL_S = 2
CONTROLLER = "@controller"     # the node `cluster status` names controller
LEADER = "@leader"             # the etcd member that is raft leader
# Time budget parts (seconds) when the scenario gives none: see Scenario.budget()
BUDGET_START_S, BUDGET_EVENT_S, BUDGET_STOP_S, BUDGET_CHECKS_S = 60.0, 20.0, 90.0, 60.0
DRIVERS = ("cluster",)
DISTRIBUTIONS = ("uniform", "zipf", "sequential")


@dataclass(frozen=True)
class IndexSpec:
    name: str = "by_city"
    field: str = "city"


@dataclass(frozen=True)
class CacheSpec:
    name: str = "default"
    partitions: int = 8
    backups: int = 1
    indexes: tuple[IndexSpec, ...] = (IndexSpec(),)


@dataclass(frozen=True)
class WorkloadSpec:
    writers: int = 1
    ops: int = 300                 # per writer
    rate: float = 0.0              # ops/s per writer; 0 = as fast as acknowledgements come
    keys: int = 150                # distinct keys per writer
    distribution: str = "uniform"
    value_size: tuple[int, int] = (40, 200)
    remove_ratio: float = 0.1
    preload: int = 0               # entries put in bulk before the clock starts
    read_ratio: float = 0.0        # share of each writer's operations that are reads (cluster)
    readers: int = 0               # processes that only read, ``ops`` reads each (cluster)
    pinned: bool = False           # each process through one node's view (process i: node i % n)


@dataclass(frozen=True)
class DiskSpec:
    """One node's data directory on a tmpfs of ``size_mib``; a ``fill`` event leaves
    ``free_mib`` free (below the transfer's 64 MiB margin: fetches are refused), a
    ``free`` event deletes the filler once a move was seen to fail.

    ``mid_transfer``: the ``fill`` waits until the node has a move in its transfer
    stage (the free-disk check passed) and then fills the disk, ``free_mib`` may be 0:
    the transfer's writes run out of space mid-file (pair with ``transfer_rate`` so
    that a small partition's transfer lasts long enough to be caught)."""
    node: str
    size_mib: int = 96
    free_mib: int = 16
    mid_transfer: bool = False


@dataclass(frozen=True)
class Event:
    """``action`` on ``node`` once the workload has issued ``at`` operations in total,
    or at the latest ``max_wait`` seconds after the previous event (0 = no bound): a
    workload stalled by unavailable partitions (each write waits for its timeout) must
    not hold back the event that ends the outage, e.g. the restart after a kill.
    ``min_wait``: and not before this many seconds after the previous event (a cut that
    must last, e.g. 5 lease TTLs, however fast the writes go).

    ``node`` may be ``@controller`` (cut, cut-control, isolate, flap, kill, restart:
    the controller when the event fires; later events mean the same node), an etcd
    member ``etcdK`` or ``@leader`` (kill-etcd, restart-etcd; empty: every member),
    and is empty for ``heal`` (everything heals). ``flap``: cut and heal the node from
    peers and control plane every ``period_s`` for ``duration_s`` seconds, ending healed."""
    at: int
    action: str
    node: str = ""
    max_wait: float = 0.0
    min_wait: float = 0.0
    duration_s: float = 0.0
    period_s: float = 1.0


@dataclass(frozen=True)
class CrashPlan:
    point: str
    side: str = "demander"
    nth: int | None = 1            # crash on the Nth hit ...
    probability: float | None = None   # ... or with this probability, seeded

    def spec(self, seed: int) -> str:
        """The ``FERRY_CRASH`` value for the target process."""
        if self.probability is not None:
            return f"{self.point}@{self.probability}#{seed}"
        return f"{self.point}:{self.nth or 1}"

    def label(self) -> str:
        return f"{self.point}@{self.probability}" if self.probability is not None else \
            f"{self.point}:{self.nth or 1}"


@dataclass(frozen=True)
class Scenario:
    name: str
    driver: str = "cluster"
    nodes: tuple[str, ...] = ("n1", "n2")          # started before the workload
    caches: tuple[CacheSpec, ...] = (CacheSpec(),)
    workload: WorkloadSpec = WorkloadSpec()
    events: tuple[Event, ...] = ()
    roles: dict[str, str] = field(default_factory=dict)   # side -> node id
    crash: CrashPlan | None = None
    proxy: bool = False            # a loopback proxy in front of every node's RPC port
    disk: DiskSpec | None = None   # one node's data dir on a small tmpfs (cluster)
    transfer_rate: int = 0         # [transfer] rate_limit of every node, bytes/s (0: none)
    stream_index: bool = False     # [rebalance] stream_index of every node (the streaming install)
    index_transfer: str = "rebuild"  # [rebalance] index_transfer of every node (ship: the shipped index)
    # mutual TLS for the nodes' links (node RPC, client RPC, transfers) with certificates
    # of the run's own CA, instead of the shared secret; the harness's clients hold a
    # client certificate (cluster)
    tls: bool = False
    settle_timeout: float = 90.0
    control_plane_members: int = 1 # etcd members of the run's control plane (cluster)
    # the nodes started first are the cluster's initial members (--initial-members):
    # each creates its share of the partitions, so nothing moves before the workload
    initial_members: bool = False
    time_budget: float = 0.0       # seconds for the whole run; 0: budget() computes one
    description: str = ""

    def all_nodes(self) -> list[str]:
        out = list(self.nodes)
        for e in self.events:
            if e.action in NODE_ACTIONS and e.node not in out and not e.node.startswith("@"):
                out.append(e.node)
        return out

    def budget(self) -> float:
        """The run's time budget: ``time_budget``, or one computed from the scenario --
        start, the workload at its rate (x2 for writes slowed by faults), every event's
        waits plus a slack, the settle timeout, the final stop and the checks. Past it
        the run is stopped and fails naming the step it was in (it never hangs)."""
        if self.time_budget > 0:
            return self.time_budget
        w = self.workload
        per_op = 1.0 / w.rate if w.rate > 0 else 0.05
        events = sum(max(e.min_wait, e.duration_s) + BUDGET_EVENT_S for e in self.events)
        return round(BUDGET_START_S + 2 * w.ops * per_op + events + self.settle_timeout
                     + BUDGET_STOP_S + BUDGET_CHECKS_S, 1)

    def control_faults(self) -> bool:
        """Whether nodes reach etcd through per-node proxies (a control-plane cut)."""
        return any(e.action in ("cut-control", "isolate", "flap") for e in self.events)

    def target(self) -> str | None:
        """The node (or process) the crash plan arms."""
        if self.crash is None:
            return None
        if self.crash.side not in self.roles:
            raise ScenarioError(f"scenario {self.name!r} has no {self.crash.side!r} process; "
                                f"its sides are {', '.join(self.roles) or 'none'}")
        return self.roles[self.crash.side]

    def with_crash(self, crash: CrashPlan | None) -> Scenario:
        return replace(self, crash=crash)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def validate(s: Scenario) -> Scenario:
    """Refuse what cannot run, naming the field; returns ``s``."""
    def bad(msg: str) -> ScenarioError:
        return ScenarioError(f"scenario {s.name!r}: {msg}")
    if s.driver not in DRIVERS:
        raise bad(f"driver {s.driver!r} is not one of {', '.join(DRIVERS)}")
    if not s.nodes:
        raise bad("nodes must name at least one process")
    if s.index_transfer not in ("rebuild", "ship", "auto"):
        raise bad(f"index_transfer {s.index_transfer!r} is not one of rebuild, ship, auto")
    for c in s.caches:
        if c.partitions < 1 or c.backups < 0:
            raise bad(f"cache {c.name!r}: partitions must be >= 1 and backups >= 0")
    w = s.workload
    if w.writers < 1 or w.ops < 0 or w.keys < 1:
        raise bad("workload needs writers >= 1, ops >= 0, keys >= 1")
    if w.distribution not in DISTRIBUTIONS:
        raise bad(f"workload.distribution {w.distribution!r} is not one of {', '.join(DISTRIBUTIONS)}")
    if not 0 <= w.remove_ratio < 1:
        raise bad("workload.remove_ratio must be in [0, 1)")
    if not 0 <= w.read_ratio < 1:
        raise bad("workload.read_ratio must be in [0, 1)")
    if w.readers < 0:
        raise bad("workload.readers must be >= 0")
    lo, hi = w.value_size
    if not 1 <= lo <= hi <= 64 << 10:
        raise bad("workload.value_size must be [lo, hi] with 1 <= lo <= hi <= 65536")
    if s.control_plane_members < 1 or s.time_budget < 0:
        raise bad("control_plane_members must be >= 1 and time_budget >= 0 (0: computed)")
    for e in s.events:
        _check_event(s, e, bad)
    if s.disk is not None:
        d = s.disk
        if s.driver != "cluster":
            raise bad("disk needs the cluster driver")
        if d.node not in s.all_nodes():
            raise bad(f"disk.node {d.node!r} is not a node of the scenario")
        if not (0 if d.mid_transfer else 1) <= d.free_mib < d.size_mib:
            raise bad("disk needs 1 <= free_mib < size_mib (0 <= free_mib with mid_transfer)")
    if s.transfer_rate < 0:
        raise bad("transfer_rate must be >= 0 bytes/s (0: unlimited)")
    for side, node in s.roles.items():
        if side not in SIDES:
            raise bad(f"role {side!r} is not one of {', '.join(SIDES)}")
        if node not in s.all_nodes():
            raise bad(f"role {side} names {node!r}, which is not a node of the scenario")
    if s.crash is not None:
        c = s.crash
        if c.point not in POINTS:
            raise bad(f"crash point {c.point!r} is unknown; known: {', '.join(sorted(POINTS))}")
        if c.side not in SIDES:
            raise bad(f"crash side {c.side!r} is not one of {', '.join(SIDES)}")
        if c.probability is None and (c.nth is None or c.nth < 1):
            raise bad("crash.nth must be >= 1")
        if c.probability is not None and not 0 < c.probability <= 1:
            raise bad("crash.probability must be in (0, 1]")
        s.target()
    return s


def _check_event(s: Scenario, e: Event, bad: Any) -> None:
    what = f"event {e.action} {e.node}".rstrip()
    if e.action not in ACTIONS:
        raise bad(f"event action {e.action!r} is not one of {', '.join(ACTIONS)}")
    if e.at < 0 or e.max_wait < 0 or e.min_wait < 0 or e.duration_s < 0:
        raise bad(f"{what}: 'at', 'max_wait', 'min_wait' and 'duration_s' must be >= 0")
    if e.action not in ("heal", *ETCD_ACTIONS) and not e.node:
        raise bad(f"{what}: needs a node")
    if e.action in ("fill", "free") and (s.disk is None or e.node != s.disk.node):
        raise bad(f"{what}: needs disk = {{node = {e.node!r}}}")
    if e.action in ("cut", "isolate", "flap") and s.driver == "cluster" and not s.proxy:
        raise bad(f"{what}: needs proxy = true")
    if s.driver != "cluster" and e.action in ("cut-control", "isolate", "flap", *ETCD_ACTIONS,
                                              *CONTAINER_ACTIONS):
        raise bad(f"{what}: needs the cluster driver")
    if e.node == CONTROLLER and e.action not in (*PARTITION_ACTIONS, "kill", "restart", "sigstop",
                                                 *CONTAINER_ACTIONS):
        raise bad(f"{what}: {CONTROLLER} names a node for a cut, isolate, flap, kill, restart, "
                  "sigstop, pause or unpause")
    if e.node.startswith("@") and e.node not in (CONTROLLER, LEADER):
        raise bad(f"{what}: {e.node!r} is not {CONTROLLER} or {LEADER}")
    if e.action in ETCD_ACTIONS:
        members = [f"etcd{i + 1}" for i in range(s.control_plane_members)]
        if e.node not in ("", LEADER, *members):
            raise bad(f"{what}: the etcd member must be one of {', '.join(members)}, "
                      f"{LEADER}, or empty for all (control_plane_members = {s.control_plane_members})")
    elif e.node == LEADER:
        raise bad(f"{what}: {LEADER} names an etcd member (kill-etcd, restart-etcd)")
    if e.action == "flap" and (e.duration_s <= 0 or e.period_s <= 0):
        raise bad(f"{what}: needs duration_s > 0 and period_s > 0")
    if e.action == "sigstop" and (e.duration_s <= 0 or s.driver != "cluster"):
        raise bad(f"{what}: needs duration_s > 0 and the cluster driver")


# -- loading ------------------------------------------------------------------------------
def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
                            f"known: {', '.join(sorted(known))}")
    return cls(**data)


def from_dict(data: dict[str, Any], *, where: str = "scenario") -> Scenario:
    """A scenario from plain data (parsed TOML or JSON)."""
    if not isinstance(data, dict) or "name" not in data:
        raise ScenarioError(f"{where}: a scenario is a table with at least a 'name'")
    d = dict(data)
    try:
        caches = []
        for c in d.pop("caches", [{}]):
            c = dict(c)
            c["indexes"] = tuple(_build(IndexSpec, i, f"{where}: caches.indexes")
                                 for i in c.get("indexes", [asdict(IndexSpec())]))
            caches.append(_build(CacheSpec, c, f"{where}: caches"))
        w = dict(d.pop("workload", {}))
        if "value_size" in w:
            w["value_size"] = tuple(w["value_size"])
        workload = _build(WorkloadSpec, w, f"{where}: workload")
        events = tuple(_build(Event, e, f"{where}: events") for e in d.pop("events", []))
        crash = d.pop("crash", None)
        crash = _build(CrashPlan, crash, f"{where}: crash") if crash else None
        disk = d.pop("disk", None)
        d["disk"] = _build(DiskSpec, disk, f"{where}: disk") if disk else None
        if "nodes" in d:
            d["nodes"] = tuple(d["nodes"])
        s = _build(Scenario, d | {"caches": tuple(caches), "workload": workload,
                                  "events": events, "crash": crash}, where)
    except TypeError as e:
        raise ScenarioError(f"{where}: {e}") from None
    return validate(s)
