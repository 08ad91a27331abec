"""Index queries at the node's storage seam (node.storage.CacheData): bounds no index
holds are the client's error (reply code ``bad_request``, no traceback in the log);
``range`` reads only the partitions asked for and stops at its limit."""
from __future__ import annotations

import json
import logging

import pytest

from node.config import CacheConfig, IndexConfig, NodeConfig
from node.errors import BadRequest
from node.rpc import RpcServer
from node.storage import CacheData

from nodeharness import free_port


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    cache = CacheConfig("c", 4, 0, (IndexConfig("by_n", "n"),))
    root = str(tmp_path_factory.mktemp("node"))
    d = CacheData(NodeConfig(id="n1", data=root, caches=(cache,), wal_sync="none"), cache)
    for p in range(4):
        d.create(p)
        for i in range(50):
            d.put(p, b"k%d-%02d" % (p, i), json.dumps({"n": i}).encode())
    yield d
    d.close()


@pytest.mark.parametrize("call", [
    lambda d: d.range("by_n", {"a": 1}, None, None),
    lambda d: d.range("by_n", None, [1, 2], None),
    lambda d: d.range("by_n", float("nan"), None, None),
    lambda d: d.range("by_n", None, None, -1),
    lambda d: d.range("by_n", None, None, "3"),
    lambda d: d.lookup("by_n", {"a": 1}),
    lambda d: d.lookup("by_n", [1]),
])
def test_bad_bounds_are_bad_requests(data, call, caplog) -> None:
    with pytest.raises(BadRequest):
        call(data)
    srv = RpcServer(f"127.0.0.1:{free_port()}", b"s" * 32, lambda m, a, r: call(data))
    try:
        reply = srv._handle({"id": 1, "m": "range", "a": {}}, "client")
    finally:
        srv.stop()
    assert reply["e"]["code"] == "bad_request"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_range_reads_only_the_partitions_asked_for(data) -> None:
    assert data.range("by_n", 10, 11, None, partitions=[2, 3]) == [(10, b"k2-10"), (10, b"k3-10")]
    assert data.range("by_n", None, None, 1, partitions=[3]) == [(0, b"k3-00")]
    assert data.lookup("by_n", 7, partitions=[1]) == [b"k1-07"]
    assert len(data.range("by_n", None, None, None)) == 200
