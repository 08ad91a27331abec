"""Bulk load (``Client.put_many`` -> ``put_batch``): one request per partition batch,
replicated in one request per copy, index changes in one commit; bad batches refused."""
from __future__ import annotations

import json

import pytest

from node import Client
from node.errors import BadRequest, TooLarge

from nodeharness import offline_check
from test_filemove import start_pair


def test_put_many_loads_replicates_and_indexes(tmp_path, nodes):
    secret, cfg, n1, n2 = start_pair(tmp_path, nodes)
    items = {f"bulk-{i}".encode(): json.dumps({"i": i, "city": ["oslo", "lima"][i % 2]}).encode()
             for i in range(1500)}
    with Client([n1.address], secret_file=secret) as c:
        assert c.put_many("default", items.items(), batch=100) == 1500
        c.put("default", "single", json.dumps({"city": "pune"}))      # the normal path after it
        for k in list(items)[::97]:
            assert c.get("default", k) == items[k]
        assert len(c.lookup("default", "by_city", "lima")) == 750
        parts = c.map.caches["default"].partitions
        from node import partition_of
        k0 = next(k for k in items if partition_of(k, parts) == 0)
        k1 = next(k for k in items if partition_of(k, parts) == 1)
        with pytest.raises(BadRequest, match="one partition per batch"):
            c._call_primary("default", k0, "put_batch", items=[[k0, b"x"], [k1, b"y"]])
        with pytest.raises(BadRequest, match="pair"):
            c._call_primary("default", k0, "put_batch", items=[[k0]])
        with pytest.raises(BadRequest, match="items must be a list"):
            c._call_primary("default", k0, "put_batch", items=[])
        with pytest.raises(TooLarge):
            c._call_primary("default", k0, "put_batch", items=[[k0, b"x" * (600 * 1024)]])
        assert c.get("default", k0) == items[k0]                    # refused batches changed nothing
    for n in nodes:
        assert n.stop() == 0
    data = offline_check([n1.data, n2.data])                     # both copies equal, indexes verify
    assert sum(len(d) for d in data.values()) == 1501
