"""Network and disk faults of the ``cluster`` driver (a mixin of :class:`ClusterDriver`).

Network (``proxy = true``): every node advertises a loopback proxy in front of its RPC
port (``--advertise``, node/config.py), so peers reach it -- heartbeats, replication,
map pushes, register -- only through that proxy. ``cut NODE`` blocks, on NODE's proxy,
the connections of every other node process, and on every other proxy those of NODE
(:meth:`netproxy.Proxy.block`): NODE is cut off from its peers both ways while the
harness (its clients and status) and the control plane (etcd) still reach everyone.
Replication to NODE fails, so its primaries' peers leave NODE's copies out of the
in-sync sets (through the controller, via etcd) and NODE's own primaries cannot
acknowledge; ``heal NODE`` unblocks and NODE's copies resync. The file transfer port is not proxied (node/ advertises the address it binds).

Disk (``disk = {node = ...}``): the node's data directory is a tmpfs
(:mod:`cluster_sim.diskfull`). ``fill NODE`` leaves ``free_mib`` free; ``free NODE``
waits until the node logged a move refused for lack of space, checks that the failure
was clean (check ``disk_full_move_failed_cleanly``: no partition of the node became
OWNING and no partition file was installed for a MOVING one), then deletes the filler;
the moves must retry and converge like any other.
"""
from __future__ import annotations

import json
import os
import re
import time
from typing import Any

from ..diskfull import Tmpfs
from ..netproxy import Proxy

DECLARE_TIMEOUT_S = 20.0
REFUSAL_TIMEOUT_S = 30.0
# what transfer.OutOfDiskError / the free-disk check write into the node's log
REFUSED = re.compile(r"out of disk space|bytes free for partition|No space left on device")
TEMP_SUFFIX = ".ferry-tmp"   # a transfer's file while it arrives (transfer/resume.py)


class ClusterFaults:
    """Needs from the driver: scenario, procs, dir, timeline, data_dir(), status_of()."""

    def setup_faults(self: Any, listen_ports: dict[str, int]) -> None:
        self.checks: dict[str, list[str]] = {}
        self.proxies: dict[str, Proxy] = {}
        self.tmpfs: Tmpfs | None = None
        if self.scenario.disk is not None:
            self.tmpfs = Tmpfs(self.data_dir(self.scenario.disk.node), self.scenario.disk.size_mib)
            self.tmpfs.mount()
        if self.scenario.proxy:
            for n, port in listen_ports.items():
                self.proxies[n] = Proxy(("127.0.0.1", port)).start()

    def cleanup_faults(self: Any) -> None:
        for px in self.proxies.values():
            px.stop()
        if self.tmpfs is not None:
            self.tmpfs.unmount()
        etcd = getattr(self, "etcd", None)
        if etcd is not None:
            etcd.stop()

    def fault_event(self: Any, action: str, node: str) -> bool:
        """Handle a fault event; False when ``action`` is not one."""
        if action == "cut":
            self.isolate(node)
        elif action == "heal":
            for px in self.proxies.values():
                px.unblock()
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

    # -- network ------------------------------------------------------------------------
    def isolate(self: Any, node: str) -> None:
        pids = {n: p.popen.pid for n, p in self.procs.items() if p.alive() and p.popen}
        others = {pid for n, pid in pids.items() if n != node}
        if node in self.proxies:
            self.proxies[node].block(others)
        for n, px in self.proxies.items():
            if n != node and node in pids:
                px.block({pids[node]})
        self.timeline.mark(node, "cut", "from its peers (the control plane still reaches it)")

    # -- disk ---------------------------------------------------------------------------
    def await_transfer(self: Any, node: str) -> None:
        """Until a transfer to ``node`` has written its first bytes (past its free-disk
        check): a ``part-<p>.bin.ferry-tmp`` with data in the node's data dir. Watched on
        the disk, not in the move's status: a move is in its transfer stage before the
        check, and the transfer reports progress per 4 MiB chunk."""
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
                    try:
                        blocks = os.stat(os.path.join(folder, name)).st_blocks
                    except OSError:
                        continue
                    if blocks:
                        self.caught = name[:-len(TEMP_SUFFIX)]
                        self.timeline.mark(node, "transfer running", f"{name} has data")
                        return
            time.sleep(0.005)
        problems.append(f"{node}: no transfer wrote data within {REFUSAL_TIMEOUT_S:.0f}s")

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
        return self.checks


def _unclean(data: str, cache: str, only: str | None = None) -> list[str]:
    """While every fetch is refused: no partition of the node OWNING, no file installed.
    ``only`` (``part-<p>.bin``, a disk filled mid-transfer): the other moves may have
    finished their transfers before the disk filled and failed later (index rebuild,
    replay; they restart), so only the partition whose transfer ran out of space is held
    to "not installed"."""
    try:
        with open(os.path.join(data, "states.json")) as f:
            states = json.load(f)["caches"].get(cache, {})
    except (OSError, ValueError, KeyError):
        return []
    out = [f"partition {p} became {st} on a disk with no room for it" for p, st in states.items()
           if st == "OWNING"]
    for p, st in states.items():
        if only is not None and f"part-{p}.bin" != only:
            continue
        path = os.path.join(data, "caches", cache, f"part-{p}.bin")
        if st == "MOVING" and os.path.exists(path) and os.path.getsize(path) > 0:
            out.append(f"partition {p} is MOVING but {path} was installed "
                       f"({os.path.getsize(path)} bytes)")
    return out
