"""Live validation of a RUNNING cluster (real node processes, real local Spark):
every in-sync copy fetched through the transfer agents at one fenced counter.

One cluster for the module: 3 nodes, 6 partitions, 1 backup, a steady writer.
"""
from __future__ import annotations

import json
import os
import threading
import time

import pytest

from validation import ValidationError, validate
from validation.live import ClusterUnreachable, LiveSettings, UnknownCache, WrongSecret

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PARTS = 6


class Writer(threading.Thread):
    """Puts keys w-<i> as fast as one client can; ``model`` holds what was acknowledged."""

    def __init__(self, cluster) -> None:  # noqa: ANN001 - ferry.localcluster.LocalCluster
        super().__init__(daemon=True)
        self.cluster, self.stop_ev = cluster, threading.Event()
        self.model: dict[str, str] = {}
        self.writes = 0                 # acknowledged puts
        self.errors: list[str] = []

    def run(self) -> None:
        with self.cluster.client(timeout=30) as c:
            i = 0
            while not self.stop_ev.is_set():
                k, v = f"w-{i % 500}", f"value-{i}"
                try:
                    c.put("default", k, v)
                    self.model[k] = v
                    self.writes += 1
                except Exception as e:  # noqa: BLE001 - a write refused is counted, not fatal
                    self.errors.append(str(e))
                i += 1

    def stop(self) -> None:
        self.stop_ev.set()
        self.join(30)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from ferry.localcluster import LocalCluster
    root = tmp_path_factory.mktemp("live")
    os.environ["FERRY_DEBUG_RPC"] = "1"          # the nodes get the debug_set knob
    try:
        c = LocalCluster(str(root), partitions=PARTS, backups=1, checkpoint_interval=1.0,
                         wal_sync="none")
        with c:
            c.start(3)
            c.load(600, threads=2)
            yield c
    finally:
        os.environ.pop("FERRY_DEBUG_RPC", None)


def live(cluster, **kw) -> LiveSettings:  # noqa: ANN001
    return LiveSettings(seeds=cluster.seeds[:1], secret_file=cluster.secret_file, **kw)


def test_live_validation_under_writes_never_false_alarms(spark, cluster) -> None:
    w = Writer(cluster)
    w.start()
    try:
        time.sleep(1.0)
        for _ in range(3):
            res = validate([], spark=spark, live=live(cluster, parallel=2))
            assert res["passed"], json.dumps(res)[:3000]
            assert res["mode"] == "live" and res["partitions_checked"] == PARTS
            parts = res["live"]["partitions"]
            assert len(parts) == PARTS
            for p in parts:
                assert p["counter"] is not None and len(p["copies"]) == 2
                assert {c["snapshot"] for c in p["copies"].values()} == {p["counter"]}
    finally:
        w.stop()
    assert len(w.model) > 50, "the writer did not write"


def test_live_findings_divergent_key_corrupt_page_expected_mismatch(spark, cluster, tmp_path) -> None:
    from node import Client, partition_of
    from node.wire import Pool, load_secret
    doc = cluster.status()
    by_part = {p["partition"]: p for p in doc["partitions"]}
    addr = {n["id"]: n["address"] for n in doc["nodes"]}
    with cluster.client() as c:
        data = {f"key-{i:09d}": c.get("default", f"key-{i:09d}") for i in range(0, 600, 7)}
    # 1. a backup's copy of one key changed behind its node's back (its own store)
    key = b"key-000000007"
    p_tamper = partition_of(key, PARTS)
    backup = [n for n in by_part[p_tamper]["owners"] if n != by_part[p_tamper]["primary"]][0]
    pool = Pool(load_secret(cluster.secret_file), role="node")
    try:
        pool.call(addr[backup], "debug_set", cache="default", p=p_tamper, key=key, value=b"TAMPERED")
    finally:
        pool.close()
    # 2. a corrupted data page in one owner's file of another partition
    p_bad = (p_tamper + 1) % PARTS
    victim = by_part[p_bad]["owners"][-1]
    path = os.path.join(cluster.root, victim, "caches", "default", f"part-{p_bad}.bin")
    with open(path, "r+b") as f:
        f.seek(4096 + 2000)
        b = f.read(1)
        f.seek(4096 + 2000)
        f.write(bytes([b[0] ^ 0xFF]))
    # 3. an expected-data mismatch (rows of key, value: no partition column)
    exp = tmp_path / "expected.jsonl"
    rows = dict(data, **{"key-000000014": "not what was written"})
    exp.write_text("".join(json.dumps({"key": k, "value": v.decode() if isinstance(v, bytes) else v})
                           + "\n" for k, v in rows.items()))
    res = validate([], spark=spark, live=live(cluster), expected=str(exp))
    assert not res["passed"]
    (d,) = [d for d in res["divergent"] if d["partition"] == p_tamper]
    assert [k["key"] for k in d["keys"]] == ["key-000000007"]
    assert d["keys"][0]["kind"] == "value"
    bad = [p for p in res["corrupt_pages"] if p["partition"] == p_bad]
    assert bad and bad[0]["node"] == victim and bad[0]["page"] == 1, res["corrupt_pages"]
    wrong = [x for x in res["expected"]["examples"] if x["kind"] == "wrong"]
    assert {x["key"] for x in wrong} >= {"key-000000014"}
    assert res["live"]["counter_mismatch"] and res["live"]["counter_mismatch"][0]["node"] == backup
    assert Client  # imported for the partition function's home


def test_bad_input_is_a_clear_error(spark, cluster, tmp_path) -> None:
    with pytest.raises(ClusterUnreachable, match="no node of the cluster answers"):
        validate([], spark=spark, live=LiveSettings(seeds=["127.0.0.1:1"],
                                                    secret_file=cluster.secret_file))
    wrong = tmp_path / "secret"
    wrong.write_text("b7e2049f1c6a8d35e0f47c2b9a1d6e83")
    os.chmod(wrong, 0o600)
    with pytest.raises(WrongSecret, match="not this cluster's secret"):
        validate([], spark=spark, live=LiveSettings(seeds=cluster.seeds[:1], secret_file=str(wrong)))
    with pytest.raises(UnknownCache, match="no cache 'nope'"):
        validate([], spark=spark, live=live(cluster, caches=["nope"]))
    with pytest.raises(ValidationError, match="secret"):
        validate([], spark=spark, live=LiveSettings(seeds=cluster.seeds[:1]))
