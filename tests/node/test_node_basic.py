"""One or two real node processes: data operations, CLI, bad input, restart."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request

import pytest

from node import Client
from node.errors import AuthFailed, BadRequest, TooLarge
from node.wire import Channel, load_secret
from transfer import frames

from nodeharness import NodeProc, env, free_port, write_secret


@pytest.fixture
def one(tmp_path, nodes):
    secret = write_secret(str(tmp_path / "secret"))
    n = NodeProc(str(tmp_path), "n1", secret, partitions=8)
    nodes.append(n)
    n.start()
    yield n
    n.stop()


def test_put_get_remove_and_restart_recovers(one, tmp_path):
    with Client([one.address], secret_file=one.secret) as c:
        for i in range(50):
            assert c.put("default", f"k{i}", f"v{i}") >= 1
        assert c.get("default", "k7") == b"v7"
        c.remove("default", "k7")
        assert c.get("default", "k7") is None
        c.put("default", b"\x00bin", b"\xff\x00")
    assert one.stop() == 0          # SIGTERM: graceful, exit 0
    one.mark_restart()
    one.start()
    with Client([one.address], secret_file=one.secret) as c:
        assert c.get("default", "k3") == b"v3" and c.get("default", "k7") is None
        assert c.get("default", b"\x00bin") == b"\xff\x00"


def test_sigkill_then_restart_keeps_acknowledged_writes(one):
    with Client([one.address], secret_file=one.secret) as c:
        for i in range(30):
            c.put("default", f"k{i}", f"v{i}")
    one.kill()
    one.mark_restart()
    one.start()
    with Client([one.address], secret_file=one.secret) as c:
        assert [c.get("default", f"k{i}") for i in range(30)] == [f"v{i}".encode() for i in range(30)]


def test_cli_put_get_remove_status(one):
    base = [sys.executable, "-m", "ferry", "cluster"]
    opts = ["--seed", one.address, "--secret-file", one.secret]
    run = lambda *a: subprocess.run(base + list(a), capture_output=True, text=True, env=env())  # noqa: E731
    r = run("put", *opts, "hello", "world")
    assert r.returncode == 0 and r.stdout.startswith("ok counter="), r.stderr
    assert run("get", *opts, "hello").stdout.strip() == "world"
    assert run("remove", *opts, "hello").returncode == 0
    assert run("get", *opts, "hello").returncode == 1
    doc = json.loads(run("status", *opts, "--json").stdout)
    assert doc["topology_version"] >= 1
    assert doc["nodes"] == [{"id": "n1", "address": one.address, "alive": True, "leaving": False}]
    assert len(doc["partitions"]) == 8 and all(p["states"] == {"n1": "OWNING"} for p in doc["partitions"])
    assert doc["moves"] == []
    assert "topology version" in run("status", *opts).stdout


def test_wrong_secret_is_refused(one, tmp_path, nodes):
    bad = write_secret(str(tmp_path / "bad"), "b7e2049f1c6a8d35e0f47c2b9a1d6e83")
    with pytest.raises(AuthFailed):
        Client([one.address], secret_file=bad, timeout=2).put("default", "k", "v")
    # and a node with the wrong secret cannot join
    intruder = NodeProc(str(tmp_path), "n9", bad, partitions=8)
    nodes.append(intruder)
    intruder.start(wait=False)
    assert intruder.proc.wait(60) != 0
    assert "secret" in intruder.tail().lower()
    with Client([one.address], secret_file=one.secret) as c:   # still serving
        c.put("default", "k", "v")


def test_malformed_requests_get_error_replies_and_the_node_keeps_serving(one):
    ch = Channel(one.address, load_secret(one.secret), role="client")
    with pytest.raises(BadRequest, match="unknown method"):
        ch.call("format_disk")
    with pytest.raises(BadRequest, match="bad arguments"):
        ch.call("put", cache="default")
    with pytest.raises(BadRequest, match="unknown cache"):
        ch.call("put", cache="nope", key=b"k", value=b"v")
    with pytest.raises(BadRequest, match="bytes or str"):
        ch.call("put", cache="default", key=12, value=b"v")
    with pytest.raises(BadRequest, match="for nodes only"):
        ch.call("replicate", cache="default", p=0, key=b"k", value=b"v", counter=1, prev=0, primary="x")
    # a request body that is not even a map, on the same connection
    frames.write_frame(ch.conn, 64, {"id": "x"})
    assert frames.read_frame(ch.conn).body["e"]["code"] == "bad_request"
    assert ch.call("ping")["id"] == "n1"
    # garbage bytes instead of a frame: that connection is closed, the node goes on
    s = socket.create_connection(("127.0.0.1", one.port))
    s.sendall(b"GET / HTTP/1.0\r\n\r\n" * 10)
    s.close()
    with Client([one.address], secret_file=one.secret) as c:
        c.put("default", "after", "garbage")
        assert c.get("default", "after") == b"garbage"


def test_oversized_keys_and_values_are_refused(one):
    with Client([one.address], secret_file=one.secret) as c:
        with pytest.raises(TooLarge, match="key of 513 bytes"):
            c.put("default", b"k" * 513, b"v")
        with pytest.raises(TooLarge, match="value of"):
            c.put("default", b"k", b"v" * (512 * 1024 + 1))
        c.put("default", b"k" * 512, b"v" * 1000)    # at the limits: fine
        assert c.get("default", b"k" * 512) == b"v" * 1000


def test_second_node_on_the_same_data_dir_refuses(one, tmp_path, nodes):
    twin = NodeProc(str(tmp_path), "n1", one.secret, partitions=8, port=free_port())
    twin.log = str(tmp_path / "twin.log")
    nodes.append(twin)
    twin.start(wait=False)
    assert twin.proc.wait(60) == 2
    assert "in use" in twin.tail()


def test_metrics_endpoint(tmp_path, nodes):
    secret = write_secret(str(tmp_path / "secret"))
    mport = free_port()
    cfg = tmp_path / "node.toml"
    cfg.write_text(f'metrics_listen = "127.0.0.1:{mport}"\n[[caches]]\nname = "default"\npartitions = 4\n')
    n = NodeProc(str(tmp_path), "n1", secret, config=str(cfg))
    nodes.append(n)
    n.start()
    try:
        with Client([n.address], secret_file=secret) as c:
            c.put("default", "a", "b")
        text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10).read().decode()
        assert 'ferry_node_updates_total{cache="default",op="put"} 1' in text
        assert 'ferry_node_partitions{cache="default",state="OWNING"} 4' in text
    finally:
        n.stop()
