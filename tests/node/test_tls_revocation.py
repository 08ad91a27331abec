"""Certificate revocation (node/crl.py, transfer.tls): a revocation list signed by the
cluster CA, checked at every TLS handshake both ways, reloaded within a second of
changing, and cutting the open connections of a certificate it lists. A list that is
not the CA's, does not parse, has expired or revokes the holder itself is refused with
one message, never half used. Real TLS over loopback with node.rpc's server and pool,
and real node processes for the end-to-end case."""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from nodeharness import ROOT, env, free_port

from node import crl
from node.certs import init_ca, issue
from node.errors import AuthFailed, NodeError
from node.rpc import RpcServer
from node.wire import Pool
from transfer.errors import TlsError
from transfer.tls import TlsContexts, TlsFiles


def _files(ca: str, name: str, role: str, with_crl: bool = True) -> TlsFiles:
    out = issue(ca, name, os.path.join(ca, "issued"), role=role)
    return TlsFiles(os.path.join(ca, "ca.crt"), out.cert, out.key, crl.crl_path(ca) if with_crl else None)


@pytest.fixture
def ca(tmp_path) -> str:
    d = str(tmp_path / "ca")
    init_ca(d, name="test-cluster-ca")
    crl.write_crl(d)
    return d


@pytest.fixture
def server(ca):
    port = free_port()
    srv = RpcServer(f"127.0.0.1:{port}", b"", lambda method, args, role: "pong",
                    tls=TlsContexts(_files(ca, "n1", "node"), check_every=0.2))
    srv.start()
    yield f"127.0.0.1:{port}", srv
    srv.stop()


def _until(pred: Any, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return bool(pred())


def test_a_revoked_client_is_refused_and_its_open_connection_closed(ca, server) -> None:
    addr, srv = server
    bad, good = _files(ca, "leaked", "client"), _files(ca, "ops", "client")
    p_bad, p_good = Pool(b"", tls=TlsContexts(bad)), Pool(b"", tls=TlsContexts(good))
    try:
        assert p_bad.call(addr, "ping") == "pong" and p_good.call(addr, "ping") == "pong"
        chan = p_bad._free[addr][0]
        rec, new, path = crl.revoke(ca, bad.cert, reason="key_compromise")
        assert new and path == bad.crl and rec.identity == "ferry://client/leaked"
        # the node notices without a new connection and closes the open one
        assert _until(lambda: srv.tls.cut >= 1), "the revoked client's connection stayed open"
        with pytest.raises((AuthFailed, NodeError)) as e:
            for _ in range(3):       # the pooled channel is dead; the next one is refused
                p_bad.call(addr, "ping")
        assert "revoked" in str(e.value), e.value
        assert chan.broken or chan not in p_bad._free.get(addr, [])
        # another certificate of the same CA is untouched, old and new connections
        assert p_good.call(addr, "ping") == "pong"
        p_good2 = Pool(b"", tls=TlsContexts(good))
        assert p_good2.call(addr, "ping") == "pong"
        p_good2.close()
        # revoking again changes nothing but the list's number
        rec2, new2, _ = crl.revoke(ca, bad.cert)
        assert not new2 and rec2.serial == rec.serial
        assert [r.serial for r in crl.revoked(ca)[0]] == [rec.serial]
    finally:
        p_bad.close()
        p_good.close()


def test_a_client_refuses_a_revoked_node(ca, tmp_path) -> None:
    node = _files(ca, "n1", "node", with_crl=False)      # the node itself reads no list
    port = free_port()
    srv = RpcServer(f"127.0.0.1:{port}", b"", lambda method, args, role: "pong", tls=TlsContexts(node))
    srv.start()
    try:
        crl.revoke(ca, node.cert)
        pool = Pool(b"", tls=TlsContexts(_files(ca, "ops", "client")))
        with pytest.raises((AuthFailed, NodeError), match="revoked"):
            pool.call(f"127.0.0.1:{port}", "ping")
        pool.close()
    finally:
        srv.stop()


def test_a_node_whose_own_certificate_is_revoked_does_not_start(ca) -> None:
    mine = _files(ca, "n2", "node")
    crl.revoke(ca, mine.cert, serial=None)
    with pytest.raises(TlsError, match=r"is revoked by .*issue this side a new certificate"):
        TlsContexts(mine)


def _crl_signed(ca_dir: str, key: Any, issuer: Any, next_update: datetime.datetime) -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    now = datetime.datetime.now(datetime.timezone.utc)
    c = (x509.CertificateRevocationListBuilder().issuer_name(issuer)
         .last_update(min(now, next_update) - datetime.timedelta(days=1)).next_update(next_update)
         .sign(key, hashes.SHA256()))
    return c.public_bytes(serialization.Encoding.PEM)


def test_lists_that_are_not_the_cas_are_refused(ca, tmp_path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    files = _files(ca, "n1", "node")
    with open(files.ca, "rb") as f:
        subject = x509.load_pem_x509_certificate(f.read()).subject
    with open(os.path.join(ca, "ca.key"), "rb") as f:
        ca_key = serialization.load_pem_private_key(f.read(), password=None)
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=30)
    cases = {
        # the CA's name, another key: a forged list (it would un-revoke, or revoke at will)
        "forged": (_crl_signed(ca, ec.generate_private_key(ec.SECP256R1()), subject, later),
                   "not signed by the CA"),
        # another CA's list
        "other": (open(crl.write_crl(_other(tmp_path)), "rb").read(), "not by the CA"),
        # the CA's, past its next update
        "expired": (_crl_signed(ca, ca_key, subject, later - datetime.timedelta(days=60)), "expired on"),
        "garbage": (b"-----BEGIN X509 CRL-----\nbm90IGEgQ1JM\n-----END X509 CRL-----\n",
                    "not a PEM certificate revocation list"),
        "empty": (b"", "not a PEM certificate revocation list"),
    }
    for name, (data, why) in cases.items():
        path = str(tmp_path / f"{name}.pem")
        with open(path, "wb") as f:
            f.write(data)
        with pytest.raises(TlsError, match=why):
            TlsContexts(TlsFiles(files.ca, files.cert, files.key, path))
    with pytest.raises(TlsError, match="is not a readable file"):
        TlsContexts(TlsFiles(files.ca, files.cert, files.key, str(tmp_path / "missing.pem")))


def _other(tmp_path) -> str:
    d = str(tmp_path / "other-ca")
    init_ca(d, name="another-cluster-ca")
    return d


def test_a_bad_list_written_later_keeps_the_previous_one(ca, server) -> None:
    addr, srv = server
    bad = _files(ca, "leaked", "client")
    crl.revoke(ca, bad.cert)
    assert _until(lambda: srv.tls.revoked)
    before = srv.tls.revoked
    with open(bad.crl, "wb") as f:       # half written, or garbage
        f.write(b"-----BEGIN X509 CRL-----\n")
    time.sleep(0.6)
    assert srv.tls.revoked == before      # still enforced
    pool = Pool(b"", tls=TlsContexts(_files(ca, "leaked2", "client", with_crl=False)))
    assert pool.call(addr, "ping") == "pong"
    pool.close()
    pool = Pool(b"", tls=TlsContexts(TlsFiles(bad.ca, bad.cert, bad.key)))
    with pytest.raises((AuthFailed, NodeError), match="revoked"):
        pool.call(addr, "ping")
    pool.close()


def _ferry(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ferry", *args], env=env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_certs_revoke_and_crl_commands(ca, tmp_path) -> None:
    files = _files(ca, "v1", "validator")
    r = _ferry("certs", "revoke", ca, files.cert, "--reason", "key_compromise", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["new"] and doc["identity"] == "ferry://validator/v1" and doc["reason"] == "key_compromise"
    r = _ferry("certs", "revoke", ca, "--serial", doc["serial"], "--json")
    assert r.returncode == 0 and not json.loads(r.stdout)["new"]
    r = _ferry("certs", "crl", ca, "--json")
    out = json.loads(r.stdout)
    assert [x["serial"] for x in out["revoked"]] == [doc["serial"]] and out["crl_number"] >= 4
    from cryptography import x509
    with open(out["crl"], "rb") as f:
        lst = x509.load_pem_x509_crl(f.read())
    assert [format(x.serial_number, "X") for x in lst] == [doc["serial"].lstrip("0") or "0"]
    # refused, one line each, nothing changed
    other = _other(tmp_path)
    foreign = issue(other, "x", os.path.join(other, "issued"), role="client")
    for args, why in (((foreign.cert,), "not by this CA"), ((os.path.join(ca, "ca.crt"),), "CA's own"),
                      (("--serial", "zz"), "not hexadecimal"), ((), "one of the two")):
        r = _ferry("certs", "revoke", ca, *args)
        assert r.returncode == 2 and why in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    assert [x.serial for x in crl.revoked(ca)[0]] == [doc["serial"]]


@pytest.mark.slow
def test_a_running_cluster_cuts_a_revoked_client(tmp_path) -> None:
    from ferry.localcluster import LocalCluster
    with LocalCluster(str(tmp_path / "c"), partitions=4, backups=1, tls=True, etcd_tls=False,
                      tls_crl=True, wal_sync="none") as c:
        c.start(2)
        assert c.certs is not None and c.certs.crl
        with open(c.node_config("n1")) as f:
            assert "crl = " in f.read()
        with c.client() as cl:
            cl.put("default", "k1", b"v1")
            c.certs.revoke(c.client_tls)
            deadline = time.monotonic() + 10
            refused = None
            while time.monotonic() < deadline and refused is None:
                try:
                    cl.put("default", "k2", b"v2")
                    time.sleep(0.2)
                except Exception as e:  # noqa: BLE001 - any refusal ends the loop
                    refused = e
            assert refused is not None and "revoked" in str(refused), refused
        # the nodes themselves still talk: a validator certificate reads the map
        pool = Pool(b"", role="node", tls=TlsContexts(c.validator_tls))
        assert pool.call(c.seeds[0], "get_map", start=0, count=4)
        pool.close()
