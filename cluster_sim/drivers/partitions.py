"""Network partitions of the cluster driver: one node cut off from its peers, from the
control plane (etcd), or both, healed, or flapping.

Two sets of loopback proxies (:class:`cluster_sim.netproxy.Proxy`):

- **peer proxies** (``proxy = true``): one in front of each node's RPC port; the node
  advertises it (``--advertise``), so every peer -- replication, register, DEMAND,
  hand-off -- reaches it only through it. ``cut NODE`` blocks, on NODE's proxy, the
  connections of the other node processes, and on every other proxy those of NODE
  (``Proxy.block(pids)``, both directions); the harness's own connections (clients,
  ``cluster status``) go to the listen ports and are never cut.
- **control proxies** (a scenario with ``cut-control``, ``isolate`` or ``flap``, and
  always in multi-host mode, listening on the node's gateway): one per node and etcd
  member, in front of that member's client port; the node is started with
  ``--control-plane`` naming its own proxies only. ``cut-control NODE`` cuts every
  connection on NODE's control proxies -- the established ones too, so the node's HTTP
  keep-alive connections and its streaming watch break at once -- and refuses new ones
  until the heal.

``isolate`` is both; ``heal`` ends every cut (peer blocks and control cuts); ``flap``
isolates and heals every ``period_s`` for ``duration_s`` in a thread, ending healed.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from ..netproxy import Proxy
from ..timeline import Timeline


class Partitions:
    def __init__(self, timeline: Timeline, pids: Callable[[], dict[str, int]]) -> None:
        self.timeline = timeline
        self.pids = pids                        # live node processes: node -> pid
        self.peer: dict[str, Proxy] = {}        # node -> proxy in front of its RPC port
        self.control: dict[str, list[Proxy]] = {}   # node -> one proxy per etcd member
        self.cut_since: dict[str, float] = {}   # node -> when its control plane was cut
        self._flaps: list[threading.Thread] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.on_healed: Callable[[str], None] = lambda why: None
        self.scheme = "http"                    # "https" when etcd serves TLS

    # -- setup -----------------------------------------------------------------------
    def add_peer_proxies(self, listen_ports: dict[str, int]) -> None:
        for n, port in listen_ports.items():
            self.peer[n] = Proxy(("127.0.0.1", port)).start()

    def add_control_proxies(self, nodes: list[str], etcd_ports: list[int],
                            listen: Callable[[str], str] = lambda n: "127.0.0.1") -> None:
        """``listen(node)``: where the node's proxies listen (its namespace's gateway in
        multi-host mode, where the host's loopback is out of the node's reach)."""
        for n in nodes:
            self.control[n] = [Proxy(("127.0.0.1", port), host=listen(n)).start() for port in etcd_ports]

    def control_endpoints(self, node: str) -> list[str] | None:
        """The URLs ``node`` reaches etcd through, or None when it goes straight."""
        pxs = self.control.get(node)
        return [f"{self.scheme}://{px.address}" for px in pxs] if pxs else None

    def stop(self) -> None:
        self._stop.set()
        for px in [*self.peer.values(), *(p for lst in self.control.values() for p in lst)]:
            px.stop()

    # -- faults ----------------------------------------------------------------------
    def cut_peers(self, node: str, mark: bool = True) -> None:
        pids = self.pids()
        others = {pid for n, pid in pids.items() if n != node}
        if node in self.peer:
            self.peer[node].block(others)
        for n, px in self.peer.items():
            if n != node and node in pids:
                px.block({pids[node]})
        if mark:
            self.timeline.mark(node, "cut", "from its peers (etcd still reaches it)")

    def cut_control(self, node: str, mark: bool = True) -> None:
        for px in self.control.get(node, []):
            px.cut()
        with self._lock:
            self.cut_since.setdefault(node, time.monotonic())
        if mark:
            self.timeline.mark(node, "cut-control", "from etcd (its peers still reach it)")

    def isolate(self, node: str, mark: bool = True) -> None:
        self.cut_peers(node, mark=False)
        self.cut_control(node, mark=False)
        if mark:
            self.timeline.mark(node, "isolate", "from its peers and from etcd")

    def heal(self, mark: bool = True) -> None:
        for px in self.peer.values():
            px.unblock()
        for lst in self.control.values():
            for px in lst:
                px.heal()
        with self._lock:
            self.cut_since.clear()
        if mark:
            self.timeline.mark("-", "healed", "every peer link and control-plane link")

    def flap(self, node: str, duration_s: float, period_s: float) -> None:
        """Isolate and heal ``node`` every ``period_s`` for ``duration_s``, in a thread;
        ends healed (then ``on_healed`` runs, as after a heal event)."""
        t = threading.Thread(target=self._flap, args=(node, duration_s, period_s),
                             name=f"flap-{node}", daemon=True)
        self._flaps.append(t)
        t.start()

    def _flap(self, node: str, duration_s: float, period_s: float) -> None:
        # a fixed number of flips on a fixed schedule (flip i at i x period_s): on a
        # slow machine, where a cut or a heal takes a while, the flips come closer
        # together, never fewer of them
        flips = max(1, round(duration_s / period_s))
        t0 = time.monotonic()
        cuts = 0
        for i in range(flips):
            if self._stop.is_set():
                break
            if i % 2:
                self.heal(mark=False)
            else:
                self.isolate(node, mark=False)
                cuts += 1
            self._stop.wait(max(0.0, t0 + (i + 1) * period_s - time.monotonic()))
        self.heal(mark=False)
        self.timeline.mark(node, "flap end", f"isolated {cuts} times in {duration_s:.0f}s")
        if not self._stop.is_set():
            self.on_healed(f"flap {node}")

    def flapping(self) -> bool:
        return any(t.is_alive() for t in self._flaps)
