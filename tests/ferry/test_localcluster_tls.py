"""LocalCluster with mutual TLS (``tls=True``): real node processes with certificates of
the cluster's CA and no secret; the cluster's clients hold a client certificate. One
cluster for the whole file: 2 nodes come up, take writes and reads, a 3rd joins and
its moves complete; a client without a certificate, one with another CA's and one
that presents a certificate to the wrong mode are refused."""
from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys

import pytest

from ferry.localcluster import ROOT, ClusterCerts, LocalCluster, key_of, value_of
from node.certs import describe
from node.client import Client
from node.errors import AuthFailed, NodeError
from node.wire import Pool
from transfer.tls import TlsContexts


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("tls-cluster"))
    with LocalCluster(os.path.join(root, "c"), partitions=4, backups=1, tls=True, etcd_tls=False,
                      checkpoint_interval=1.0, wal_sync="none") as c:
        c.start(2)
        yield c


def test_nodes_run_with_certificates_and_no_secret(cluster):
    n1 = cluster.nodes[0]
    with open(cluster.node_config(n1.id)) as f:
        cfg = f.read()
    assert "[tls]" in cfg
    cert = cfg.split('cert = "')[1].split('"')[0]
    assert describe(cert)["ferry_identity"] == "ferry://node/n1"
    assert "--secret-file" not in (n1.proc.args if n1.proc else [])
    assert describe(cluster.client_tls.cert)["ferry_identity"] == "ferry://client/localcluster"


def test_write_read_and_a_join_under_tls(cluster):
    with cluster.client() as c:
        for i in range(200):
            c.put("default", key_of(i), value_of(i))
    n3 = cluster.add_node(wait=False)
    doc = cluster.wait_all_owning(timeout=90)
    assert any(n3.id in p["owners"] for p in doc["partitions"])
    moves = [m for m in cluster.moves_done() if m["to"] == n3.id]
    assert moves and all(m["mode"] == "files" for m in moves)
    with cluster.client() as c:
        assert all(c.get("default", key_of(i)) == value_of(i) for i in range(200))


def test_a_client_command_with_the_client_certificate(cluster):
    env = dict(os.environ, PYTHONPATH=ROOT, **cluster.client_env())
    env.pop("FERRY_SECRET", None)
    r = subprocess.run([sys.executable, "-m", "ferry", "cluster", "status", "--seed", cluster.seeds[0],
                        "--json"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr


def test_a_client_without_a_certificate_is_refused(cluster):
    # the cluster's secret file exists, but no node reads it: a secret-mode client's
    # handshake is not TLS and the node drops it
    with open(cluster.secret_file, "rb") as f:
        secret = f.read().strip()
    pool = Pool(secret, role="client", timeout=5.0)
    with pytest.raises(NodeError):
        pool.call(cluster.seeds[0], "ping")
    pool.close()
    # TLS that trusts the cluster's CA but presents no certificate: the handshake fails
    host, port = cluster.seeds[0].rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=cluster.client_tls.ca)
    ctx.check_hostname = False
    with socket.create_connection((host, int(port)), timeout=5.0) as raw:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            with ctx.wrap_socket(raw) as s:
                s.sendall(b"\0" * 16)
                if not s.recv(1):
                    raise ConnectionError("closed without a reply")


def test_a_certificate_of_another_ca_is_refused(cluster, tmp_path):
    other = ClusterCerts(str(tmp_path / "other-ca"), str(tmp_path / "other"), name="another-ca")
    with pytest.raises(AuthFailed):
        Pool(b"", role="client", timeout=5.0, tls=TlsContexts(other.client())).call(cluster.seeds[0], "ping")
    with pytest.raises(NodeError):
        with Client(cluster.seeds, tls=other.client(), timeout=5.0) as c:
            c.get("default", key_of(1))
