"""The etcd client's lean HTTP path (node/etcdhttp.py): the same requests and errors
as requests, over kept-alive connections."""
from __future__ import annotations

import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from node import listen_ports
from node.control import Etcd
from node.errors import ControlPlaneDown, ControlPlaneError, LeaseGone
from node.etcdhttp import LeanSession


def test_etcd_calls_go_over_one_kept_connection(etcd) -> None:
    sessions = [c.session for c in etcd._clients]
    assert all(isinstance(s, LeanSession) for s in sessions) and not sessions[0].trust_env
    rev = etcd.put("/t/a", {"x": 1})
    assert etcd.get("/t/a").value == {"x": 1} and etcd.get("/t/a").mod == rev
    ok, _ = etcd.txn([etcd.mod_is("/t/a", rev)], [("/t/b", [1, 2], 0)], ["/t/a"])
    assert ok and etcd.get("/t/a") is None and etcd.get("/t/b").value == [1, 2]
    _, kvs = etcd.range_prefix("/t/")
    assert list(kvs) == ["/t/b"]
    s = sessions[0]
    assert s.fast_posts >= 6
    idle = [c for conns in s._idle.values() for c in conns]
    assert len(idle) == 1                   # one connection served them all, in turn
    lease, ttl = etcd.grant(5)
    assert ttl == 5 and etcd.keepalive(lease) > 0
    etcd.revoke(lease)
    with pytest.raises(LeaseGone):
        etcd.put("/t/c", {"x": 1}, lease=lease)       # etcd's refusal, as before


class _Gateway(BaseHTTPRequestHandler):
    """A stand-in for etcd's gateway: records each request, answers as told."""
    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, dict[str, str], object, int]] = []
    answer: tuple[int, bytes] = (200, b'{"header": {"revision": "7"}}')
    delay = 0.0
    close_after = False
    # one handler per connection: its number names the connection (an id() of the
    # socket could be the same for a new socket once the old one is freed)
    connections = itertools.count()

    def setup(self) -> None:
        super().setup()
        self.number = next(_Gateway.connections)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Gateway.seen.append((self.path, dict(self.headers), json.loads(body), self.number))
        time.sleep(_Gateway.delay)
        status, out = _Gateway.answer
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        if _Gateway.close_after:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        try:
            self.wfile.write(out)
        except OSError:
            pass                            # the client gave up (the timeout case)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def gateway():
    _Gateway.seen = []
    _Gateway.answer = (200, b'{"header": {"revision": "7"}}')
    _Gateway.delay, _Gateway.close_after = 0.0, False
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_the_request_is_what_requests_sends(gateway) -> None:
    e = Etcd([gateway], timeout=2.0)
    e._clients[0].session.headers["Authorization"] = "tok-1"
    assert e.put("/k", {"v": 1}, lease=9) == 7
    path, headers, body, _ = _Gateway.seen[-1]
    assert path == "/v3/kv/put"
    assert headers["Content-Type"] == "application/json" and headers["Authorization"] == "tok-1"
    assert body["lease"] == "9" and json.loads(__import__("base64").b64decode(body["value"])) == {"v": 1}
    # the reference: requests' own path sends the same body and headers
    ref = LeanSession(fast=False)
    ref.trust_env = False
    ref.headers["Authorization"] = "tok-1"
    r = ref.post(f"{gateway}/v3/kv/put", json=body, timeout=2.0)
    rpath, rheaders, rbody, _ = _Gateway.seen[-1]
    assert r.json() == {"header": {"revision": "7"}} and (rpath, rbody) == (path, body)
    for h in ("Content-Type", "Authorization", "Content-Length"):
        assert rheaders[h] == headers[h]


def test_a_connection_the_server_closed_is_not_reused(gateway) -> None:
    e = Etcd([gateway], timeout=2.0)
    e.put("/a", 1)
    e.put("/b", 2)
    assert _Gateway.seen[-1][3] == _Gateway.seen[-2][3]       # kept alive
    _Gateway.close_after = True
    e.put("/c", 3)                                            # the server closes after it
    time.sleep(0.1)
    _Gateway.close_after = False
    e.put("/d", 4)                                            # a new connection, no error
    assert _Gateway.seen[-1][3] != _Gateway.seen[-2][3]
    s = e._clients[0].session
    assert s.fast_posts == 4


def test_errors_map_as_before(gateway) -> None:
    e = Etcd([gateway], timeout=0.3)
    _Gateway.answer = (400, b'{"error": "etcdserver: request is too large", "code": 3}')
    with pytest.raises(ControlPlaneError, match="too large"):
        e.put("/a", 1)
    _Gateway.answer = (503, b'{"error": "etcdserver: no leader"}')
    with pytest.raises(ControlPlaneDown):
        e.put("/a", 1)
    _Gateway.answer = (200, b'{"header": {"revision": "7"}}')
    _Gateway.delay = 1.0
    with pytest.raises(ControlPlaneDown):                     # read timeout
        e.put("/a", 1)
    _Gateway.delay = 0.0
    assert e.put("/a", 1) == 7                                # and working again after it
    port = listen_ports.free_port()                           # nothing listens there
    with pytest.raises(ControlPlaneDown, match="unreachable"):
        Etcd([f"http://127.0.0.1:{port}"], timeout=0.5).put("/a", 1)


def test_https_and_other_forms_take_requests_path(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(requests.Session, "post",
                        lambda self, url, data=None, json=None, **kw: calls.append((url, kw)) or "ref")
    s = LeanSession()
    assert s.post("https://127.0.0.1:1/v3/kv/put", json={}, timeout=1.0) == "ref"
    assert s.post("https://127.0.0.1:1/v3/watch", json={}, stream=True, timeout=(1.0, 3.0)) == "ref"
    assert s.post("http://127.0.0.1:1/v3/kv/put", data=b"{}", timeout=1.0) == "ref"
    assert s.post("http://127.0.0.1:1/v3/kv/put", json={}, timeout=1.0, verify=False) == "ref"
    assert len(calls) == 4 and s.fast_posts == 0


def test_the_watch_streams_over_http_client(etcd) -> None:
    rev = etcd.put("/w/a", {"n": 1})
    s = etcd._clients[0].session
    before = s.fast_posts
    stop = threading.Event()
    got: list[tuple[int, list]] = []

    def watch() -> None:
        for batch in etcd.watch("/w/", rev, stop, idle=1.0):
            got.append(batch)
            if sum(len(evs) for _, evs in got) >= 3:
                stop.set()
    t = threading.Thread(target=watch)
    t.start()
    time.sleep(0.2)
    etcd.put("/w/b", [2])
    etcd.delete("/w/a")
    t.join(10)
    assert not t.is_alive() and s.fast_posts > before
    evs = [(typ, key, kv.value if kv else None) for _, batch in got for typ, key, kv in batch]
    assert evs == [("PUT", "/w/a", {"n": 1}), ("PUT", "/w/b", [2]), ("DELETE", "/w/a", None)]
    assert got[-1][0] > rev
    # a silent stream ends after ``idle`` seconds, without an error: the caller resumes
    t0 = time.monotonic()
    assert list(etcd.watch("/w/", got[-1][0] + 1, threading.Event(), idle=0.5)) == []
    assert time.monotonic() - t0 < 5


def test_a_refused_watch_reads_the_answer(gateway) -> None:
    _Gateway.answer = (401, b'{"error": "etcdserver: user name is empty"}')
    e = Etcd([gateway], timeout=1.0)
    from node.control import ControlPlaneAccessError
    with pytest.raises(ControlPlaneAccessError, match="names no etcd user"):
        list(e.watch("/x/", 1, threading.Event(), idle=1.0))
    assert _Gateway.seen[-1][0] == "/v3/watch"
