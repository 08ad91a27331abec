"""Live validation that finds the nodes through an etcd with TLS, client-certificate
auth and RBAC (``LocalCluster(tls=True, etcd_tls=True)``: the embedded etcd set up by
``ferry etcd setup``). The validator reads ``P/members/`` with the cluster's read-only
user and its certificate (``--etcd-*`` or ``$FERRY_ETCD_*``), then talks to the nodes
with its validator certificate. Without etcd credentials, with a user of another
prefix, or with files that do not exist, it stops with one line that says why and how
to give them, before Spark starts.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from ferry.localcluster import LocalCluster
from node.control import EtcdAccess
from validation.job import live_settings
from validation.live import ClusterUnreachable, LiveSettings, ValidationError, read_map

pytestmark = [pytest.mark.slow]

PARTS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("live-cp-tls"))
    with LocalCluster(os.path.join(root, "c"), partitions=PARTS, backups=1, tls=True, etcd_tls=True,
                      checkpoint_interval=1.0, wal_sync="none") as c:
        c.start(2)
        c.load(200, threads=2)
        yield c


def _env(a: EtcdAccess) -> dict[str, str]:
    pairs = (("CA", a.ca), ("CERT", a.cert), ("KEY", a.key), ("USER", a.user),
             ("PASSWORD_FILE", a.password_file))
    return {f"FERRY_ETCD_{k}": v for k, v in pairs if v}


def test_the_map_is_found_through_etcd_with_the_read_only_user(cluster, monkeypatch) -> None:
    for k in list(os.environ):
        if k.startswith("FERRY_ETCD_"):
            monkeypatch.delenv(k)
    reader = cluster.etcd_access("reader")
    assert reader.user and reader.user.endswith("-reader") and cluster.control_plane[0].startswith("https://")
    s = LiveSettings(control_plane=list(cluster.control_plane), tls=cluster.validator_tls, etcd=reader)
    cmap, seeds, secret_file, tls = read_map(s)
    assert sorted(seeds) == sorted(n.address for n in cluster.nodes)
    assert secret_file == "" and tls is not None
    assert [len(v) for v in cmap.parts.values()] == [PARTS]
    assert all(r.primary for r in cmap.parts["default"])
    # the same from the environment, as ``ferry cluster`` commands read it
    for k, v in _env(reader).items():
        monkeypatch.setenv(k, v)
    s = live_settings(None, ",".join(cluster.control_plane), "/ferry/default", None, [], 2, None,
                      tuple((cluster.validator_tls.ca, cluster.validator_tls.cert, cluster.validator_tls.key)))
    assert s is not None and s.etcd == reader
    assert sorted(read_map(s)[1]) == sorted(seeds)


def test_no_or_wrong_etcd_credentials_say_why_before_anything_else(cluster, monkeypatch, tmp_path) -> None:
    for k in list(os.environ):
        if k.startswith("FERRY_ETCD_"):
            monkeypatch.delenv(k)
    cp = list(cluster.control_plane)
    # nothing: etcd's certificate cannot be verified, and the hint names the options
    with pytest.raises(ClusterUnreachable) as e:
        read_map(LiveSettings(control_plane=cp, tls=cluster.validator_tls))
    assert "certificate" in str(e.value) and "--etcd-ca" in str(e.value)
    # the CA only: etcd wants a client certificate
    reader = cluster.etcd_access("reader")
    with pytest.raises(ClusterUnreachable) as e:
        read_map(LiveSettings(control_plane=cp, tls=cluster.validator_tls, etcd=EtcdAccess(ca=reader.ca)))
    assert "--etcd-cert" in str(e.value)
    # a wrong password for the reader
    bad = tmp_path / "wrong.password"
    bad.write_text("not-the-password\n")
    with pytest.raises(ClusterUnreachable) as e:
        read_map(LiveSettings(control_plane=cp, tls=cluster.validator_tls,
                              etcd=EtcdAccess(reader.ca, reader.cert, reader.key, reader.user, str(bad))))
    assert "refused" in str(e.value)
    # the reader may not read another cluster's prefix
    with pytest.raises(ClusterUnreachable) as e:
        read_map(LiveSettings(control_plane=cp, prefix="/ferry/other", tls=cluster.validator_tls, etcd=reader))
    assert "/ferry/other/members/" in str(e.value)
    # options that cannot work: a missing file, a certificate without its key, plain http
    files = cluster.validator_tls
    with pytest.raises(ValidationError, match="--etcd-ca"):
        live_settings(None, cp[0], "/ferry/default", None, [], 2, None, (files.ca, files.cert, files.key),
                      (str(tmp_path / "missing.crt"), None, None, None, None))
    with pytest.raises(ValidationError, match="--etcd-cert and --etcd-key"):
        live_settings(None, cp[0], "/ferry/default", None, [], 2, None, (files.ca, files.cert, files.key),
                      (reader.ca, reader.cert, None, None, None))
    with pytest.raises(ValidationError, match="https"):
        live_settings(None, cp[0].replace("https://", "http://"), "/ferry/default", None, [], 2, None,
                      (files.ca, files.cert, files.key), (reader.ca, None, None, None, None))
    with pytest.raises(ValidationError, match="--control-plane"):
        live_settings(cluster.seeds[0], None, "/ferry/default", None, [], 2, None,
                      (files.ca, files.cert, files.key), (reader.ca, None, None, None, None))


@pytest.mark.spark
def test_ferry_validate_with_control_plane_and_etcd_options(py_env, python, cluster) -> None:
    files = cluster.validator_tls
    reader = cluster.etcd_access("reader")
    env = {k: v for k, v in py_env.items() if not k.startswith("FERRY_ETCD_")}
    base = [python, "-m", "ferry", "validate", "--control-plane", ",".join(cluster.control_plane),
            "--tls-ca", files.ca, "--tls-cert", files.cert, "--tls-key", files.key]
    r = subprocess.run(base + ["--etcd-ca", reader.ca, "--etcd-cert", reader.cert, "--etcd-key", reader.key,
                               "--etcd-user", reader.user, "--etcd-password-file", reader.password_file,
                               "--master", "local[1]", "--parallel", "2", "--json"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert res["passed"] and res["mode"] == "live" and res["partitions_checked"] == PARTS
    # without them: exit 2, one line, no traceback, Spark never started
    r = subprocess.run(base, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr[-3000:])
    assert "--etcd-ca" in r.stderr and "Traceback" not in r.stderr and "SparkContext" not in r.stderr
