"""transfer.listener.accept_loop at its edges: a socket closed before the loop starts
(a server stopped at once) ends the loop quietly, and a stop ends a running loop."""
from __future__ import annotations

import logging
import socket
import threading

from transfer.listener import accept_loop

log = logging.getLogger("test.accept")


def test_a_socket_closed_before_the_loop_starts_ends_it_quietly(caplog) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    s.close()
    stop = threading.Event()
    stop.set()
    with caplog.at_level(logging.ERROR):
        accept_loop(s, stop, lambda c, p: None, log=log, name="t")      # no exception
    assert not caplog.records


def test_a_socket_closed_without_a_stop_is_logged_and_ends_the_loop(caplog) -> None:
    s = socket.socket()
    s.close()
    with caplog.at_level(logging.ERROR):
        accept_loop(s, threading.Event(), lambda c, p: None, log=log, name="t")
    assert any("no longer accepting" in r.getMessage() for r in caplog.records)


def test_a_running_loop_serves_then_stops() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    stop = threading.Event()
    peers: list[str] = []

    def handle(conn: socket.socket, peer: str) -> None:
        peers.append(peer)
        conn.close()
    t = threading.Thread(target=accept_loop, args=(s, stop, handle), kwargs={"log": log, "name": "t", "poll": 0.05})
    t.start()
    c = socket.create_connection(s.getsockname())
    c.close()
    for _ in range(100):
        if peers:
            break
        stop.wait(0.02)
    stop.set()
    t.join(5)
    s.close()
    assert peers and not t.is_alive()
