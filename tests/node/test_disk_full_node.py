"""A node whose data directory fills up (a real tmpfs, a real node process): writes are
refused while the disk is full, the log says so in one WARNING and no traceback, and
once space is freed the node takes writes again by itself, with nothing acknowledged
lost. (Before, the checkpointer's failure stayed until a restart: 0 of 154 writes after
freeing 12 MiB, and a traceback per refused request.)"""
from __future__ import annotations

import os
import subprocess
import time

import pytest

pytestmark = pytest.mark.timeout(180)


def test_full_disk_then_freed(tmp_path) -> None:
    from cluster_sim.diskfull import permitted
    from ferry.localcluster import LocalCluster
    ok, why = permitted()
    if not ok:
        pytest.skip(why)
    root = str(tmp_path / "cluster")
    data = os.path.join(root, "n1")
    os.makedirs(data)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", data], check=True)
    fill = os.path.join(data, "filler")
    open(fill, "wb").close()      # made while there is room: filling it later needs no new file
    try:
        with LocalCluster(root, partitions=4, backups=0, checkpoint_interval=0.5) as c:
            c.start(1)
            cl = c.client(timeout=5)
            acked = {}
            for i in range(100):
                cl.put("default", f"a{i}", b"v" * 1000)
                acked[f"a{i}"] = b"v" * 1000
            # unbuffered: a buffered file would try the refused bytes again at close
            with open(fill, "r+b", buffering=0) as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                except OSError:
                    pass
            refused, i = 0, 0
            until = time.monotonic() + 2.5        # past a periodic checkpoint (0.5 s)
            while time.monotonic() < until:
                i += 1
                time.sleep(0.005)
                try:
                    cl.put("default", f"b{i}", b"w" * 1000)
                    acked[f"b{i}"] = b"w" * 1000
                except Exception as e:      # noqa: BLE001 - the refusal, whatever its class
                    refused += 1
                    assert "disk full on" in str(e) or "out of disk space" in str(e), e
            assert refused > 100
            os.truncate(fill, max(0, os.path.getsize(fill) - (12 << 20)))
            deadline = time.monotonic() + 20
            while True:
                try:
                    cl.put("default", "after", b"x")
                    break
                except Exception:           # noqa: BLE001
                    assert time.monotonic() < deadline, "not serving 20 s after space was freed"
                    time.sleep(0.1)
            for i in range(154):
                cl.put("default", f"c{i}", b"y" * 1000)
                acked[f"c{i}"] = b"y" * 1000
            for k, v in acked.items():
                assert cl.get("default", k) == v
            from node.wire import Channel, load_secret
            ch = Channel(c.seeds[0], load_secret(c.secret_file), role="client")
            metrics = ch.call("metrics")
        with open(os.path.join(root, "n1.log"), errors="replace") as f:
            log = f.read()
        assert "Traceback" not in log
        warnings = [ln for ln in log.splitlines() if " WARNING " in ln and "ferry.storage" in ln]
        assert len(warnings) == 1 and "disk full on" in warnings[0], warnings
        assert "recovered after" in log
        line = next(ln for ln in metrics.splitlines()
                    if ln.startswith('ferry_node_storage_refusals_total{cause="disk_full"}'))
        assert float(line.split()[-1]) >= refused
    finally:
        subprocess.run(["umount", "-l", data], check=False)
