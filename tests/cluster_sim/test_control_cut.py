"""The control-plane cut of one node (``cut-control``): its proxies in front of a real
etcd cut the established connections too -- a pooled keep-alive connection and a
streaming watch break at once -- refuse new ones, and work again after the heal."""
from __future__ import annotations

import threading
import time

import pytest

from cluster_sim.drivers.partitions import Partitions
from cluster_sim.timeline import Timeline


def test_cut_control_breaks_keepalive_and_watch_then_heals(tmp_path) -> None:
    from node.control import Etcd
    from node.errors import ControlPlaneDown
    from node.etcdserver import EtcdCluster
    with EtcdCluster(str(tmp_path / "etcd")) as etcd:
        tl = Timeline()
        parts = Partitions(tl, lambda: {})
        parts.add_control_proxies(["n1", "n2"], [m.client_port for m in etcd.members])
        try:
            urls = parts.control_endpoints("n1")
            assert urls and all(u.startswith("http://127.0.0.1:") for u in urls)
            assert urls != etcd.endpoints and parts.control_endpoints("n9") is None
            c = Etcd(urls)
            other = Etcd(parts.control_endpoints("n2"))
            rev = c.put("/t/a", 1)                       # opens a keep-alive connection
            stop, ended, seen = threading.Event(), threading.Event(), []

            def watch() -> None:
                for _, evs in c.watch("/t/", rev + 1, stop, idle=30.0):
                    seen.extend(evs)
                ended.set()
            threading.Thread(target=watch, daemon=True).start()
            other.put("/t/b", 2)
            deadline = time.monotonic() + 5
            while not seen and time.monotonic() < deadline:
                time.sleep(0.05)
            assert seen, "the watch through the proxy saw nothing"
            t0 = time.monotonic()
            parts.cut_control("n1")
            # the stream ends at once, not after its 30 s idle timeout
            assert ended.wait(3.0) and time.monotonic() - t0 < 3.0
            with pytest.raises(ControlPlaneDown):
                c.get("/t/a")                             # the pooled connection is gone too
            assert other.get("/t/a").value == 1           # n2's proxies are untouched
            assert "n1" in parts.cut_since and [m.kind for m in tl.marks] == ["cut-control"]
            parts.heal()
            assert c.get("/t/a").value == 1 and not parts.cut_since
            stop.set()
        finally:
            parts.stop()
