"""A forged map in etcd does not make a node delete its data: fake members with
reports that say OWNING and partition records that name them in sync and primary
would make the real nodes evict their copies; a node evicts only after each new
owner confirms over authenticated RPC (``holds``) that it is the node the map names
and holds the partition OWNING at a counter at least its own."""
from __future__ import annotations

import os
import time

import pytest

from node import Client
from node.control import Etcd

from nodeharness import NodeProc, control_plane, free_port, wait_settled, write_secret

PARTS = 8
CONFIG = f"""
[control_plane]
lease_ttl_s = 2
[checkpoint]
interval_s = 1.0
[[caches]]
name = "default"
partitions = {PARTS}
backups = 1
"""
P = "/ferry/default"


def _files(n: NodeProc) -> list[str]:
    d = os.path.join(n.data, "caches", "default")
    return sorted(f for f in os.listdir(d) if f.startswith("part-") and f.endswith(".bin"))


@pytest.mark.slow
def test_a_forged_map_naming_fake_owners_deletes_nothing(tmp_path, nodes):
    secret = write_secret(str(tmp_path / "secret"))
    cfg = tmp_path / "node.toml"
    cfg.write_text(CONFIG)
    n1 = NodeProc(str(tmp_path), "n1", secret, config=str(cfg)).start()
    n2 = NodeProc(str(tmp_path), "n2", secret, config=str(cfg)).start()
    nodes += [n1, n2]
    wait_settled(n1.address, secret, 2, 1)
    keys = [f"k{i}" for i in range(64)]
    with Client([n1.address, n2.address], secret_file=secret, timeout=30) as c:
        for k in keys:
            c.put("default", k, "v-" + k)
    before = {n.id: _files(n) for n in (n1, n2)}
    assert all(len(f) == PARTS for f in before.values()), before

    # the forgery: two members that are no nodes (one at n1's own address, one at a
    # port nobody listens on), reports that they hold every partition OWNING, records
    # that make them the primary and in sync
    e = Etcd(control_plane())
    lease, _ = e.grant(60)
    ghosts = {"ghost1": n1.address, "ghost2": f"127.0.0.1:{free_port()}"}
    for g, addr in ghosts.items():
        e.put(f"{P}/members/{g}", {"address": addr, "transfer": addr, "boot": "forged"}, lease)
        e.put(f"{P}/reports/{g}", {"caches": {"default": {str(p): ["OWNING", 10**6] for p in range(PARTS)}}},
              lease)
    for _ in range(20):                     # rewritten while the controller rewrites them back
        for p in range(PARTS):
            e.put(f"{P}/parts/default/{p}", {"primary": "ghost1", "isr": ["ghost1", "ghost2", "n1", "n2"],
                                             "epoch": 10**6 + p, "lost": False, "term": 10**6})
        time.sleep(0.25)
    time.sleep(3.0)                          # several reconcile passes and confirmation rounds
    after = {n.id: _files(n) for n in (n1, n2)}
    assert after == before, (before, after)
    refused = [ln for n in (n1, n2) for ln in open(n.log, errors="replace")
               if "stage=evict" in ln and "kept: the map names" in ln]
    assert refused, "no eviction was even considered: the forgery did not reach the reconcile loop"
    assert not any("evicted: no longer an owner" in ln for n in (n1, n2)
                   for ln in open(n.log, errors="replace")), "a copy was evicted"

    # the forgery ends (its lease revoked): the cluster settles and every key reads back
    e.revoke(lease)
    wait_settled(n1.address, secret, 2, 1, timeout=60)
    with Client([n1.address, n2.address], secret_file=secret, timeout=30) as c:
        for k in keys:
            assert c.get("default", k) == b"v-" + k.encode()
