"""The ``file-move`` driver: the mover's supplier and demander processes
(cluster_sim/mover), the harness as the client, optionally a loopback proxy on the
transfer link so the link can be delayed, cut or stalled mid-transfer."""
from __future__ import annotations

import os
import sys
import time
from typing import Any

from transfer.auth import client_handshake, load_secret
from transfer.frames import read_frame, write_frame
from transfer.transport import connect_tcp

from ..errors import ProcessError, SimError
from ..invariants import Copy, Layout
from ..mover.wire import CACHE, SimFrame
from ..netproxy import Proxy
from ..procs import Proc, free_port
from ..scenario import Event
from ..workload import Op
from .base import Driver

TRANSFER_RATE = 300e3     # bytes/s: slow enough that checkpoints overwrite pages mid-send
CUT_AFTER = 96 << 10      # a "cut" event breaks the link once this much more went down it
HEAL_AFTER = 1.5          # ... and the link heals this long after the cut


class SimClient:
    """One writer's connection to the supplier; reconnects (the supplier may restart)."""

    def __init__(self, port: int, secret: bytes, patience: float = 30.0) -> None:
        self.port, self.secret, self.patience = port, secret, patience
        self.conn: Any = None

    def _connect(self) -> Any:
        deadline = time.monotonic() + self.patience
        while True:
            try:
                conn = connect_tcp("127.0.0.1", self.port, timeout=15)
                client_handshake(conn, self.secret, role="sim-client")
                return conn
            except Exception:  # noqa: BLE001 - the supplier is restarting
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def call(self, op: Op) -> int:
        if self.conn is None:
            self.conn = self._connect()
        try:
            if op.value is None:
                write_frame(self.conn, SimFrame.REMOVE, {"k": op.key})
            else:
                write_frame(self.conn, SimFrame.PUT, {"k": op.key, "v": op.value})
            f = read_frame(self.conn, expect=[SimFrame.OK, SimFrame.FAIL])
        except BaseException:
            self.close()
            raise
        if f.type == SimFrame.FAIL:
            raise SimError(f"supplier refused the write: {f.body['why']}")
        return int(f.body["c"])

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class FileMoveDriver(Driver):
    def setup(self) -> None:
        cache = self.scenario.caches[0]
        self.partitions = cache.partitions
        self.moving = [p for p in range(self.partitions) if p % 2 == 0]
        self.transfer_port, self.control_port = free_port(), free_port()
        self.proxy: Proxy | None = None
        w = self.scenario.workload
        sup = [sys.executable, "-m", "cluster_sim.mover.supplier", "--data", self.data_dir("supplier"),
               "--secret-file", self.secret_file, "--partitions", str(self.partitions),
               "--transfer-port", str(self.transfer_port), "--control-port", str(self.control_port),
               "--preload", str(w.preload), "--value-lo", str(w.value_size[0]),
               "--value-hi", str(w.value_size[1]), "--seed", str(self.seed),
               "--rate", str(TRANSFER_RATE)]
        peer = self.transfer_port
        if self.scenario.proxy:
            self.proxy = Proxy(("127.0.0.1", self.transfer_port)).start()
            peer = self.proxy.port
        idx = cache.indexes[0] if cache.indexes else None
        dem = [sys.executable, "-m", "cluster_sim.mover.demander", "--data", self.data_dir("demander"),
               "--secret-file", self.secret_file, "--partitions", ",".join(map(str, self.moving)),
               "--control", f"127.0.0.1:{self.control_port}", "--transfer", f"127.0.0.1:{peer}"]
        if idx:
            dem += ["--index-name", idx.name, "--index-field", idx.field]
        self.procs = {
            name: Proc(name, argv, os.path.join(self.dir, f"{name}.log"), trace=self.trace,
                       crash=self.crash_for(name), prefix=self.prefix(name))
            for name, argv in (("supplier", sup), ("demander", dem))}
        self.started: set[str] = set()
        from ..workload import preload
        self.model.load(preload(w, self.seed))

    def _start(self, name: str) -> None:
        p = self.procs[name]
        p.start()
        self.started.add(name)
        self.timeline.mark(name, "start" if p.lives == 1 else "restart")
        if name == "supplier":
            try:
                p.wait_for_line("serving", timeout=90)
            except ProcessError:
                if p.self_killed():
                    self.on_crash(name)
                elif "Address already in use" in p.current_life() and p.port_retries < 3:
                    self._new_ports()
                    self._start(name)
                else:
                    raise

    def _new_ports(self) -> None:
        """A port picked at setup was taken before the supplier bound it (free_port()
        releases it, and parallel tests reuse ephemeral ports): pick new ones and start
        the same life again, with its crash plan still armed (as the cluster driver
        does)."""
        p = self.procs["supplier"]
        self.transfer_port, self.control_port = free_port(), free_port()
        p.argv[p.argv.index("--transfer-port") + 1] = str(self.transfer_port)
        p.argv[p.argv.index("--control-port") + 1] = str(self.control_port)
        d = self.procs["demander"]
        d.argv[d.argv.index("--control") + 1] = f"127.0.0.1:{self.control_port}"
        if self.proxy is not None:
            self.proxy.target = ("127.0.0.1", self.transfer_port)
        else:
            d.argv[d.argv.index("--transfer") + 1] = f"127.0.0.1:{self.transfer_port}"
        p.port_retries += 1
        p.lives -= 1
        self.timeline.mark("supplier", "port retry",
                           f"now transfer={self.transfer_port} control={self.control_port}")

    def start(self) -> None:
        self._start("supplier")

    def client(self, writer: int) -> SimClient:
        return SimClient(self.control_port, load_secret(self.secret_file))

    def apply(self, client: SimClient, op: Op) -> None:
        client.call(op)

    def event(self, ev: Event) -> None:
        action, node = ev.action, ev.node
        if action in ("join", "restart"):
            self._start(node)
        elif action == "kill":
            self.procs[node].kill()
        elif action in ("cut", "heal"):
            if self.proxy is None:
                raise SimError(f"scenario {self.scenario.name!r}: {action} needs proxy = true")
            self.proxy.cut_after(CUT_AFTER, HEAL_AFTER) if action == "cut" else self.proxy.heal()
        else:
            raise SimError(f"the file-move driver cannot {action} {node}")

    def restart_after_crash(self, node: str) -> None:
        self._start(node)

    def processes(self) -> dict[str, Proc]:
        return {n: p for n, p in self.procs.items() if n in self.started}

    def _demander_says(self) -> str:
        try:
            with open(self.procs["demander"].log, errors="replace") as f:
                return f.read().rsplit("\n=== life ", 1)[-1]
        except OSError:
            return ""

    def sample(self) -> None:
        import json
        d = self.data_dir("demander")
        states: dict[str, int] = {}
        try:
            with open(os.path.join(d, "moves.json")) as f:
                for s in json.load(f).values():
                    states[s] = states.get(s, 0) + 1
        except (OSError, ValueError):
            pass
        moved = backlog = 0
        for base, _, files in os.walk(d):
            for f in files:
                path = os.path.join(base, f)
                try:
                    size = os.path.getsize(path)
                except OSError:
                    continue
                if "tmpwal" in base:
                    backlog += size
                elif f.startswith("part-") and (f.endswith(".bin") or f.endswith(".ferry-tmp")):
                    moved += size
        self.timeline.sample(acked=self.model.n_acked, states={"demander": states},
                             bytes_moved=moved, backlog=backlog)

    def settled(self) -> bool:
        if set(self.started) != {"supplier", "demander"} or self.restarting():
            return False
        if not all(p.alive() for p in self.procs.values()):
            return False
        text = self._demander_says()
        return "owning all" in text and "restarting the moves" not in text.rsplit("owning all", 1)[-1]

    def stop(self) -> dict[str, int | None]:
        out = {"demander": self.procs["demander"].stop(60) if "demander" in self.started else None,
               "supplier": self.procs["supplier"].stop(60)}
        if self.proxy:
            self.proxy.stop()
        return out

    def kill_all(self) -> None:
        super().kill_all()
        if self.proxy:
            self.proxy.stop()

    def layout(self) -> Layout:
        import json
        sup, dem = self.data_dir("supplier"), self.data_dir("demander")
        copies = [Copy("supplier", sup, CACHE, p, "OWNING") for p in range(self.partitions)]
        try:
            with open(os.path.join(dem, "moves.json")) as f:
                copies += [Copy("demander", dem, CACHE, int(p), s) for p, s in json.load(f).items()]
        except FileNotFoundError:
            pass
        want = {p: 2 if p in self.moving else 1 for p in range(self.partitions)}
        return Layout(copies, self.partitions, want, {"supplier": sup, "demander": dem}, {}, cache=CACHE)
