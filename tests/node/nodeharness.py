"""Real node processes on loopback for the node tests, plus an offline check of the
data dirs after the nodes stopped (every owner equal, indexes agree, B+1 OWNING)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from node.states import read_states  # noqa: E402
from node.listen_ports import free_port  # noqa: E402,F401 (re-exported to the tests)

# One etcd (the control plane) per test, started on first use in the test's folder
# (tests/node/conftest.py resets it around every test).
_ETCD: dict[str, Any] = {"root": None, "cluster": None}


def control_plane() -> list[str]:
    if _ETCD["cluster"] is None:
        from node.etcdserver import EtcdCluster
        import tempfile
        root = _ETCD["root"] or tempfile.mkdtemp(prefix="ferry-etcd-")
        _ETCD["cluster"] = EtcdCluster(root).start()
    return _ETCD["cluster"].endpoints


def etcd() -> Any:
    control_plane()
    return _ETCD["cluster"]


def reset_control_plane(root: str | None) -> None:
    if _ETCD["cluster"] is not None:
        _ETCD["cluster"].stop()
    _ETCD["cluster"], _ETCD["root"] = None, root



# A random constant: load_secret refuses secrets made of words and sequences.
TEST_SECRET = "9d41c7a2e05f3b86d2c94e17a0b5f368"


def write_secret(path: str, text: str = TEST_SECRET) -> str:
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)
    return path


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e.pop("FERRY_CRASH", None)
    e.pop("FERRY_CRASH_TRACE", None)
    e.update(extra or {})
    return e


class NodeProc:
    def __init__(self, base: str, node_id: str, secret: str, *, control_plane: list[str] | None = None,
                 partitions: int = 8, backups: int = 1, config: str | None = None,
                 port: int | None = None, extra_args: list[str] | None = None) -> None:
        self.id = node_id
        self.extra_args = list(extra_args or [])
        self.crash: str | None = None     # FERRY_CRASH for the next start only
        self.data = os.path.join(base, node_id)
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.secret = secret
        self.control_plane = control_plane
        self.partitions, self.backups, self.config = partitions, backups, config
        self.log = os.path.join(base, f"{node_id}.log")
        self.proc: subprocess.Popen[bytes] | None = None

    def args(self) -> list[str]:
        a = [sys.executable, "-m", "ferry", "node", "start", "--id", self.id, "--data", self.data,
             "--listen", self.address, "--secret-file", self.secret]
        if self.config:
            a += ["--config", self.config]
        else:
            a += ["--partitions", str(self.partitions), "--backups", str(self.backups)]
        a += ["--control-plane", ",".join(self.control_plane or control_plane())]
        return a + self.extra_args

    def start(self, wait: bool = True, crash: str | None = None, trace: str | None = None) -> "NodeProc":
        """``crash``: arm a crash point in this process (``"demander.mid_replay:1"``).
        ``trace``: a file the process appends each crash point's name to on its first
        hit (FERRY_CRASH_TRACE), before an armed point kills it."""
        extra: dict[str, str] = {}
        if crash:
            extra["FERRY_CRASH"] = crash
        if trace:
            extra["FERRY_CRASH_TRACE"] = trace
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.args(), stdout=log, stderr=log, env=env(extra), cwd=ROOT)
        if wait:
            self.wait_serving()
        return self

    def wait_serving(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc and self.proc.poll() is not None:
                raise AssertionError(f"node {self.id} exited {self.proc.returncode}:\n{self.tail()}")
            if "serving on" in open(self.log, errors="replace").read().split("=== restart")[-1]:
                return
            time.sleep(0.1)
        raise AssertionError(f"node {self.id} did not start:\n{self.tail()}")

    def tail(self, n: int = 30) -> str:
        try:
            return "".join(open(self.log, errors="replace").readlines()[-n:])
        except OSError:
            return ""

    def mark_restart(self) -> None:
        with open(self.log, "a") as f:
            f.write("\n=== restart\n")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"node {self.id} ignored SIGTERM:\n{self.tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def stop_all(nodes: list[NodeProc], timeout: float = 30.0) -> list[int]:
    """SIGTERM to every node at once, then wait for each: stopped one after another,
    the ones still running would react to each departure (a new controller, moves
    of the leavers' partitions started) while the check of a settled cluster waits."""
    signalled = [n for n in nodes if n.alive()]
    for n in signalled:
        assert n.proc is not None
        n.proc.send_signal(signal.SIGTERM)
    for n in signalled:             # waited, not signalled again: a second SIGTERM that
        assert n.proc is not None   # lands in the interpreter's exit kills it (-15)
        try:
            n.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            n.proc.kill()
            n.proc.wait()
            raise AssertionError(f"node {n.id} ignored SIGTERM:\n{n.tail()}")
    return [n.proc.returncode if n.proc else 0 for n in nodes]


class Nodes(list):
    """Node processes of one test; whatever is still running at the end is killed."""

    def kill_all(self) -> None:
        for n in self:
            n.kill()


def status(seed: str, secret: str) -> dict[str, Any]:
    from node.status import collect
    from node.wire import Pool, load_secret
    pool = Pool(load_secret(secret), role="client")
    try:
        return collect(pool, seed)
    finally:
        pool.close()


def wait_settled(seed: str, secret: str, nodes: int, backups: int, timeout: float = 90.0) -> dict[str, Any]:
    """Until the map shows ``nodes`` live members and every partition with exactly its
    B+1 ideal owners OWNING (and nothing MOVING/RENTING), no move in progress."""
    deadline = time.monotonic() + timeout
    doc: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            doc = status(seed, secret)
        except Exception:
            time.sleep(0.3)
            continue
        live = [n["id"] for n in doc["nodes"] if n["alive"] and not n["leaving"]]
        want = min(backups + 1, len(live))
        ok = len(live) == nodes and not doc["moves"] and all(
            sorted(n for n, s in part["states"].items() if s == "OWNING") == sorted(part["owners"])
            and len(part["owners"]) == want and set(part["states"].values()) == {"OWNING"}
            and part["primary"] == part["owners"][0]
            and sorted(part.get("in_sync", part["owners"])) == sorted(part["owners"])
            for part in doc["partitions"])
        if ok:
            return doc
        time.sleep(0.3)
    raise AssertionError(f"cluster did not settle: {json.dumps(doc)[:3000]}")


def start_pair(tmp_path: Any, nodes: list[NodeProc], config: str) -> tuple[str, str, NodeProc, NodeProc]:
    """n1 and n2 (backups 1) with ``config``, settled; returns (secret, config path, n1, n2)."""
    secret = write_secret(str(tmp_path / "secret"))
    cfg = tmp_path / "node.toml"
    cfg.write_text(config)
    n1 = NodeProc(str(tmp_path), "n1", secret, config=str(cfg)).start()
    n2 = NodeProc(str(tmp_path), "n2", secret, config=str(cfg)).start()
    nodes += [n1, n2]
    wait_settled(n1.address, secret, 2, 1)
    return secret, str(cfg), n1, n2


def offline_check(data_dirs: list[str], cache: str = "default") -> dict[int, dict[bytes, bytes]]:
    """After every node stopped: each OWNING copy of a partition has the same entries
    and counter, its indexes verify against its data. Returns partition -> data."""
    from checkpoint import PartitionStore
    from indexes import IndexStore
    copies: dict[int, list[tuple[str, int, dict[bytes, bytes]]]] = {}
    for d in data_dirs:
        states = read_states(d).get(cache, {})
        store = PartitionStore.open(os.path.join(d, "caches", cache), checkpoint_interval=None)
        idx = IndexStore.open(os.path.join(d, "indexes", cache))
        try:
            for p, s in states.items():
                assert s in ("OWNING", "EVICTED"), f"{d}: partition {p} left {s}"
                if s != "OWNING":
                    continue
                p = int(p)
                # (an index not ready is not trusted: the node rebuilds it from the data
                # before any use - one stopped before it rebuilt what an unclean start
                # left stale)
                if idx.definitions and idx.ready(p):
                    rep = idx.verify(p, store)
                    assert rep.ok, f"{d}: index of partition {p} disagrees with data: {rep}"
                copies.setdefault(p, []).append((d, store.counter(p), dict(store.scan(p))))
        finally:
            idx.close()
            store.close(checkpoint=False)
    out = {}
    for p, cs in copies.items():
        first = cs[0]
        for other in cs[1:]:
            assert other[1:] == first[1:], f"partition {p}: {first[0]} and {other[0]} differ"
        out[p] = first[2]
    return out
