"""The control plane with TLS, client-certificate authentication and etcd's RBAC: a real
etcd (EtcdCluster(tls=True, auth_prefix=...), its own CA), real certificates, real node
processes and the ferry commands."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from nodeharness import ROOT, NodeProc, env, write_secret
from node import certs
from node.control import ControlPlaneAccessError, Etcd, EtcdAccess
from node.errors import ConfigError, ControlPlaneTLSError
from node.etcdserver import EtcdCluster
from node.membership import _legacy_secret_check, secret_matches

pytestmark = pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd not installed")
P = "/ferry/default"


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    c = EtcdCluster(str(tmp_path_factory.mktemp("etcd-tls")), tls=True, auth_prefix=P).start()
    yield c
    c.stop()


def _config(path, a: EtcdAccess, endpoints, prefix: str = P) -> str:
    lines = [f'[control_plane]\nendpoints = {json.dumps(endpoints)}\nprefix = "{prefix}"\n']
    for k in ("ca", "cert", "key", "user", "password_file"):
        if getattr(a, k):
            lines.append(f"{k} = {json.dumps(getattr(a, k))}\n")
    lines.append('[[caches]]\nname = "default"\npartitions = 4\nbackups = 0\n')
    path.write_text("".join(lines))
    return str(path)


def _refused_start(n: NodeProc, timeout: float = 20.0) -> tuple[float, str]:
    t0 = time.monotonic()
    n.start(wait=False)
    assert n.proc is not None
    rc = n.proc.wait(timeout)
    took = time.monotonic() - t0
    assert rc == 2, n.tail()
    return took, n.tail()


def _ferry(args: list[str], extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ferry", *args], env=env(extra), cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def _env_of(a: EtcdAccess) -> dict[str, str]:
    return {"FERRY_ETCD_CA": a.ca or "", "FERRY_ETCD_CERT": a.cert or "", "FERRY_ETCD_KEY": a.key or "",
            "FERRY_ETCD_USER": a.user or "", "FERRY_ETCD_PASSWORD_FILE": a.password_file or ""}


def test_a_node_with_its_certificate_and_user_joins_serves_writes_and_upgrades_the_verifier(
        secure, tmp_path, nodes):
    secret = write_secret(str(tmp_path / "secret"))
    # the cluster record holds the older verifier (an HMAC under the raw secret)
    raw = open(secret, "rb").read().strip()
    root = Etcd(secure.endpoints, access=secure.access("root"))
    salt = "00" * 16
    root.put(f"{P}/meta", {"caches": [{"name": "default", "partitions": 4, "backups": 0, "indexes": []}],
                           "created_by": "n1", "secret_salt": salt,
                           "secret_check": _legacy_secret_check(raw, salt)})
    cfg = _config(tmp_path / "n1.toml", secure.access("node"), secure.endpoints)
    n = NodeProc(str(tmp_path), "n1", secret, config=cfg, control_plane=secure.endpoints)
    nodes.append(n)
    n.start()
    from node import Client
    with Client([n.address], secret_file=secret) as c:
        for i in range(20):
            c.put("default", f"k{i}".encode(), f"v{i}".encode())
        assert c.get("default", b"k7") == b"v7"
    reader = Etcd(secure.endpoints, access=secure.access("reader"))
    assert reader.get(f"{P}/members/n1") is not None
    meta = reader.get(f"{P}/meta")
    assert meta is not None and isinstance(meta.value, dict)
    check, new_salt = str(meta.value["secret_check"]), str(meta.value["secret_salt"])
    assert check.startswith("scrypt1:") and new_salt != salt
    assert secret_matches(raw, new_salt, check) is True
    assert secret_matches(b"another-secret-entirely-0123456789", new_salt, check) is False
    n.stop()


def test_a_certificate_from_another_ca_is_refused_within_seconds(secure, tmp_path, nodes):
    other = str(tmp_path / "other-ca")
    certs.init_ca(other)
    mine = certs.issue(other, "n1")
    good = secure.access("node")
    a = EtcdAccess(good.ca, mine.cert, mine.key, good.user, good.password_file)
    n = NodeProc(str(tmp_path), "n1", write_secret(str(tmp_path / "secret")),
                 config=_config(tmp_path / "n1.toml", a, secure.endpoints), control_plane=secure.endpoints)
    nodes.append(n)
    took, tail = _refused_start(n)
    assert "etcd refused this client's certificate" in tail and mine.cert in tail
    assert "Traceback" not in tail
    assert took < 10, took


def test_a_server_certificate_from_another_ca_is_refused_at_once(secure, tmp_path):
    other = str(tmp_path / "other-ca")
    ca = certs.init_ca(other)
    good = secure.access("node")
    t0 = time.monotonic()
    with pytest.raises(ControlPlaneTLSError, match="not signed by the CA in control_plane.ca") as e:
        Etcd(secure.endpoints, access=EtcdAccess(ca.cert, good.cert, good.key, good.user,
                                                 good.password_file)).get(f"{P}/meta")
    assert ca.cert in str(e.value)
    assert time.monotonic() - t0 < 5


def test_no_client_certificate_is_refused_at_once(secure):
    good = secure.access("node")
    with pytest.raises(ControlPlaneTLSError, match="this client has none"):
        Etcd(secure.endpoints, access=EtcdAccess(ca=good.ca, user=good.user,
                                                 password_file=good.password_file)).get(f"{P}/meta")


def test_a_node_user_without_permission_on_its_prefix_is_refused_naming_key_and_role(secure, tmp_path, nodes):
    cfg = _config(tmp_path / "n1.toml", secure.access("node"), secure.endpoints, prefix="/ferry/other")
    n = NodeProc(str(tmp_path), "n1", write_secret(str(tmp_path / "secret")), config=cfg,
                 control_plane=secure.endpoints)
    nodes.append(n)
    took, tail = _refused_start(n)
    line = [ln for ln in tail.splitlines() if "permission denied" in ln]
    assert line, tail
    assert "/ferry/other/meta" in line[-1]
    assert "user 'ferry-default-node' (role ferry-default-node: readwrite /ferry/default/*)" in line[-1]
    assert "Traceback" not in tail
    assert took < 10, took


def test_the_reader_reads_but_cannot_write(secure):
    # a cluster record to read (whichever test of this module ran first on this worker)
    root = Etcd(secure.endpoints, access=secure.access("root"))
    meta = f"{P}/meta"
    root.txn([Etcd.mod_is(meta, 0)],
             [(meta, {"caches": [{"name": "default", "partitions": 4, "backups": 0, "indexes": []}],
                      "created_by": "n1"}, 0)])
    ro = _env_of(secure.access("reader"))
    cp = ["--control-plane", secure.endpoints[0]]
    got = _ferry(["cluster", "settings", "get", *cp, "--json"], ro)
    assert got.returncode == 0, got.stderr
    assert "transfer.rate_limit" in json.loads(got.stdout)
    got = _ferry(["cluster", "reassign", "status", *cp], ro)
    assert got.returncode == 0, got.stderr
    put = _ferry(["cluster", "settings", "set", *cp, "transfer.rate_limit", "1000"], ro)
    assert put.returncode != 0
    assert "permission denied" in put.stderr and f"{P}/settings/transfer.rate_limit" in put.stderr
    assert "role ferry-default-reader: read /ferry/default/*" in put.stderr
    assert "Traceback" not in put.stderr
    # the node's user may
    rw = _ferry(["cluster", "settings", "set", *cp, "transfer.rate_limit", "1000"], _env_of(secure.access("node")))
    assert rw.returncode == 0, rw.stderr


def test_a_wrong_password_or_no_user_is_a_clear_error(secure, tmp_path):
    good = secure.access("node")
    bad = tmp_path / "pw"
    bad.write_text("not-the-password\n")
    with pytest.raises(ControlPlaneAccessError, match="refused the login of user 'ferry-default-node'"):
        Etcd(secure.endpoints, access=EtcdAccess(good.ca, good.cert, good.key, good.user, str(bad))).get(P)
    with pytest.raises(ControlPlaneAccessError, match="names no etcd user"):
        Etcd(secure.endpoints, access=EtcdAccess(good.ca, good.cert, good.key)).get(P)
    assert issubclass(ControlPlaneAccessError, ConfigError)        # a node stops at start, exit 2


def test_a_token_etcd_forgot_is_replaced(secure):
    e = Etcd(secure.endpoints, access=secure.access("node"))
    e.put(f"{P}/t", 1)
    e._clients[0].session.headers["Authorization"] = "forgotten.1"
    assert e.get(f"{P}/t") is not None


def test_setup_runs_again_without_changes_and_keeps_root_off_the_nodes(secure, tmp_path):
    root = secure.access("root")
    got = _ferry(["etcd", "setup", "--control-plane", secure.endpoints[0], "--ca", root.ca or "",
                  "--cert", root.cert or "", "--key", root.key or "", "--root-password-file",
                  root.password_file or "", "--out", secure.pki], {})
    assert got.returncode == 0, got.stderr
    assert "made: nothing (all in place)" in got.stdout
    # the node's user cannot read or change the users and roles
    node = Etcd(secure.endpoints, access=secure.access("node"))
    with pytest.raises(ControlPlaneAccessError, match="permission denied"):
        node.post("/auth/user/add", {"name": "intruder", "password": "x"})


def test_config_keys_are_checked(tmp_path):
    from node.config import load
    (tmp_path / "ca.crt").write_text("x")
    base = {"id": "n1", "data": str(tmp_path / "d")}
    with pytest.raises(ConfigError, match="cert and control_plane.key go together"):
        load(_cfg(tmp_path, 'cert = "ca.crt"'), **base)
    with pytest.raises(ConfigError, match="user and control_plane.password_file go together"):
        load(_cfg(tmp_path, 'user = "u"'), **base)
    with pytest.raises(ConfigError, match="is not a file"):
        load(_cfg(tmp_path, 'ca = "missing.crt"'), **base)
    with pytest.raises(ConfigError, match="reached over https"):
        load(_cfg(tmp_path, 'ca = "ca.crt"', "http://127.0.0.1:2379"), **base)
    cfg = load(_cfg(tmp_path, 'ca = "ca.crt"'), **base)
    assert cfg.etcd_ca == str(tmp_path / "ca.crt")          # relative to the file


def _cfg(tmp_path, line: str, url: str = "https://127.0.0.1:2379") -> str:
    p = tmp_path / "n.toml"
    p.write_text(f'[control_plane]\nendpoints = ["{url}"]\n{line}\n')
    return str(p)


def test_the_secret_verifier_cannot_be_checked_without_the_kdf():
    from node.membership import _secret_check
    from transfer import auth
    secret, salt = b"k3Jq9vXw2LmPz8RtYb4N", "ab" * 16
    check = _secret_check(secret, salt)
    # what reading etcd gives: HMAC under scrypt(secret); the raw-secret HMAC does not match
    key = hashlib.scrypt(secret, salt=auth.KDF_SALT, n=auth.KDF_N, r=auth.KDF_R, p=auth.KDF_P,
                         maxmem=2 * 128 * auth.KDF_N * auth.KDF_R * auth.KDF_P, dklen=32)
    assert check == "scrypt1:" + hmac.new(key, b"ferry-cluster-secret-check\0" + salt.encode(),
                                          hashlib.sha256).hexdigest()
    assert check.split(":", 1)[1] != _legacy_secret_check(secret, salt)
    assert secret_matches(secret, salt, check) is True
    assert secret_matches(secret + b"x", salt, check) is False
    assert secret_matches(secret, salt, _legacy_secret_check(secret, salt)) is True   # accepted, then replaced
    assert secret_matches(secret, salt, "argon9:00") is None                          # a form not known


def test_certs_cli_init_issue_show(tmp_path):
    d = str(tmp_path / "ca")
    assert _ferry(["certs", "init", d], {}).returncode == 0
    again = _ferry(["certs", "init", d], {})
    assert again.returncode == 2 and "a CA is already there" in again.stderr
    assert _ferry(["certs", "issue", d, "etcd1", "--server", "--ip", "10.0.0.5"], {}).returncode == 0
    assert _ferry(["certs", "issue", d, "ops", "--cn"], {}).returncode == 0
    assert _ferry(["certs", "issue", d, "n1"], {}).returncode == 0
    show = json.loads(_ferry(["certs", "show", os.path.join(d, "etcd1.crt"), "--json"], {}).stdout)
    assert show["ips"] == ["10.0.0.5"] and show["issuer_cn"] == "ferry-etcd-ca"
    assert "serverAuth" in show["usages"] and "clientAuth" in show["usages"]
    n1 = json.loads(_ferry(["certs", "show", os.path.join(d, "n1.crt"), "--json"], {}).stdout)
    assert n1["subject_cn"] == "" and "OU=n1" in n1["subject"] and n1["usages"] == ["clientAuth"]
    ops = certs.describe(os.path.join(d, "ops.crt"))
    assert ops["subject_cn"] == "ops"
    assert oct(os.stat(os.path.join(d, "n1.key")).st_mode & 0o777) == "0o600"
    bad = _ferry(["certs", "issue", d, "x", "--ip", "not-an-ip"], {})
    assert bad.returncode == 2 and "--ip" in bad.stderr


def test_a_cut_link_after_etcd_answered_is_unreachable_not_a_refused_certificate(secure):
    """A proxy that accepts and closes (a network cut) ends the TLS handshake without an
    alert, as etcd does to a client without a certificate. Once etcd has answered this
    client its credentials work: the cut is ControlPlaneDown (retried), never a refusal
    of the certificate; after the heal the same client goes on."""
    from urllib.parse import urlsplit

    from cluster_sim.netproxy import Proxy
    from node.errors import ControlPlaneDown
    u = urlsplit(secure.endpoints[0])
    proxy = Proxy((u.hostname, u.port)).start()
    try:
        e = Etcd([f"https://127.0.0.1:{proxy.port}"], access=secure.access("node"))
        e.get(f"{P}/meta")                  # answered: the credentials work
        proxy.cut()
        for _ in range(3):
            with pytest.raises(ControlPlaneDown) as exc:
                e.get(f"{P}/meta")
            assert not isinstance(exc.value, ControlPlaneTLSError)
            assert "refused this client's certificate" not in str(exc.value)
        assert proxy.refused >= 3
        proxy.heal()
        e.get(f"{P}/meta")
    finally:
        proxy.stop()
