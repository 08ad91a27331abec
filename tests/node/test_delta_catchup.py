"""A node that comes back after a SIGKILL catches up by delta fetches: its stale copies
receive only the pages that changed while it was down (real node processes, a writer
all along, the offline check of every copy at the end)."""
from __future__ import annotations

import pytest

from node.client import Client
from node.wire import Pool, load_secret

from nodeharness import NodeProc, wait_settled
from test_cluster import Writer, writes_during
from test_filemove import FILES, finish_and_check, start_pair


@pytest.mark.slow
def test_a_returning_node_fetches_only_the_changed_pages(tmp_path, nodes):
    secret, cfg, n1, n2 = start_pair(tmp_path, nodes, FILES.replace(
        "[control_plane]", "[checkpoint]\ninterval_s = 0.5\n[control_plane]", 1))
    n3 = NodeProc(str(tmp_path), "n3", secret, config=cfg).start()
    nodes.append(n3)
    wait_settled(n1.address, secret, 3, 1)
    with Client([n1.address], secret_file=secret, timeout=60) as c:      # files of ~80 pages
        c.put_many("default", ((b"pre-%05d" % i, b"v" * 900) for i in range(2400)))
    w = Writer([n1.address], secret)
    w.start()
    try:
        writes_during(w, 30)
        n3.kill()                              # SIGKILL: its copies fall behind
        writes_during(w, 40)
        n3.mark_restart()
        n3.start()
        wait_settled(n1.address, secret, 3, 1)
        writes_during(w, 10)
    finally:
        w.finish()
    done = Pool(load_secret(secret), role="client").call(n3.address, "moves_done")
    deltas = [d for d in done if d.get("copy", {}).get("mode") == "delta"]
    assert deltas, [d.get("copy") for d in done]
    for d in deltas:
        copy = d["copy"]
        assert 1 <= copy["pages_sent"] <= copy["pages"] // 2, copy
        assert d["wire_bytes"] < d["bytes"] // 2, d
    log = open(n3.log).read().split("=== restart")[-1]
    assert " delta: " in log and "of" in log
    # every acknowledged write on every owner, indexes agree, B+1 OWNING copies
    finish_and_check(w, nodes, secret)
