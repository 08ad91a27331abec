"""Mutual TLS between real node processes, and between them and clients: certificates
made by node.certs (the ``cryptography`` package) in the test's folder, the nodes
started with [tls] in their config and a secret file that does not exist (so nothing
can be authenticated by the secret)."""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from nodeharness import ROOT, NodeProc, env

from node.assignment import partition_of
from node.certs import init_ca, issue
from node.client import Client
from node.cluster_map import ClusterMap
from node.config import load as load_config
from node.errors import AuthFailed, BadRequest, ConfigError, NodeError
from node.node import CLIENT_METHODS, NODE_CLAIMS
from node.status import collect
from node.wire import Channel, Pool
from transfer.tls import TlsContexts, TlsFiles

PARTS = 4
# every node-only method of a node (node/node.py's handlers minus CLIENT_METHODS)
NODE_ONLY = ["replicate", "replicate_batch", "join_isr", "demand", "fetch", "demand_done", "register",
             "handoff", "unfence", "ack_latency", "holds", "validate_fence", "validate_unfence"]


def _files(ca: str, name: str, role: str) -> TlsFiles:
    out = issue(ca, name, os.path.join(ca, "issued"), role=role)
    return TlsFiles(os.path.join(ca, "ca.crt"), out.cert, out.key)


@pytest.fixture
def ca(tmp_path) -> str:
    d = str(tmp_path / "ca")
    init_ca(d, name="test-cluster-ca")
    return d


@pytest.fixture
def other_ca(tmp_path) -> str:
    d = str(tmp_path / "other-ca")
    init_ca(d, name="another-cluster-ca")
    return d


def _node(tmp_path, ca: str, node_id: str, files: TlsFiles | None = None) -> NodeProc:
    f = files or _files(ca, node_id, "node")
    cfg = tmp_path / f"{node_id}.toml"
    cfg.write_text(f"""
[tls]
ca = "{f.ca}"
cert = "{f.cert}"
key = "{f.key}"

[[caches]]
name = "default"
partitions = {PARTS}
backups = 1
""")
    return NodeProc(str(tmp_path), node_id, str(tmp_path / "no-such-secret"), config=str(cfg))


def _pool(files: TlsFiles, **kw: Any) -> Pool:
    return Pool(b"", role="client", tls=TlsContexts(files), **kw)


def _settled(seed: str, pool: Pool, nodes: int, timeout: float = 90.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    doc: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            doc = collect(pool, seed)
        except NodeError:
            time.sleep(0.3)
            continue
        live = [n["id"] for n in doc["nodes"] if n["alive"]]
        if len(live) == nodes and not doc["moves"] and all(
                len(p["owners"]) == 2 and set(p["states"].values()) == {"OWNING"}
                and sorted(p.get("in_sync", p["owners"])) == sorted(p["owners"])
                for p in doc["partitions"]):
            return doc
        time.sleep(0.3)
    raise AssertionError(f"cluster did not settle: {str(doc)[:2000]}")


@pytest.fixture
def pair(tmp_path, nodes, ca):
    """n1 then n2 (n2 joins: partitions move to it by file transfer, over TLS)."""
    n1 = _node(tmp_path, ca, "n1").start()
    nodes.append(n1)
    ops = _files(ca, "ops", "client")
    with Client([n1.address], tls=ops) as c:
        for i in range(40):
            c.put("default", f"k{i}", f"v{i}")
    n2 = _node(tmp_path, ca, "n2").start()
    nodes.append(n2)
    pool = _pool(ops)
    _settled(n1.address, pool, 2)
    pool.close()
    return n1, n2, ops


def _primary_key(pool: Pool, seed: str, node_id: str) -> str:
    """A key whose partition ``node_id`` leads now."""
    m = ClusterMap.fetch(lambda **a: pool.call(seed, "get_map", **a))
    for i in range(1000):
        k = f"key-{i}"
        if m.primary("default", partition_of(k.encode(), PARTS)) == node_id:
            return k
    raise AssertionError(f"{node_id} leads no partition")


def test_cluster_runs_over_mtls(pair) -> None:
    n1, n2, ops = pair
    # the join moved files n1 -> n2 over TLS, and replication runs n1 <-> n2 over TLS
    assert "stage=install" in open(n2.log).read()
    with Client([n2.address], tls=ops) as c:
        for i in range(40):
            assert c.get("default", f"k{i}") == f"v{i}".encode()
        c.put("default", "after", "join")
        assert c.get("default", "after") == b"join"
        # a stale read from each OWNING copy: the backup got the write by replication
        for _ in range(6):
            assert c.get("default", "after", consistency="stale") == b"join"
    for n in (n1, n2):
        assert "does not know the cluster secret" not in open(n.log).read()
    # the ferry cluster commands take a client certificate from the environment
    tls_env = env({"FERRY_TLS_CA": ops.ca, "FERRY_TLS_CERT": ops.cert, "FERRY_TLS_KEY": ops.key})
    r = subprocess.run([sys.executable, "-m", "ferry", "cluster", "get", "--seed", n1.address, "after"],
                       capture_output=True, text=True, env=tls_env, cwd=ROOT, timeout=60)
    assert r.returncode == 0 and "join" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-m", "ferry", "cluster", "status", "--seed", n1.address, "--json"],
                       capture_output=True, text=True, env=tls_env, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    # the moves to n2 say which way their files came
    pool = _pool(ops)
    done = pool.call(n2.address, "moves_done")
    pool.close()
    files = [d for d in done if d.get("mode") == "files"]
    assert files and all(d["copy"]["path"] == "tls-userspace" for d in files), done


def test_client_certificate_is_refused_every_node_only_method(pair) -> None:
    n1, n2, ops = pair
    pool = _pool(ops)
    try:
        assert set(NODE_ONLY).isdisjoint(CLIENT_METHODS)
        for method in NODE_ONLY:
            with pytest.raises(BadRequest, match=f"method '{method}' is for nodes only"):
                pool.call(n1.address, method, cache="default", p=0, node="n1", primary="n1")
        # the client methods work on the same connection
        assert pool.call(n1.address, "ping")["id"] == "n1"
    finally:
        pool.close()
    # a peer of the secret mode gets nothing from a TLS node: its HELLO is not TLS
    from nodeharness import TEST_SECRET
    plain = Pool(TEST_SECRET.encode(), role="node")
    with pytest.raises(NodeError):
        plain.call(n1.address, "replicate", cache="default", p=0, key=b"k0", value=b"evil",
                   counter=10 ** 9, prev=0, primary="n1")
    plain.close()
    deadline = time.monotonic() + 5
    while "does not speak TLS 1.3" not in open(n1.log).read() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "does not speak TLS 1.3" in open(n1.log).read()
    with Client([n1.address], tls=ops) as c:
        assert c.get("default", "k0") == b"v0"


def test_foreign_ca_certificates_are_refused(pair, ca, other_ca) -> None:
    n1, n2, ops = pair
    # a client and a node of another cluster's CA that trust this cluster's CA
    mine = os.path.join(ca, "ca.crt")
    for role, name in (("client", "intruder"), ("node", "n1")):
        f = _files(other_ca, name, role)
        pool = _pool(TlsFiles(mine, f.cert, f.key))
        with pytest.raises(AuthFailed, match="does not trust our certificate") as e:
            pool.call(n1.address, "replicate", cache="default", p=0, key=b"k0", value=b"evil",
                      counter=10 ** 9, prev=0, primary="n1")
        assert "\n" not in str(e.value)
        pool.close()
    # ... and a client that trusts the other CA refuses the nodes
    pool = _pool(_files(other_ca, "ops", "client"))
    with pytest.raises(AuthFailed, match="not trusted here"):
        pool.call(n1.address, "ping")
    pool.close()
    deadline = time.monotonic() + 5
    while "not trusted here" not in open(n1.log).read() and time.monotonic() < deadline:
        time.sleep(0.1)
    refused = [ln for ln in open(n1.log) if "stage=auth refused" in ln and "not trusted here" in ln]
    assert len(refused) >= 2
    with Client([n1.address], tls=ops) as c:
        assert c.get("default", "k0") == b"v0"      # the forged replicate did nothing


def test_node_certificate_must_name_the_node_it_claims(pair, ca) -> None:
    n1, n2, ops = pair
    # a genuine node certificate of this CA, for n2, claiming to be n1
    as_n2 = _pool(_files(ca, "n2", "node"))
    try:
        key = _primary_key(as_n2, n1.address, "n2")
        p = partition_of(key.encode(), PARTS)
        with pytest.raises(AuthFailed, match="replicate claims to come from node 'n1', but the caller's "
                                             "certificate names node 'n2'"):
            as_n2.call(n1.address, "replicate", cache="default", p=p, key=key.encode(), value=b"forged",
                       counter=10 ** 9, prev=0, primary="n1")
        for method, arg in NODE_CLAIMS.items():
            with pytest.raises(AuthFailed, match="certificate names node 'n2'"):
                as_n2.call(n1.address, method, **{arg: "n1"})
    finally:
        as_n2.close()
    with Client([n1.address], tls=ops) as c:
        assert c.get("default", key) is None
    # the dialling side checks too: n1's certificate at n1's address is not n2's
    pool = _pool(ops, expect=lambda addr: "n2")
    with pytest.raises(AuthFailed, match="names node 'n1', not 'n2'"):
        pool.call(n1.address, "ping")
    pool.close()


class Tap:
    """A TCP relay that keeps every byte of both directions and can flip one byte of
    the client's stream once ``flip_after`` client bytes have passed."""

    def __init__(self, target: tuple[str, int], flip_after: int | None = None) -> None:
        self.target, self.flip_after = target, flip_after
        self.up: list[bytes] = []
        self.down: list[bytes] = []
        self.flipped = False
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            s = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(c, s, self.up, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(s, c, self.down, False), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket, keep: list[bytes], up: bool) -> None:
        seen = 0
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                keep.append(data)
                if up and self.flip_after is not None and not self.flipped and seen + len(data) > self.flip_after:
                    i = max(0, self.flip_after - seen)
                    data = data[:i] + bytes([data[i] ^ 0x40]) + data[i + 1:]
                    self.flipped = True
                seen += len(data)
                b.sendall(data)
        except OSError:
            pass
        finally:
            for x in (a, b):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


def test_path_sees_no_plaintext_and_cannot_alter_a_request(pair, ca) -> None:
    n1, n2, ops = pair
    files = ops
    pool = _pool(files)
    key = _primary_key(pool, n1.address, "n1")
    pool.close()
    value = secrets.token_hex(64).encode()
    host, port = n1.address.split(":")
    tap = Tap((host, int(port)))
    ch = Channel(tap.address, b"", tls=TlsContexts(files), expect="n1")
    ch.call("put", cache="default", key=key.encode(), value=value, rid=None)
    assert ch.call("get", cache="default", key=key.encode()) == value
    ch.close()
    tap.close()
    wire = b"".join(tap.up) + b"".join(tap.down)
    assert value not in wire and value[:16] not in wire and key.encode() not in wire
    assert b"FY" + bytes([3]) not in wire          # not even a frame header in clear

    # one byte of the request flipped on the path (after the TLS handshake): TLS refuses
    # the record, the connection ends and the put is never applied
    other = secrets.token_hex(64).encode()
    evil = Tap((host, int(port)), flip_after=None)
    ch = Channel(evil.address, b"", tls=TlsContexts(files), expect="n1")
    evil.flip_after = sum(map(len, evil.up)) + 40     # inside the next request's record
    with pytest.raises(NodeError):
        ch.call("put", cache="default", key=key.encode(), value=other, rid=None)
    ch.close()
    evil.close()
    assert evil.flipped
    with Client([n1.address], tls=ops) as c:
        assert c.get("default", key) == value
    assert "bad record mac" in open(n1.log).read().lower() or \
        "changed on the path" in open(n1.log).read()


def test_rotation_without_restart(tmp_path, nodes, ca, other_ca) -> None:
    live = tmp_path / "live"
    live.mkdir()
    first = _files(ca, "n1", "node")
    files = TlsFiles(str(live / "ca.crt"), str(live / "n1.crt"), str(live / "n1.key"))

    def install(f: TlsFiles) -> None:
        for a, b in zip((f.ca, f.cert, f.key), (files.ca, files.cert, files.key)):
            shutil.copy(a, b + ".new")
            os.replace(b + ".new", b)
    install(first)
    n1 = _node(tmp_path, ca, "n1", files).start()
    nodes.append(n1)
    old_ops, new_ops = _files(ca, "ops", "client"), _files(other_ca, "ops", "client")
    pool = _pool(old_ops)
    assert pool.call(n1.address, "ping")["id"] == "n1"
    # the whole setup moves to another CA while the node runs
    install(_files(other_ca, "n1", "node"))

    def works(f: TlsFiles) -> bool:
        p = _pool(f)
        try:
            return p.call(n1.address, "ping")["id"] == "n1"
        except AuthFailed:
            return False
        finally:
            p.close()
    deadline = time.monotonic() + 10
    while not works(new_ops) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert works(new_ops)
    assert not works(old_ops)
    # the connection opened before the rotation keeps working
    assert pool.call(n1.address, "ping")["id"] == "n1"
    pool.close()
    assert "stage=tls reloaded certificate" in open(n1.log).read()


def _start_fails(tmp_path, cfg_text: str) -> str:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(cfg_text)
    r = subprocess.run([sys.executable, "-m", "ferry", "node", "start", "--config", str(cfg), "--id", "n1",
                        "--data", str(tmp_path / "d"), "--listen", "127.0.0.1:1",
                        "--control-plane", "http://127.0.0.1:1"],
                       capture_output=True, text=True, env=env(), cwd=ROOT, timeout=60)
    assert r.returncode != 0
    return r.stderr


def test_tls_config_is_checked(tmp_path, ca) -> None:
    f = _files(ca, "n2", "node")
    with pytest.raises(ConfigError, match="TLS needs all of tls.ca, tls.cert and tls.key; missing tls.key"):
        load_config(None, id="n1", data=str(tmp_path), tls_ca=f.ca, tls_cert=f.cert)
    err = _start_fails(tmp_path, f'[tls]\nca = "{f.ca}"\ncert = "{f.cert}"\nkey = "{f.key}"\n')
    assert "is for node 'n2', not node 'n1'" in err and "ferry certs issue CA_DIR n1 --node" in err
    c = _files(ca, "ops", "client")
    err = _start_fails(tmp_path, f'[tls]\nca = "{c.ca}"\ncert = "{c.cert}"\nkey = "{f.key}"\n')
    assert "does not load" in err or "is for client 'ops'" in err
    err = _start_fails(tmp_path, f'[tls]\nca = "{f.ca}"\ncert = "{tmp_path}/none.crt"\nkey = "{f.key}"\n')
    assert "none.crt is not a readable file" in err




def test_certs_cli_issues_node_and_client_certificates(tmp_path) -> None:
    import json as _json

    from click.testing import CliRunner

    from node.etcd_cli import certs
    d = str(tmp_path / "pki")
    r = CliRunner()
    assert r.invoke(certs, ["init", d]).exit_code == 0
    out = r.invoke(certs, ["issue", d, "n1", "--node", "--out", str(tmp_path / "n1")])
    assert out.exit_code == 0, out.output
    out = r.invoke(certs, ["issue", d, "ops", "--client", "--out", str(tmp_path / "ops")])
    assert out.exit_code == 0, out.output
    shown = _json.loads(r.invoke(certs, ["show", str(tmp_path / "n1" / "n1.crt"), "--json"]).output)
    assert shown["ferry_identity"] == "ferry://node/n1" and shown["usages"] == ["clientAuth", "serverAuth"]
    shown = _json.loads(r.invoke(certs, ["show", str(tmp_path / "ops" / "ops.crt"), "--json"]).output)
    assert shown["ferry_identity"] == "ferry://client/ops" and shown["usages"] == ["clientAuth"]
    # refusals: two roles at once; a name that cannot be a node id
    out = r.invoke(certs, ["issue", d, "x", "--node", "--client"])
    assert out.exit_code == 2 and "exclusive" in out.output
    out = r.invoke(certs, ["issue", d, "bad name", "--node"])
    assert out.exit_code == 2 and "must be 1-64 letters" in out.output
    assert "--node" in r.invoke(certs, ["issue", "--help"]).output


def test_cluster_commands_need_all_three_tls_variables(monkeypatch, tmp_path) -> None:
    from node.wire import client_pool, env_tls
    monkeypatch.delenv("FERRY_TLS_CERT", raising=False)
    monkeypatch.delenv("FERRY_TLS_KEY", raising=False)
    monkeypatch.setenv("FERRY_TLS_CA", str(tmp_path / "ca.crt"))
    with pytest.raises(AuthFailed, match=r"\$FERRY_TLS_CERT, \$FERRY_TLS_KEY not set"):
        env_tls()
    with pytest.raises(AuthFailed):
        client_pool(None)


def test_idle_tls_channels_are_reused_and_the_role_comes_from_the_certificate(ca) -> None:
    from node.rpc import RpcServer
    from nodeharness import free_port
    seen: list[tuple[str, str]] = []

    def dispatch(method: str, args: dict[str, Any], role: str) -> Any:
        seen.append((method, role))
        return "pong"
    port = free_port()
    srv = RpcServer(f"127.0.0.1:{port}", b"", dispatch, tls=TlsContexts(_files(ca, "n1", "node")),
                    claims={"replicate": "primary"})
    srv.start()
    try:
        for files, role in ((_files(ca, "ops", "client"), "client"), (_files(ca, "n2", "node"), "node")):
            pool = Pool(b"", role="node", tls=TlsContexts(files))   # the role argument is not a credential
            assert pool.call(f"127.0.0.1:{port}", "ping") == "pong"
            first = pool._free[f"127.0.0.1:{port}"][0]
            assert pool.call(f"127.0.0.1:{port}", "ping") == "pong"
            # no session ticket or other unread record makes the idle channel look closed
            assert pool._free[f"127.0.0.1:{port}"] == [first] and not first.broken
            assert seen[-1] == ("ping", role)
            pool.close()
        as_n2 = Pool(b"", tls=TlsContexts(_files(ca, "n2", "node")))
        with pytest.raises(AuthFailed, match="claims to come from node 'n1'"):
            as_n2.call(f"127.0.0.1:{port}", "replicate", primary="n1")
        assert as_n2.call(f"127.0.0.1:{port}", "replicate", primary="n2") == "pong"
        as_n2.close()
        assert [m for m, _ in seen].count("replicate") == 1
    finally:
        srv.stop()


def test_the_member_a_certificate_must_name_at_an_address() -> None:
    from node.cluster_map import Member
    from node.config import CacheConfig
    m = ClusterMap({"default": CacheConfig()})
    m.members = {"n1": Member("n1", "127.0.0.1:7001", 1), "n2": Member("n2", "127.0.0.1:7002", 2)}
    assert m.member_at("127.0.0.1:7001") == "n1" and m.member_at("127.0.0.1:7999") is None
    # a node restarted under a new id at the old address: the live one
    m.members["n0"] = Member("n0", "127.0.0.1:7002", 0, alive=False)
    assert m.member_at("127.0.0.1:7002") == "n2"
    # two live members at one address (a forged member key): no certificate can match
    m.members["n9"] = Member("n9", "127.0.0.1:7001", 9)
    claim = m.member_at("127.0.0.1:7001")
    assert claim is not None and claim not in ("n1", "n9") and "n1, n9" in claim
