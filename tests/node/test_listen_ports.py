"""Ports for processes started later come from below the kernel's ephemeral range,
so an outgoing connection cannot take one between the pick and the listen."""
from __future__ import annotations

import socket

from node import listen_ports


def test_ports_are_below_the_ephemeral_range_and_never_repeated() -> None:
    lo, _ = listen_ports.ephemeral_range()
    ports = [listen_ports.free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(listen_ports.LOWEST <= p < lo for p in ports)


def test_a_port_in_use_is_never_given() -> None:
    held = []
    for _ in range(50):
        s = socket.socket()
        s.bind(("127.0.0.1", listen_ports.free_port()))
        s.listen()
        held.append(s)
    try:
        busy = {s.getsockname()[1] for s in held}
        for _ in range(300):
            p = listen_ports.free_port()
            assert p not in busy
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", p))       # free when given
    finally:
        for s in held:
            s.close()


def test_an_unreadable_range_file_means_linux_defaults(tmp_path) -> None:
    assert listen_ports.ephemeral_range(str(tmp_path / "missing")) == (32768, 60999)
    bad = tmp_path / "range"
    bad.write_text("garbage\n")
    assert listen_ports.ephemeral_range(str(bad)) == (32768, 60999)
    good = tmp_path / "range2"
    good.write_text("40000\t50000\n")
    assert listen_ports.ephemeral_range(str(good)) == (40000, 50000)
