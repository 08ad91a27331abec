"""Real multi-node clusters on loopback under a writer: join, SIGKILL + return,
coordinator death, graceful leave. Afterwards every acknowledged write is on every
owner, indexes agree with data, and each partition has B+1 OWNING copies."""
from __future__ import annotations

import json
import threading
import time

import pytest

from node import Client
from node.errors import NodeError
from node.states import read_states

from nodeharness import NodeProc, offline_check, status, wait_settled, write_secret

CONFIG = """
[control_plane]
lease_ttl_s = 2
[[caches]]
name = "default"
partitions = 8
backups = 1
[[caches.indexes]]
name = "by_city"
field = "city"
"""
CITIES = ["oslo", "lima", "pune", "kyiv"]


class Writer(threading.Thread):
    """Puts new keys and removes some acknowledged ones; keeps a model of what was
    acknowledged (``acked``) and of keys whose last operation failed (``unsure``)."""

    def __init__(self, seeds: list[str], secret: str) -> None:
        super().__init__(daemon=True)
        self.client = Client(seeds, secret_file=secret, timeout=60)
        self.acked: dict[bytes, bytes | None] = {}
        self.acks = 0                          # acknowledged operations (acked holds keys)
        self.unsure: set[bytes] = set()
        self.stop_flag = threading.Event()
        self.errors: list[str] = []
        self.i = 0
        self._writing = threading.Event()      # cleared by pause()
        self._writing.set()
        self._op = threading.Lock()            # held for one operation

    def run(self) -> None:
        while not self.stop_flag.is_set():
            with self._op:
                if self._writing.is_set():
                    self.step()
                    continue
            self._writing.wait(0.05)

    def step(self) -> None:
        """One put of a new key, or (every 7th) a remove of an acknowledged one."""
        self.i += 1
        if self.i % 7 == 0 and self.acked:
            key = next(k for k in reversed(list(self.acked)) if self.acked[k] is not None) \
                if any(v is not None for v in self.acked.values()) else None
            if key is None:
                return
            try:
                self.client.remove("default", key)
                self.acked[key] = None
                self.acks += 1
            except NodeError as e:
                self.unsure.add(key)
                self.errors.append(str(e))
            return
        key = f"key-{self.i}".encode()
        value = json.dumps({"i": self.i, "city": CITIES[self.i % 4]}).encode()
        try:
            self.client.put("default", key, value)
            self.acked[key] = value
            self.acks += 1
        except NodeError as e:
            self.unsure.add(key)
            self.errors.append(str(e))

    def pause(self) -> None:
        """No operation after this returns (one in flight has finished) until resume()."""
        self._writing.clear()
        with self._op:
            pass

    def resume(self) -> None:
        self._writing.set()

    def finish(self) -> None:
        self.stop_flag.set()
        self.join(60)


def writes_during(w: Writer, n: int = 30, timeout: float = 60.0) -> None:
    """Let the writer get ``n`` more acknowledgements (proves the cluster serves).
    Counted as operations, not keys: a writer that overwrites a fixed set of keys
    (test_messages_mode's OverWriter) stops adding keys once it has written each."""
    start, deadline = w.acks, time.monotonic() + timeout
    while w.acks < start + n:
        assert time.monotonic() < deadline, f"writer stalled: {w.errors[-3:]}"
        time.sleep(0.1)


def check_model(w: Writer, seeds: list[str], secret: str) -> None:
    with Client(seeds, secret_file=secret) as c:
        for k, v in w.acked.items():
            if k not in w.unsure:
                assert c.get("default", k) == v, k
        for city in CITIES:
            want = sorted(k for k, v in w.acked.items() if k not in w.unsure and v is not None
                          and json.loads(v)["city"] == city)
            got = [k for k in c.lookup("default", "by_city", city) if k not in w.unsure]
            assert got == want, city


@pytest.mark.slow
def test_topology_changes_under_a_writer(tmp_path, nodes):
    secret = write_secret(str(tmp_path / "secret"))
    cfg = tmp_path / "node.toml"
    cfg.write_text(CONFIG)
    n1 = NodeProc(str(tmp_path), "n1", secret, config=str(cfg)).start()
    n2 = NodeProc(str(tmp_path), "n2", secret, config=str(cfg))
    n3 = NodeProc(str(tmp_path), "n3", secret, config=str(cfg))
    nodes += [n1, n2, n3]
    w = Writer([n1.address], secret)
    w.start()
    try:
        writes_during(w)
        n2.start()                                  # join
        wait_settled(n1.address, secret, 2, 1)
        writes_during(w)
        n3.start()                                  # second join
        wait_settled(n1.address, secret, 3, 1)
        writes_during(w)

        n2.kill()                                   # SIGKILL a member ...
        wait_settled(n1.address, secret, 2, 1)
        writes_during(w)
        n2.mark_restart()
        n2.start()                                  # ... and its return
        wait_settled(n1.address, secret, 3, 1)
        writes_during(w)

        n1.kill()                                   # the coordinator dies
        doc = wait_settled(n2.address, secret, 2, 1)
        assert doc["coordinator"] in ("n2", "n3")
        writes_during(w)
        n1.mark_restart()
        n1.start()                                  # it returns (finds the cluster itself)
        doc = wait_settled(n2.address, secret, 3, 1)
        writes_during(w)

        from node.wire import Pool, load_secret
        Pool(load_secret(secret), role="client").call(n1.address, "leave", node="n3")
        assert n3.proc.wait(120) == 0                # graceful leave, then exit
        doc = wait_settled(n1.address, secret, 2, 1)
        writes_during(w)
    finally:
        w.finish()
        topo = None
        try:
            topo = status(n1.address, secret)
        except Exception:
            pass
    assert len(w.acked) > 200, (len(w.acked), w.errors[-5:])
    check_model(w, [n1.address, n2.address], secret)
    assert topo["topology_version"] >= 8
    for n in nodes:
        assert n.stop() == 0, n.tail()
    data = offline_check([n1.data, n2.data])
    assert sorted(data) == list(range(8))          # every partition has its 2 OWNING copies
    for k, v in w.acked.items():
        if k not in w.unsure:
            from node import partition_of
            assert data[partition_of(k, 8)].get(k) == v
    n3_states = read_states(n3.data)["default"]
    assert set(n3_states.values()) == {"EVICTED"}
