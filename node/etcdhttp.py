"""A lean HTTP transport for etcd's JSON gateway calls (:mod:`node.control`).

``requests`` spends about 0.3 ms of CPU per call on things etcd's gateway does not need
(hooks, cookie jars, header merging, URL and proxy resolution, the adapter and urllib3's
pool): two thirds of an etcd call's cost on the node's side, and every partition move
takes several calls on several nodes; reading the watch's stream through urllib3's
chunked decoder costs as much again. :class:`LeanSession` is a ``requests.Session``
whose plain-``http://`` POSTs go over ``http.client`` instead: kept-alive connections
for calls, a connection of its own for a streamed answer (the watch, read line by
line); everything else (``https://``, other methods) is ``requests`` as before.

The fast path keeps the caller's contract: the same request (method, path, JSON body,
the session's ``Authorization`` header), a ``requests.Response`` with the status,
reason and body, and transport failures raised as ``requests``' own exceptions
(``ConnectTimeout`` / ``ReadTimeout`` for a timeout, ``ConnectionError`` otherwise, the
original as their cause), which ``etcd3gw`` maps to its own as before. Like
``requests`` (no retries), a request is sent once: a failure is the caller's to retry.
A kept connection is reused only when the server has not closed it (checked before
each use, as urllib3 does), and is dropped after a failure or when the answer says
it closes.
"""
from __future__ import annotations

import http.client
import json
import select
import socket
import threading
from typing import Any, Iterator
from urllib.parse import urlsplit

import requests
from requests.structures import CaseInsensitiveDict

from transfer.transport import wait_fd

MAX_IDLE = 16        # kept-alive connections per endpoint (one per concurrent caller)


class LeanSession(requests.Session):
    """See the module doc. ``fast`` False: plain ``requests`` (the reference)."""

    def __init__(self, fast: bool = True) -> None:
        super().__init__()
        self.fast = fast
        self._idle: dict[tuple[str, int], list[http.client.HTTPConnection]] = {}
        self._idle_lock = threading.Lock()
        self.fast_posts = 0          # POSTs sent by the fast path (tests, diagnostics)

    def post(self, url: str | bytes, data: Any = None, json: Any = None,  # type: ignore[override]
             **kwargs: Any) -> requests.Response:
        stream = bool(kwargs.get("stream"))
        if (not self.fast or data is not None or not isinstance(url, str)
                or not url.startswith("http://") or set(kwargs) - {"timeout", "stream"}):
            return super().post(url, data=data, json=json, **kwargs)
        if stream:
            return self._stream(url, json, kwargs.get("timeout"))   # type: ignore[return-value]
        return self._post(url, json, kwargs.get("timeout"))

    # -- the fast path --------------------------------------------------------------
    def _request(self, url: str, doc: Any) -> tuple[str, int, str, bytes, dict[str, str]]:
        u = urlsplit(url)
        host, port = u.hostname or "", u.port or 80
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        body = b"" if doc is None else _dumps(doc)
        headers = {"Content-Type": "application/json", "Accept": "*/*",
                   "Content-Length": str(len(body))}
        auth = self.headers.get("Authorization")
        if auth:
            headers["Authorization"] = str(auth)
        return host, port, path, body, headers

    @staticmethod
    def _connect(host: str, port: int, connect_t: Any) -> http.client.HTTPConnection:
        conn = http.client.HTTPConnection(host, port, timeout=connect_t)
        try:
            conn.connect()
        except (socket.timeout, TimeoutError) as e:
            conn.close()
            raise requests.exceptions.ConnectTimeout(e, request=None) from e
        except OSError as e:
            conn.close()
            raise requests.exceptions.ConnectionError(e, request=None) from e
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _stream(self, url: str, doc: Any, timeout: Any) -> "StreamResponse":
        """A streamed answer (etcd's watch) on a connection of its own: lines as they
        come, each read waiting at most the read timeout."""
        host, port, path, body, headers = self._request(url, doc)
        connect_t, read_t = timeout if isinstance(timeout, tuple) else (timeout, timeout)
        conn = self._connect(host, port, connect_t)
        resp, _ = self._exchange(conn, path, body, headers, read_t, read_body=False)
        self.fast_posts += 1
        return StreamResponse(conn, resp)

    @staticmethod
    def _exchange(conn: http.client.HTTPConnection, path: str, body: bytes, headers: dict[str, str],
                  read_t: Any, *, read_body: bool) -> tuple[http.client.HTTPResponse, bytes]:
        """POST on ``conn`` and read the answer's head (and body when ``read_body``);
        a failure closes ``conn`` and raises as ``requests`` would."""
        try:
            conn.sock.settimeout(read_t)
            conn.request("POST", path, body, headers)
            resp = conn.getresponse()
            return resp, resp.read() if read_body else b""
        except requests.RequestException:
            conn.close()
            raise
        except (socket.timeout, TimeoutError) as e:
            conn.close()
            raise requests.exceptions.ReadTimeout(e, request=None) from e
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise requests.exceptions.ConnectionError(e, request=None) from e

    def _post(self, url: str, doc: Any, timeout: Any) -> requests.Response:
        host, port, path, body, headers = self._request(url, doc)
        connect_t, read_t = timeout if isinstance(timeout, tuple) else (timeout, timeout)
        conn = self._take(host, port)
        if conn is None:
            conn = self._connect(host, port, connect_t)
        resp, content = self._exchange(conn, path, body, headers, read_t, read_body=True)
        if resp.will_close:
            conn.close()
        else:
            self._give(host, port, conn)
        self.fast_posts += 1
        r = requests.Response()
        r.status_code = resp.status
        r.reason = resp.reason
        r.headers = CaseInsensitiveDict(resp.getheaders())
        r._content = content
        r.encoding = "utf-8"
        r.url = url
        return r

    def _take(self, host: str, port: int) -> http.client.HTTPConnection | None:
        """A kept connection the server has not closed, or None."""
        while True:
            with self._idle_lock:
                idle = self._idle.get((host, port))
                if not idle:
                    return None
                conn = idle.pop()
            sock = conn.sock
            try:
                # readable while idle: closed by the server (or junk): not reusable
                dropped = sock is None or wait_fd(sock.fileno(), select.POLLIN, 0)
            except (OSError, ValueError):
                dropped = True
            if not dropped:
                return conn
            conn.close()

    def _give(self, host: str, port: int, conn: http.client.HTTPConnection) -> None:
        with self._idle_lock:
            idle = self._idle.setdefault((host, port), [])
            if len(idle) < MAX_IDLE:
                idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._idle_lock:
            conns = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for c in conns:
            c.close()
        super().close()


class StreamResponse:
    """What the watch reads of a streamed answer: ``status_code``, ``text`` (an
    answer that is not 200), ``iter_lines`` and ``close``. A broken or timed-out read
    raises as ``requests`` would (``ConnectionError``, ``ReadTimeout``: the watch
    resumes from its revision)."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self._conn, self._resp = conn, resp
        self.status_code = resp.status
        self.reason = resp.reason

    @property
    def text(self) -> str:
        try:
            return self._resp.read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException) as e:
            raise requests.exceptions.ConnectionError(e, request=None) from e

    def iter_lines(self, chunk_size: int | None = None) -> Iterator[bytes]:
        """Each line (without its end) as soon as it has arrived whole; the stream's
        end ends it."""
        resp = self._resp
        while True:
            try:
                line = resp.readline()
            except (socket.timeout, TimeoutError) as e:
                raise requests.exceptions.ReadTimeout(e, request=None) from e
            except (OSError, http.client.HTTPException, ValueError) as e:
                raise requests.exceptions.ConnectionError(e, request=None) from e
            if not line:
                return
            yield line.rstrip(b"\r\n")

    def close(self) -> None:
        self._resp.close()
        self._conn.close()


def _dumps(doc: Any) -> bytes:
    # as requests encodes a json= body (allow_nan=False: a NaN is no JSON)
    return json.dumps(doc, allow_nan=False).encode("utf-8")


__all__ = ["LeanSession", "StreamResponse", "MAX_IDLE"]
