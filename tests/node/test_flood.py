"""Connection floods against a real node process limited to 1,024 descriptors: 1,000
idle connections to its metrics port and 1,000 to its RPC port, from one host, held
past the deadlines, while a client on another host keeps writing over its
connection. The node refuses or closes the flood; every write succeeds, the node's
descriptors and threads stay bounded, its checkpointer keeps checkpointing and never
fails, and other hosts still get new connections (RPC and metrics) meanwhile."""
from __future__ import annotations

import glob
import os
import resource
import selectors
import socket
import threading
import time
import urllib.request

import pytest

from node import Client
from transfer import frames
from transfer.frames import FrameType

from nodeharness import NodeProc, free_port, write_secret

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

NOFILE = 1024
FLOOD = 1000
ATTACKER = "127.0.0.2"       # loopback too, but another peer host than the client's
HOLD_S = 13.0                # past the 10 s handshake and metrics deadlines
CONFIG = """
[checkpoint]
interval_s = 0.5
[[caches]]
name = "default"
partitions = 4
backups = 0
"""


class LimitedNode(NodeProc):
    """A node whose hard (and so soft) RLIMIT_NOFILE is NOFILE."""

    def args(self) -> list[str]:
        return ["prlimit", f"--nofile={NOFILE}:{NOFILE}", "--"] + super().args()


def usage(pid: int) -> tuple[int, int]:
    """(open descriptors, threads) of process ``pid``."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/status") as f:
        threads = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    return fds, threads


def flood(port: int, n: int, hello: bool = False) -> list[socket.socket]:
    """``n`` connections from ATTACKER that send nothing (or only a HELLO), opened
    without waiting: those the backlog cannot take yet connect when it drains."""
    out = []
    for _ in range(n):
        s = socket.socket()
        s.bind((ATTACKER, 0))
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        out.append(s)
    if hello:
        sel = selectors.DefaultSelector()
        for s in out:
            sel.register(s, selectors.EVENT_WRITE)
        deadline = time.monotonic() + 5
        while sel.get_map() and time.monotonic() < deadline:
            for key, _ in sel.select(0.5):
                sel.unregister(key.fileobj)
                try:
                    key.fileobj.send(frames.encode(FrameType.HELLO, {"nonce": os.urandom(32),  # type: ignore[union-attr]
                                                                     "role": "client"}))
                except OSError:
                    pass
        sel.close()
    return out


def closed_by_node(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the node has closed (EOF after any refusal, or a reset).
    The others the node does not hold either, unless its descriptors say so: with
    the accept queue full, the kernel completes a handshake for the client only
    (SYN cookies), and such a connection sits on the client side alone."""
    closed = 0
    for s in socks:
        try:
            while True:
                if not s.recv(65536):
                    closed += 1
                    break
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
    return closed


class Writer(threading.Thread):
    def __init__(self, address: str, secret: str) -> None:
        super().__init__(daemon=True)
        self.client = Client([address], secret_file=secret, timeout=10)
        self.ok = 0
        self.failed: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            try:
                self.client.put("default", f"k{i % 500}", f"v{i}" * 20)
                self.ok += 1
            except Exception as e:
                self.failed.append(f"{type(e).__name__}: {e}")
            i += 1
            time.sleep(0.01)


def part_mtime(data: str) -> float:
    return max(os.stat(p).st_mtime for p in glob.glob(os.path.join(data, "caches", "default", "part-*.bin")))


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def test_flood_of_idle_connections_to_metrics_and_rpc(tmp_path, nodes) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 3 * FLOOD:
        pytest.skip(f"the test process needs {3 * FLOOD} descriptors for its side of the flood")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 3 * FLOOD), hard))
    try:
        socket.create_connection(("127.0.0.1", 1), source_address=(ATTACKER, 0), timeout=1).close()
    except ConnectionRefusedError:
        pass                          # 127.0.0.2 is usable as a source address
    secret = write_secret(str(tmp_path / "secret"))
    cfg = tmp_path / "node.toml"
    cfg.write_text(CONFIG)
    mport = free_port()
    n = LimitedNode(str(tmp_path), "n1", secret, config=str(cfg),
                    extra_args=["--metrics-listen", f"127.0.0.1:{mport}"])
    nodes.append(n)
    n.start()
    assert n.proc is not None
    pid = n.proc.pid
    w = Writer(n.address, secret)
    w.start()
    attack: list[socket.socket] = []
    peak_fds = peak_threads = 0
    try:
        time.sleep(1.0)               # the writer's connection is up and writes flow
        assert w.ok > 0 and not w.failed, w.failed
        base_fds, base_threads = usage(pid)
        before = part_mtime(n.data)
        t0 = time.monotonic()
        attack += flood(mport, FLOOD)
        attack += flood(n.port, FLOOD // 2)
        attack += flood(n.port, FLOOD // 2, hello=True)   # stuck after HELLO
        flooded = time.monotonic()
        other_host_ok = {"rpc": False, "metrics": False}
        while time.monotonic() - flooded < HOLD_S:
            fds, threads = usage(pid)
            peak_fds, peak_threads = max(peak_fds, fds), max(peak_threads, threads)
            if not other_host_ok["rpc"] and time.monotonic() - flooded > 2:
                # a new connection from the client's host authenticates meanwhile
                with Client([n.address], secret_file=secret, timeout=10) as c:
                    c.put("default", "fresh", "connection")
                other_host_ok["rpc"] = True
                other_host_ok["metrics"] = "ferry_node_updates_total" in scrape(mport)
            time.sleep(0.2)
        # the node answered and closed what it refused, and closed at its deadline
        # every idle connection it had accepted
        end_fds, end_threads = usage(pid)
        closed = {"metrics": closed_by_node(attack[:FLOOD]), "rpc": closed_by_node(attack[FLOOD:])}
        after = part_mtime(n.data)
        print(f"flood of {len(attack)} connections for {time.monotonic() - t0:.1f} s: node fds "
              f"{base_fds} -> peak {peak_fds} -> {end_fds} (limit {NOFILE}), threads {base_threads} "
              f"-> peak {peak_threads} -> {end_threads}; {w.ok} writes, {len(w.failed)} failed; "
              f"flood connections the node closed: {closed}")
    finally:
        w.stop.set()
        w.join(15)
        for s in attack:
            s.close()
    assert not w.failed, w.failed[:5]
    assert w.ok > 100
    assert other_host_ok == {"rpc": True, "metrics": True}
    # bounded: the connections the node accepts are capped well below its limit
    assert peak_fds < NOFILE // 2, peak_fds
    assert peak_threads < base_threads + 100, (base_threads, peak_threads)
    # it answered and closed the flood (refused at once, or idle past the deadline) and
    # holds none of it at the end, the attacker's sockets still open
    assert closed["metrics"] >= 0.5 * FLOOD and closed["rpc"] >= 0.5 * FLOOD, closed
    assert end_fds <= base_fds + 8 and end_threads <= base_threads + 4, (base_fds, end_fds, end_threads)
    # the checkpointer wrote partition files during the flood and never failed
    assert after > before
    text = scrape(mport)
    assert "ferry_node_storage_failed{" not in text
    assert "ferry_node_storage_refusals_total{" not in text
    log = open(n.log, errors="replace").read()
    for bad in ("CheckpointError", "Too many open files", "Traceback", "checkpoint failed"):
        assert bad not in log, log[-3000:]
    assert n.stop() == 0
