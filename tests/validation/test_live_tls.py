"""Live validation of a RUNNING cluster that runs mutual TLS (``LocalCluster(tls=True)``:
real node processes with certificates and no secret, real local Spark). The validator
holds a certificate ``ferry://validator/spark``: it reads the map, fences partitions
and fetches every in-sync copy over TLS, and may do nothing else. A certificate of
another CA is refused before anything is asked or fetched.

One cluster for the module: 2 nodes, 4 partitions, 1 backup (every node holds every
partition).
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import time

import pytest

from ferry.localcluster import ClusterCerts, LocalCluster
from node.errors import BadRequest
from node.rpcapi import METHODS, VALIDATOR_METHODS
from node.wire import Pool
from transfer.tls import TlsContexts, TlsFiles
from validation import validate
from validation.live import CertificateRefused, LiveSettings

from test_live import Writer  # the same writer: puts through the cluster's (TLS) client

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PARTS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("live-tls"))
    with LocalCluster(os.path.join(root, "c"), partitions=PARTS, backups=1, tls=True, etcd_tls=False,
                      checkpoint_interval=1.0, wal_sync="none") as c:
        c.start(2)
        c.load(400, threads=2)
        yield c


def _sent_lines(cluster: LocalCluster) -> int:
    """Partition files the nodes' suppliers have sent so far (their logs)."""
    n = 0
    for path in glob.glob(os.path.join(cluster.root, "n*.log")):
        with open(path, errors="replace") as f:
            n += sum(1 for line in f if "supplier: partition" in line and " sent to " in line)
    return n


def test_live_validation_over_mutual_tls_passes_under_writes(spark, cluster) -> None:
    files = cluster.validator_tls
    assert files is not None and TlsContexts(files).identity.role == "validator"
    assert all("--secret-file" not in n.proc.args for n in cluster.nodes if n.proc)
    sent = _sent_lines(cluster)
    w = Writer(cluster)
    w.start()
    try:
        time.sleep(0.5)
        res = validate([], spark=spark, live=LiveSettings(seeds=cluster.seeds[:1], tls=files, parallel=2))
    finally:
        w.stop()
    assert res["passed"], json.dumps(res)[:3000]
    assert res["mode"] == "live" and res["partitions_checked"] == PARTS
    for p in res["live"]["partitions"]:
        assert p["counter"] is not None and len(p["copies"]) == 2
        assert {c["snapshot"] for c in p["copies"].values()} == {p["counter"]}
    assert not res["live"]["unchecked"] and not res["live"]["counter_mismatch"]
    assert w.writes > 20, w.errors[:3]
    # every copy came from a supplier, over TLS (the nodes read no secret)
    assert _sent_lines(cluster) - sent >= 2 * PARTS


def test_a_certificate_of_another_ca_is_refused_and_nothing_is_fetched(spark, cluster, tmp_path) -> None:
    other = ClusterCerts(str(tmp_path / "other-ca"), str(tmp_path / "other"), name="another-ca")
    theirs = other.validator()
    mine = cluster.validator_tls
    assert mine is not None
    sent = _sent_lines(cluster)
    # all three files of another cluster: the validator does not trust the node either
    with pytest.raises(CertificateRefused, match="nothing was asked.*another cluster's CA"):
        validate([], spark=spark, live=LiveSettings(seeds=cluster.seeds[:1], tls=theirs))
    # this cluster's CA, but a certificate the other CA signed: the node refuses it
    with pytest.raises(CertificateRefused, match="does not trust our certificate"):
        validate([], spark=spark, live=LiveSettings(seeds=cluster.seeds[:1],
                                                     tls=TlsFiles(mine.ca, theirs.cert, theirs.key)))
    # an executor's fetch with that certificate is refused by the supplier too, and
    # leaves nothing behind
    from node.rpcapi import ValidateFence, ValidateUnfence, fetch_map
    from transfer import Demander, DirectoryStorage, TransferError
    pool = Pool(b"", tls=TlsContexts(mine))
    try:
        m = fetch_map(pool, cluster.seeds[0])
        rec = m.parts["default"][0]
        primary = m.address(rec.primary)
        assert primary is not None
        fence = pool.request(primary, ValidateFence("default", 0, rec.term))
        pool.request(primary, ValidateUnfence("default", 0, fence.token))
    finally:
        pool.close()
    node = rec.primary
    address = fence.transfer[node]
    out = tmp_path / "fetched"
    out.mkdir()
    with pytest.raises(TransferError):
        Demander(DirectoryStorage(str(out)), address, b"", timeout=10.0,
                 tls=TlsContexts(TlsFiles(mine.ca, theirs.cert, theirs.key)), tls_peer=node).fetch(0, cache="default")
    assert [f for _, _, fs in os.walk(out) for f in fs] == []
    assert _sent_lines(cluster) == sent


def test_a_client_certificate_cannot_validate(cluster) -> None:
    client = cluster.client_tls
    assert client is not None
    from validation.live import plan
    with pytest.raises(CertificateRefused, match="client certificate may not fence.*--validator"):
        plan(LiveSettings(seeds=cluster.seeds[:1], tls=client))
    # and the node refuses the fence to a client certificate all the same
    pool = Pool(b"", role="client", tls=TlsContexts(client))
    try:
        with pytest.raises(BadRequest, match="validate_fence' is for nodes only"):
            pool.call(cluster.seeds[0], "validate_fence", cache="default", p=0, term=1)
    finally:
        pool.close()


# every node-only method that changes a node's state or starts a transfer session
NODE_MUTATING = {"replicate": dict(key=b"k", value=b"evil", counter=10 ** 9, prev=0, primary="n1"),
                 "replicate_batch": dict(items=[[b"k", b"evil", 10 ** 9]], prev=0, primary="n1"),
                 "join_isr": dict(node="n1"), "demand": dict(node="n1"), "register": dict(node="n1"),
                 "handoff": dict(to="n1"), "unfence": {}}


def test_the_validator_certificate_cannot_call_node_only_or_write_methods(cluster) -> None:
    files = cluster.validator_tls
    assert files is not None
    assert VALIDATOR_METHODS == {"ping", "get_map", "validate_fence", "validate_unfence"}
    addr = cluster.seeds[0]
    with cluster.client() as c:
        c.put("default", "guarded", "before")
    pool = Pool(b"", tls=TlsContexts(files))
    try:
        epoch = pool.call(addr, "ping")["epoch"]
        for method, args in NODE_MUTATING.items():
            with pytest.raises(BadRequest, match=f"method '{method}' is for nodes only"):
                pool.call(addr, method, cache="default", p=0, **args)
        # the other node-only methods too, and the client's writes
        # (debug_set is served only with FERRY_DEBUG_RPC=1: an unknown method here)
        for method in sorted(set(METHODS) - VALIDATOR_METHODS - set(NODE_MUTATING) - {"debug_set"}):
            with pytest.raises(BadRequest, match=f"method '{method}' is"):
                pool.call(addr, method, cache="default", p=0)
        with pytest.raises(BadRequest, match="'put' is not for a validator certificate"):
            pool.call(addr, "put", cache="default", key=b"guarded", value=b"after")
        assert pool.call(addr, "ping")["epoch"] == epoch          # the map did not change
    finally:
        pool.close()
    with cluster.client() as c:
        assert c.get("default", "guarded") in (b"before", "before")


def _ferry_validate(py_env, python, cluster: LocalCluster, files: TlsFiles, *extra: str):  # noqa: ANN001
    return subprocess.run([python, "-m", "ferry", "validate", "--cluster", cluster.seeds[0],
                           "--tls-ca", files.ca, "--tls-cert", files.cert, "--tls-key", files.key,
                           *extra], env=py_env, capture_output=True, text=True, timeout=300)


def test_ferry_validate_command_over_mutual_tls(py_env, python, cluster, tmp_path) -> None:
    files = cluster.validator_tls
    assert files is not None
    r = _ferry_validate(py_env, python, cluster, files, "--master", "local[1]", "--parallel", "2", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert res["passed"] and res["mode"] == "live" and res["partitions_checked"] == PARTS
    # another CA's certificate: exit 2 before Spark starts, one line saying why
    other = ClusterCerts(str(tmp_path / "other-ca"), str(tmp_path / "other"), name="another-ca").validator()
    r = _ferry_validate(py_env, python, cluster, TlsFiles(files.ca, other.cert, other.key))
    assert r.returncode == 2, (r.stdout, r.stderr[-3000:])
    assert "nothing was asked" in r.stderr and "does not trust our certificate" in r.stderr
    assert "Traceback" not in r.stderr and "SparkContext" not in r.stderr
