"""Foreground protection with real node processes: a 4th node joins while a writer
writes, with a latency target no write can meet (``rebalance.latency_target_ms``
set live through the cluster settings); the joining node's move limit starts at half
the maximum and halves (at most every half second), ``cluster status`` and the metrics show it, and the rebalance still completes
with every acknowledged write present."""
from __future__ import annotations

import threading
import time

from node.control import Etcd
from ferry.localcluster import LocalCluster, key_of, value_of
from node.settings import put
from node.wire import Pool, load_secret


def test_the_limit_drops_when_writes_are_slow_and_the_rebalance_completes(tmp_path):
    with LocalCluster(str(tmp_path / "c"), partitions=16, backups=1) as c:
        c.start(3)
        c.load(6000, value_size=1024)
        etcd = Etcd(c.control_plane)
        put(etcd, "/ferry/default", "rebalance.latency_target_ms", "0.01")   # every write is slow
        put(etcd, "/ferry/default", "transfer.rate_limit", "3000000")      # a join of a few seconds
        time.sleep(1.0)
        stop = threading.Event()
        acked: dict[bytes, bytes] = {}

        def writer() -> None:
            i = 10_000_000
            with c.client() as cl:
                while not stop.is_set():
                    k, v = key_of(i), value_of(i, 1024)
                    cl.put("default", k, v)
                    acked[k] = v
                    i += 1
        t = threading.Thread(target=writer, daemon=True)
        t.start()
        time.sleep(1.5)                    # the writer's latency is in every node's window
        n4 = c.add_node(wait=False)
        pool = Pool(load_secret(c.secret_file), role="client")
        seen: list[dict] = []
        running_max = 0
        try:
            deadline = time.monotonic() + 120
            doc = None
            while time.monotonic() < deadline:
                a = pool.call(n4.address, "admission", timeout=5.0)
                moves = pool.call(n4.address, "moves", timeout=5.0)
                running_max = max(running_max, len(moves))
                if moves:
                    seen.append(a)
                if seen and not moves and len(seen) > 3:
                    doc = c.wait_all_owning(timeout=120)
                    break
                time.sleep(0.05)
            assert doc is not None, "the rebalance did not complete"
            metrics = pool.call(n4.address, "metrics", timeout=5.0)
        finally:
            stop.set()
            t.join(timeout=60)
            pool.close()
        limits = [a["move_limit"] for a in seen]
        assert limits[0] <= 4 and min(limits) <= 2, limits       # halved at least once
        slow = [a for a in seen if a["latency_ms"] is not None]
        assert slow and all(a["latency_ms"] > a["target_ms"] == 0.01 for a in slow)
        # a rebalance under writes starts at half the maximum (8), then halves
        assert running_max <= 4, running_max
        assert "ferry_node_rebalance_move_limit" in metrics
        assert "ferry_node_rebalance_latency_seconds" in metrics
        assert any(a["node"] == "n4" for a in doc["admission"])
        with c.client() as cl:
            for k, v in list(acked.items()):
                assert cl.get("default", k) == v
