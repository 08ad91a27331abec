"""The control plane at scale, small: bench/control_plane_scale.py at 100 nodes x 10,000
partitions (2 caches, backups 1), +10% nodes. The real controller (its own process)
and the real node-side map code run against a real etcd with simulated members; the
figures docs/benchmarks.md quotes come out of this script, so its outcome is checked
here: every partition gets a record, after the +10% every record names the ideal
owners (primary first), the copies moved are the rendezvous minimum, and no etcd
request comes near etcd's request limit."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.slow          # about 25 s on 2 cores


def test_hundred_nodes_ten_thousand_partitions(tmp_path):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "control_plane_scale.py"),
                          "--nodes", "100", "--partitions", "10000", "--json", "--quiet",
                          "--timeout", "600", "--workdir", str(tmp_path)],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["config"]["added_nodes"] == 10

    # every partition gets a record from the creator's reports, in the controller's first rounds
    create = doc["create"]
    assert create["records"] == 10_000
    assert create["controller_node"]["log_lines"]
    assert create["controller_node"]["controller_thread_cpu_s"] > 0
    assert doc["setup"]["check"] == {"partitions": 10_000, "no_record": 0, "bad": 0, "examples": []}

    add = doc["add"]
    # after the +10%: every record's in-sync set is its ideal owners, primary = ideal[0],
    # and only those owners report the partition (OWNING)
    assert add["check"]["bad"] == 0, add["check"]["examples"]
    assert add["check"]["no_record"] == 0
    # copies moved: the rendezvous minimum ((partition, new node) pairs), within 10%
    assert add["rendezvous_minimum"] > 0
    assert abs(add["copies_moved"] - add["rendezvous_minimum"]) <= 0.1 * add["rendezvous_minimum"]
    assert add["copies_gained_in_records"] == add["copies_moved"]
    # about (backups + 1) x partitions x 10/110 copies: a join moves only its share
    assert abs(add["copies_moved"] - add["expected_fraction_copies"]) <= 0.1 * add["expected_fraction_copies"]
    sim = add["sim"]
    assert sim["moves"] == sim["evictions"] == add["copies_moved"]
    assert sim["admission_requests"] >= add["copies_moved"]
    assert sim["refused"] == 0

    # no etcd request of any actor in any phase over 1 MiB (etcd refuses over 1.5 MiB)
    for phase in ("registration", "create", "setup", "add"):
        reqs = doc[phase]["etcd_requests"]
        assert reqs["max_bytes"] < 1 << 20, (phase, reqs)
    assert add["etcd_requests"]["count"] > add["copies_moved"]
    # requests travel in batches: at most 2 etcd requests per moved copy (loose: 2.5, for
    # the retries of a loaded machine; the bench reports the figure), the
    # requests of a step in fewer transactions than requests, and the controller reads
    # (almost) nothing: a batch redone request by request (a request withdrawn under load)
    # reads each record once
    assert add["per_moved_copy"]["etcd_requests"] <= 2.5, add["etcd_requests"]
    assert sim["request_txns"] < sim["admission_requests"] + sim["handoff_requests"]
    ranges = add["controller_node"]["requests"].get("/kv/range", {}).get("count", 0)
    assert ranges <= 0.05 * add["copies_moved"], add["controller_node"]["requests"]

    # the watch figures are counted, and the per-interest fan-out is far below the whole prefix's
    w = add["watch"]
    assert w["events"] >= 5 * add["copies_moved"]
    assert w["deliveries_whole_prefix"] >= w["events"] * 100
    assert 0 < w["deliveries_by_interest"] < w["deliveries_whole_prefix"]
    assert w["mapbuilder_us_per_event"] > 0 and w["observer_reloads"] == 1
