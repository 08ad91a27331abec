"""Network, control-plane and disk faults of the ``cluster`` driver (a mixin of
:class:`ClusterDriver`), and the checks that go with them.

Network (:mod:`.partitions`): ``cut NODE`` (from its peers; ``proxy = true``),
``cut-control NODE`` (from etcd), ``isolate NODE`` (both), ``heal`` (everything),
``flap NODE`` (isolate/heal every ``period_s`` for ``duration_s``). ``NODE`` may be
``@controller``: the controller when the event fires. etcd (:mod:`.etcdfaults`):
``kill-etcd [etcdK|@leader]`` and ``restart-etcd [...]`` (empty: every member).
Processes (:mod:`.freeze`): ``sigstop NODE`` (SIGSTOP for ``duration_s``, then SIGCONT).

Checks: after each end of a fault (``heal``, a flap's end, ``restart-etcd``) the
cluster must converge within 3 lease TTLs (``converged_after_heal``,
:mod:`.convergence`; a new fault before that cancels the clock); a node cut from etcd
for 2 lease TTLs or more must have dropped out of the others' maps
(``control_cut_effective``: the cut really broke its keep-alive connections and watch);
while every etcd member is down, no write may be acknowledged once every lease could
have ended (``no_ack_while_control_plane_down``: from the kill + 1 TTL + a slack for
a write whose lease check came just before the fence, to the restart).

Disk (``disk = {node = ...}``): the node's data directory is a tmpfs
(:mod:`cluster_sim.diskfull`). ``fill NODE`` leaves ``free_mib`` free; ``free NODE``
waits until the node logged a move refused for lack of space, checks that the failure
was clean (check ``disk_full_move_failed_cleanly``: no partition of the node became
OWNING and no partition file was installed for a MOVING one), then deletes the filler;
the moves must retry and converge like any other.
"""
from __future__ import annotations

import os
import re
import threading
import time
from typing import Any

from checkpoint import parse_part_name, part_name
from node.errors import DataDirError
from node.states import read_states

from ..diskfull import Tmpfs
from ..errors import ProcessError
from ..scenario import CONTROLLER, Event
from .convergence import CONVERGE_TTLS, ConvergenceWatch, map_problems, settled_problems
from .etcdfaults import EtcdFaults
from .freeze import Freezer
from .partitions import Partitions

REFUSAL_TIMEOUT_S = 30.0
FENCE_SLACK_S = 2.0       # a write checked its lease just before the fence: replication, reply
# what transfer.OutOfDiskError / the free-disk check write into the node's log
REFUSED = re.compile(r"out of disk space|bytes free for partition|No space left on device")
TEMP_SUFFIX = ".ferry-tmp"   # a transfer's file while it arrives (transfer/resume.py)


class ClusterFaults:
    """Needs from the driver: scenario, procs, dir, timeline, etcd, data_dir(), status(),
    status_of(), map_of(), expected()."""

    def setup_faults(self: Any, listen_ports: dict[str, int], lease_ttl: float) -> None:
        self.checks: dict[str, list[str]] = {}
        self.lease_ttl = lease_ttl
        self.resolved: dict[str, str] = {}          # @controller -> the node it meant
        self.tmpfs: Tmpfs | None = None
        if self.scenario.disk is not None:
            self.tmpfs = Tmpfs(self.data_dir(self.scenario.disk.node), self.scenario.disk.size_mib)
            self.tmpfs.mount()
        self.partitions = Partitions(self.timeline, self.live_pids)
        if getattr(self, "etcd_tls", False):
            self.partitions.scheme = "https"
        if self.scenario.proxy:
            self.partitions.add_peer_proxies(listen_ports)
        if self.scenario.control_faults() or self.net is not None:
            # multi-host: a node in its namespace reaches etcd (on the host's loopback)
            # only through a proxy on its gateway address
            self.partitions.add_control_proxies(
                self.scenario.all_nodes(), [m.client_port for m in self.etcd.members],
                listen=self.net.gateway if self.net is not None else lambda n: "127.0.0.1")
        self.proxies = self.partitions.peer
        self.etcd_faults = EtcdFaults(self.etcd, self.timeline)
        # plus a second per 1,000 partitions: the check itself reads and compares every
        # node's map and status (at 4,096 partitions on a loaded 2-core machine, seconds)
        parts = sum(c.partitions for c in self.scenario.caches)
        self.convergence = ConvergenceWatch(self.converged_problems,
                                            CONVERGE_TTLS * lease_ttl + parts / 1000,
                                            self.timeline)
        self.partitions.on_healed = self.convergence.start
        self._heals = 0
        self._gone_watch = threading.Event()
        self.gone: dict[str, float] = {}            # node -> s from its etcd cut to its lease's end
        self.outages: list[list[float]] = []        # [start, end] with every etcd member down
        self.freezer = Freezer(self)

    def cleanup_faults(self: Any) -> None:
        self.freezer.thaw_all()
        self.convergence.cancel()
        self._gone_watch.set()
        self.partitions.stop()
        if self.tmpfs is not None:
            self.tmpfs.unmount()
        self.etcd.stop()

    def live_pids(self: Any) -> dict[str, int]:
        return {n: p.popen.pid for n, p in self.procs.items() if p.alive() and p.popen}

    def resolve(self: Any, node: str) -> str:
        """``@controller`` -> the controller now (the same node for the rest of the run)."""
        if node != CONTROLLER:
            return node
        if node not in self.resolved:
            deadline = time.monotonic() + 10 * self.lease_ttl
            while (doc := self.status()) is None or not doc.get("controller"):
                if time.monotonic() > deadline:
                    raise ProcessError("@controller: no node names a controller")
                time.sleep(0.2)
            self.resolved[node] = doc["controller"]
            self.timeline.mark(doc["controller"], "resolved", f"{node} is {doc['controller']}")
        return self.resolved[node]

    def fault_event(self: Any, ev: Event) -> bool:
        """Handle a fault event; False when ``ev`` is not one."""
        action, node = ev.action, self.resolve(ev.node)
        if action in ("cut", "cut-control", "isolate", "flap", "kill-etcd", "sigstop"):
            self.convergence.cancel()     # a new fault: the last heal's clock stops
        if action == "cut":
            self.partitions.cut_peers(node)
        elif action in ("cut-control", "isolate"):
            self._mark_led(node)
            (self.partitions.cut_control if action == "cut-control" else self.partitions.isolate)(node)
            self._gone_watch.clear()
            threading.Thread(target=self._await_gone, args=(node, time.monotonic()),
                             name=f"gone-{node}", daemon=True).start()
        elif action == "flap":
            self.partitions.flap(node, ev.duration_s, ev.period_s)
            self._heals += 1
        elif action == "sigstop":
            self.freezer.freeze(node, ev.duration_s)
        elif action == "heal":
            self._check_control_cuts()
            self.partitions.heal()
            self._heals += 1
            self.convergence.start("heal")
        elif action == "kill-etcd":
            self.etcd_faults.kill(node)
            if not any(m.alive() for m in self.etcd.members):
                self.outages.append([time.monotonic(), 0.0])
        elif action == "restart-etcd":
            if self.outages and not self.outages[-1][1]:
                self.outages[-1][1] = time.monotonic()
            self.etcd_faults.restart(node)
            self._heals += 1
            self.convergence.start("restart-etcd")
        elif action == "fill":
            assert self.tmpfs is not None and self.scenario.disk is not None
            if self.scenario.disk.mid_transfer:
                self.await_transfer(node)
            size = self.tmpfs.fill(self.scenario.disk.free_mib)
            self.timeline.mark(node, "disk full", f"filler {size >> 20} MiB")
        elif action == "free":
            self.await_refusal(node)
            assert self.tmpfs is not None
            self.tmpfs.free()
        else:
            return False
        return True

    def _mark_led(self: Any, node: str) -> None:
        """Mark how many partitions ``node`` leads as it is cut off (its own map): a
        node that leads none has no write of its own to refuse while cut."""
        m = self.map_of(node)
        if m is None:
            return
        led = sum(1 for recs in m.parts.values() for r in recs if r.primary == node)
        total = sum(len(recs) for recs in m.parts.values())
        self.timeline.mark(node, "leads", f"{led} of {total} partitions as it is cut off")

    def faults_busy(self: Any) -> bool:
        """A fault still running by itself (a flap, a frozen node)."""
        return self.partitions.flapping() or self.freezer.busy()

    # -- control-plane cuts --------------------------------------------------------------
    def dropped_by(self: Any, node: str) -> str | None:
        """A running node whose map no longer has ``node`` as a member (its lease ended
        in etcd), or None."""
        for peer, p in self.procs.items():
            if peer != node and p.alive() and peer not in self.freezer.frozen:
                m = self.map_of(peer)
                if m is not None and m.members and node not in m.members:
                    return peer
        return None

    def _await_gone(self: Any, node: str, since: float) -> None:
        """Until another node's map drops ``node`` (its lease expired in etcd): marked
        on the timeline; ``_check_control_cuts`` holds a long cut to it."""
        while not self._gone_watch.wait(0.2):
            if (peer := self.dropped_by(node)) is not None:
                self.gone[node] = round(time.monotonic() - since, 2)
                self.timeline.mark(node, "lease expired", f"{self.gone[node]:.1f}s after the cut "
                                   f"(seen by {peer})")
                return

    def _check_control_cuts(self: Any) -> None:
        self._gone_watch.set()          # the watchers of this cut stop
        if not self.partitions.cut_since:
            return
        problems = self.checks.setdefault("control_cut_effective", [])
        for node, since in self.partitions.cut_since.items():
            lasted = time.monotonic() - since
            if lasted >= 2 * self.lease_ttl and node not in self.gone:
                problems.append(f"{node} was cut from etcd for {lasted:.1f}s (lease TTL "
                                f"{self.lease_ttl:.0f}s) and no other node's map dropped it")

    # -- convergence ---------------------------------------------------------------------
    def converged_problems(self: Any) -> list[str]:
        """One map on every expected node, and settled (see :mod:`.convergence`)."""
        expect = self.expected()
        probs = map_problems({n: self.map_of(n) for n in sorted(expect)})
        return probs or settled_problems(self.status(), expect, self.scenario.caches[0].backups)

    # -- disk ---------------------------------------------------------------------------
    def await_transfer(self: Any, node: str) -> None:
        """Until a transfer to ``node`` is receiving its file (past its free-disk check):
        a ``part-<p>.bin.ferry-tmp`` in the node's data dir (the temp file the demander
        creates before it asks for the file), and then that move's ``bytes_total`` in
        the node's status, known once the demander has checked the free space against
        the file's size and accepted it. The temp file alone is too early: a disk that
        fills between it and that check fails the move at the check, not mid-file. Not
        "has data": the demander writes a chunk once it is whole and checked, so a small
        file's data may land all at once, with nothing left to write when the disk
        fills."""
        problems = self.checks.setdefault("disk_full_move_failed_cleanly", [])
        folder = os.path.join(self.data_dir(node), "caches", self.scenario.caches[0].name)
        deadline = time.monotonic() + REFUSAL_TIMEOUT_S
        self.caught: str | None = None
        while time.monotonic() < deadline:
            try:
                names = os.listdir(folder)
            except OSError:
                names = []
            for name in names:
                if name.endswith(".bin" + TEMP_SUFFIX):
                    self.caught = name[:-len(TEMP_SUFFIX)]
                    p = parse_part_name(self.caught)
                    if p is not None:
                        self._await_accepted(node, p, deadline)
                    self.timeline.mark(node, "transfer running", f"{name} created")
                    return
            time.sleep(0.005)
        problems.append(f"{node}: no transfer wrote data within {REFUSAL_TIMEOUT_S:.0f}s")

    def _await_accepted(self: Any, node: str, p: int, deadline: float) -> None:
        """Until ``node``'s move of partition ``p`` knows its file's size (the transfer
        passed its free-disk check), or ``deadline``."""
        while time.monotonic() < deadline:
            doc = self.status_of(node) or {}
            if any(m.get("to") == node and m.get("partition") == p and (m.get("bytes_total") or 0) > 0
                   for m in doc.get("moves") or []):
                return
            time.sleep(0.01)

    def await_refusal(self: Any, node: str) -> None:
        problems = self.checks.setdefault("disk_full_move_failed_cleanly", [])
        log_path = self.procs[node].log
        deadline = time.monotonic() + REFUSAL_TIMEOUT_S
        while time.monotonic() < deadline:
            with open(log_path, errors="replace") as f:
                m = REFUSED.search(f.read())
            if m:
                break
            time.sleep(0.2)
        else:
            problems.append(f"{node}: no move failed for lack of space within {REFUSAL_TIMEOUT_S:.0f}s "
                            "of the disk filling up (did a move start?)")
            return
        self.timeline.mark(node, "move refused", m.group(0))
        problems.extend(_unclean(self.data_dir(node), self.scenario.caches[0].name,
                                 only=getattr(self, "caught", None)))

    def extra_checks(self: Any) -> dict[str, list[str]]:
        out = dict(self.checks)
        if self._heals:
            out["converged_after_heal"] = list(self.convergence.problems)
        if self.outages:
            out["no_ack_while_control_plane_down"] = self._acks_in_outages()
        return out

    def _acks_in_outages(self: Any) -> list[str]:
        out = []
        for start, end in self.outages:
            lo, hi = start + self.lease_ttl + FENCE_SLACK_S, end or time.monotonic()
            for a in self.model.acks:
                if lo <= a.at <= hi:
                    out.append(f"{a.key!r} acknowledged by {a.by or '?'} (counter {a.counter}) "
                               f"{a.at - start:.1f}s after every etcd member was killed "
                               f"(restart at {hi - start:.1f}s)")
        return out[:20]


def _unclean(data: str, cache: str, only: str | None = None) -> list[str]:
    """While every fetch is refused: no partition of the node OWNING, no file installed.
    ``only`` (``part-<p>.bin``, a disk filled mid-transfer): the other moves may have
    finished their transfers before the disk filled and failed later (index rebuild,
    replay; they restart), so only the partition whose transfer ran out of space is held
    to "not installed"."""
    try:
        states = read_states(data).get(cache, {})
    except DataDirError:
        return []
    out = [f"partition {p} became {st} on a disk with no room for it" for p, st in states.items()
           if st == "OWNING"]
    for p, st in states.items():
        if only is not None and part_name(p) != only:
            continue
        path = os.path.join(data, "caches", cache, part_name(p))
        if st == "MOVING" and os.path.exists(path) and os.path.getsize(path) > 0:
            out.append(f"partition {p} is MOVING but {path} was installed "
                       f"({os.path.getsize(path)} bytes)")
    return out
