"""A real node SIGKILLed and started again: it serves without first rebuilding every
index it holds, and never answers a lookup from an index it has not rebuilt since.

The index is made wrong behind the node's back while it is down (one document's entry
deleted, its ready marker kept: what an index commit lost in a crash looks like), so
an answer from the untrusted index would miss that key."""
from __future__ import annotations

import json
import os

from indexes import IndexStore
from node import Client, partition_of

from nodeharness import NodeProc, wait_settled, write_secret

CONFIG = """
[control_plane]
lease_ttl_s = 2
[[caches]]
name = "default"
partitions = 4
backups = 0
[[caches.indexes]]
name = "by_city"
field = "city"
"""


def _doc(i: int) -> bytes:
    return json.dumps({"i": i, "city": "oslo" if i % 2 else "lima"}).encode()


def test_killed_node_serves_first_and_never_reads_an_untrusted_index(tmp_path, nodes) -> None:
    secret = write_secret(str(tmp_path / "secret"))
    cfg = tmp_path / "node.toml"
    cfg.write_text(CONFIG)
    n1 = NodeProc(str(tmp_path), "n1", secret, config=str(cfg)).start()
    nodes.append(n1)
    wait_settled(n1.address, secret, 1, 0)
    keys = {b"key-%03d" % i: _doc(i) for i in range(200)}
    with Client([n1.address], secret_file=secret) as c:
        for k, v in keys.items():
            c.put("default", k, v)
        assert sorted(c.lookup("default", "by_city", "oslo")) == sorted(
            k for k, v in keys.items() if json.loads(v)["city"] == "oslo")
    n1.kill()

    victim = b"key-007"                                  # an "oslo" document
    p = partition_of(victim, 4)
    ix = IndexStore.open(os.path.join(n1.data, "indexes", "default"))
    try:
        assert ix.ready(p)
        ix.apply(p, victim, keys[victim], None)          # its entry gone, marker kept
        assert victim not in ix.lookup("by_city", "oslo", [p])
    finally:
        ix.close()

    n1.mark_restart()
    n1.start()
    wait_settled(n1.address, secret, 1, 0)
    with Client([n1.address], secret_file=secret) as c:
        got = sorted(c.lookup("default", "by_city", "oslo"))
    assert victim in got
    assert got == sorted(k for k, v in keys.items() if json.loads(v)["city"] == "oslo")
    log = open(n1.log, errors="replace").read().split("=== restart")[-1]
    before, _, after = log.partition("serving on")
    assert "index rebuilt" not in before, before[-3000:]          # served first
    assert after.count("not trusted after an unclean stop") >= 1, after[-3000:]
    assert n1.stop() == 0
