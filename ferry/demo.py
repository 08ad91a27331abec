"""``ferry demo --two-process``: the file-based move of partitions, live, between two
real processes (the default ``ferry demo`` runs a node cluster: ferry/cluster_demo.py).

This mode shows the seed's flow without the node's membership and map machinery,
between two processes on loopback, with the real parts: a supplier process (partition store + checkpointer + zero-copy
supplier agent + a live writer) and this process as the demander, which for each moving
partition

  1. goes MOVING and starts buffering the partition's updates in a temp WAL (wal/);
  2. DEMANDs the file (transfer/, sendfile + copy-on-write pre-images), verifies and
     installs it (checkpoint/);
  3. rebuilds the partition's LMDB index (indexes/) while updates still go only to the
     temp WAL;
  4. replays the temp WAL by update counter while updates keep arriving, and switches
     the partition to the direct path at the tail under a brief lock;
  5. checkpoints, declares OWNING, deletes the temp WAL;

then stops the writer, checks the invariants itself (every moved partition equal to
the supplier's, entry by entry with counters; index equals data; no temp WAL or delta
left) and runs the Spark validation job in local mode against the model of
acknowledged writes.
"""
from __future__ import annotations

import itertools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import click

from .demo_ui import DemoUI, MovesView, MoveRow, move_row, print_summary

MOVE_STAGES = ("buffering", "transfer", "index rebuild", "replay", "checkpoint", "OWNING")


@dataclass
class Move:
    partition: int
    stage: str = "queued"
    bytes: int = 0
    bytes_total: int = 0
    started: float = 0.0
    seconds_to_owning: float | None = None
    buffered: int = 0
    replayed: int = 0
    stage_seconds: dict[str, float] = field(default_factory=dict)


class DemoDemander:
    """The demander side: temp WALs, fetch/install, index rebuild, replay, OWNING."""

    def __init__(self, root: str, secret: bytes, peer_transfer: str, peer_control: tuple[str, int]) -> None:
        from checkpoint import PartitionStore
        from indexes import IndexDefinition, IndexStore

        self.root = root
        self.secret = secret
        self.peer_transfer = peer_transfer
        self.cache_dir = os.path.join(root, "caches", "default")
        os.makedirs(self.cache_dir, exist_ok=True)
        with open(os.path.join(root, "node.id"), "w") as f:
            f.write("demander\n")
        self.store = PartitionStore.open(self.cache_dir, wal_sync="group")
        self.index = IndexStore.open(os.path.join(root, "indexes", "default"),
                                     [IndexDefinition("city", "city")])
        self.tmpwal_dir = os.path.join(root, "tmpwal")
        self.temp_wals: dict[int, object] = {}
        self.direct: set[int] = set()           # partitions switched to the normal path
        self.locks: dict[int, threading.Lock] = {}
        self.moves: dict[int, Move] = {}
        self.control = self._connect(peer_control, "demo-control")
        self._control_lock = threading.Lock()   # one request/response at a time on it
        self.replica = self._connect(peer_control, "demo-replica")
        self._replica_error: BaseException | None = None
        threading.Thread(target=self._receive_updates, daemon=True).start()

    def _connect(self, addr: tuple[str, int], role: str):
        from transfer.auth import client_handshake
        from transfer.transport import connect_tcp
        conn = connect_tcp(*addr, timeout=120)
        client_handshake(conn, self.secret, role=role)
        return conn

    def call(self, ftype: int, body: dict | None = None) -> dict:
        from transfer.frames import read_frame, write_frame
        from .demo_wire import DemoFrame
        # The moves run in threads and share the control connection: without the lock
        # two requests' frames interleaved on the wire ("bad frame magic" on the reply).
        with self._control_lock:
            write_frame(self.control, ftype, body or {})
            return read_frame(self.control, expect=[DemoFrame.OK]).body

    # -- the replication stream: temp WAL while MOVING, direct after the switch --------
    def _receive_updates(self) -> None:
        from transfer.frames import read_frame, write_frame
        from .demo_wire import DemoFrame, encode_update
        try:
            while True:
                f = read_frame(self.replica, expect=[DemoFrame.UPDATE])
                p, key, value, counter = f.body["p"], f.body["k"], f.body["v"], f.body["c"]
                with self.locks[p]:
                    if p in self.direct:
                        self._apply(p, key, value, counter)
                    else:
                        # Durable in the temp WAL before the supplier acknowledges the write.
                        self.temp_wals[p].append(encode_update(key, value, counter))
                        self.moves[p].buffered += 1
                write_frame(self.replica, DemoFrame.OK, {})
        except BaseException as e:  # noqa: BLE001 - latched, re-raised by the move
            self._replica_error = e

    def _apply(self, p: int, key: bytes, value: bytes | None, counter: int) -> bool:
        old = self.store.get(p, key)
        if not self.store.apply(p, key, value, counter):
            return False                          # at or below what p holds: idempotent skip
        self.index.apply(p, key, old, value)
        return True

    # -- one move --------------------------------------------------------------------------
    def move(self, p: int) -> Move:
        from faults import crashpoint
        from transfer import Demander, PartitionStoreStorage
        from wal import Wal
        from .demo_wire import DemoFrame, decode_update

        m = self.moves[p]
        m.started = t = time.monotonic()

        def stage(name: str) -> None:
            nonlocal t
            now = time.monotonic()
            m.stage_seconds[m.stage] = round(now - t, 3)
            m.stage, t = name, now

        stage("buffering")
        self.temp_wals[p] = Wal.open(os.path.join(self.tmpwal_dir, f"part-{p}"), sync="group",
                                     segment_size=16 << 20)
        self.call(DemoFrame.SUBSCRIBE, {"partitions": [p]})
        crashpoint("demander.after_demand")

        stage("transfer")
        def progress(pr) -> None:
            m.bytes, m.bytes_total = pr.done, pr.total
        res = Demander(PartitionStoreStorage(self.store), self.peer_transfer, self.secret).fetch(
            p, progress=progress)
        m.bytes = m.bytes_total = res.bytes
        crashpoint("demander.after_install")

        stage("index rebuild")
        self.index.rebuild(p, self.store)

        stage("replay")
        wal = self.temp_wals[p]
        nxt = 1
        while True:                               # catch up without blocking appends
            if self._replica_error:
                raise self._replica_error
            batch = _read(wal, nxt, 10_000)
            if len(batch) < 64:
                break
            for rec in batch:
                self._apply(p, *decode_update(rec.payload))
            m.replayed += len(batch)
            nxt = batch[-1].lsn + 1
        with self.locks[p]:                       # brief: the last few, then the switch
            tail = _read(wal, nxt, None)
            for rec in tail:
                self._apply(p, *decode_update(rec.payload))
            m.replayed += len(tail)
            self.direct.add(p)

        stage("checkpoint")
        crashpoint("demander.before_owning")
        self.store.checkpoint()                   # covers the install, the replay, the switch
        stage("OWNING")
        m.seconds_to_owning = round(time.monotonic() - m.started, 3)
        crashpoint("demander.after_owning")
        wal.destroy()
        del self.temp_wals[p]
        return m

    def close(self) -> None:
        self.store.close()
        self.index.close()


def _read(wal, lsn: int, limit: int | None) -> list:
    """Up to ``limit`` records from ``lsn`` on (none when the log ends before it)."""
    if wal.last_lsn < lsn:
        return []
    return list(itertools.islice(wal.read_from(lsn), limit))


def _start_supplier(root: str, secret_file: str, entries: int, partitions: int, rate: float,
                    ui: DemoUI) -> tuple[subprocess.Popen, dict]:
    port_file = os.path.join(root, "supplier.ports")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ferry.demo_supplier", "--data", os.path.join(root, "supplier"),
         "--entries", str(entries), "--partitions", str(partitions), "--secret-file", secret_file,
         "--port-file", port_file, "--rate", str(rate)],
        stdout=subprocess.PIPE, text=True)
    with ui.counter("entries loaded", entries) as report:
        for line in proc.stdout:          # loading progress, then "serving"
            ev = json.loads(line)
            if ev["event"] == "loading":
                report(ev["done"])
            elif ev["event"] == "serving":
                report(entries)
                break
    if proc.poll() is not None:
        raise click.ClickException(f"supplier process exited with status {proc.returncode}")
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    with open(port_file) as f:
        return proc, json.load(f)


def run_demo(root: str, *, entries: int, partitions: int, move_every: int, rate: float,
             validate: bool, master: str, ui: DemoUI) -> dict:
    from transfer.auth import load_secret
    from .demo_wire import DemoFrame

    secret_file = os.path.join(root, "cluster.secret")
    fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, secrets.token_hex(32).encode())
    os.close(fd)
    secret = load_secret(secret_file)

    t0 = time.monotonic()
    ui.step(f"starting the supplier process: {entries:,} entries in {partitions} partitions, "
            f"a writer at {rate:,.0f} writes/s")
    proc, ports = _start_supplier(root, secret_file, entries, partitions, rate, ui)
    t_loaded = time.monotonic()
    try:
        dem = DemoDemander(os.path.join(root, "demander"), secret,
                           f"127.0.0.1:{ports['transfer_port']}", ("127.0.0.1", ports["control_port"]))
        moving = [p for p in range(partitions) if p % move_every == 0]
        for p in moving:
            dem.moves[p] = Move(p)
            dem.locks[p] = threading.Lock()
        for p in range(partitions):
            dem.locks.setdefault(p, threading.Lock())
        ui.step(f"moving {len(moving)} partitions to the demander process under live writes")
        dem.call(DemoFrame.START_WRITES)
        t_move = time.monotonic()
        with ui.moves("partitions OWNING") as view:
            stop_progress = threading.Event()
            progress = threading.Thread(target=_show_progress, args=(dem, view, stop_progress),
                                        daemon=True)
            progress.start()
            try:
                with ThreadPoolExecutor(max_workers=2) as pool:       # two moves at a time
                    done = list(pool.map(dem.move, moving))
            finally:
                stop_progress.set()
                progress.join()
            view.update(*_rows(dem))
        move_seconds = time.monotonic() - t_move
        time.sleep(0.5)                                       # writes after OWNING, direct path
        stopped = dem.call(DemoFrame.STOP_WRITES)
        dem.call(DemoFrame.SHUTDOWN)
        proc.wait(timeout=60)
        dem.close()
    except BaseException:
        proc.kill()
        proc.wait()
        raise

    sup_dir = os.path.join(root, "supplier")
    dem_dir = os.path.join(root, "demander")
    ui.step("checking the invariants on both processes' files")
    invariants = check_invariants(sup_dir, dem_dir, moving)
    bytes_moved = sum(m.bytes for m in done)
    summary = {
        "flow": "two-process file move (supplier process -> demander process on loopback)",
        "partitions_moved": len(done),
        "bytes_moved": bytes_moved,
        "mb_per_s": round(bytes_moved / move_seconds / 1e6, 1) if move_seconds else None,
        "move_seconds": round(move_seconds, 2),
        "seconds_to_owning": {str(m.partition): m.seconds_to_owning for m in done},
        "stage_seconds": {str(m.partition): m.stage_seconds for m in done},
        "writes_during_move": stopped["writes"],
        "updates_buffered_in_temp_wal": sum(m.buffered for m in done),
        "updates_replayed": sum(m.replayed for m in done),
        "entries": entries,
        "load_put_seconds": round(t_loaded - t0, 1),
        "load_entries_per_s": round(entries / max(t_loaded - t0, 1e-6)),
        "stages": [st for st in MOVE_STAGES if st != "OWNING"],
        "moves": [move_row(str(m.partition), "supplier", "demander", m.bytes,
                           {k: v for k, v in m.stage_seconds.items() if k in MOVE_STAGES},
                           m.seconds_to_owning, m.buffered, m.replayed) for m in done],
        "invariants": invariants,
        "invariants_ok": all(invariants.values()),
    }
    if validate:
        ui.step(f"running the Spark validation job ({master}) against the model of acknowledged writes")
        from .demo_validate import validate as validate_with_progress
        v = validate_with_progress(ui, [sup_dir, dem_dir], master=master, expected=stopped["expected"],
                                   jvm_log=os.path.join(root, "spark.log"))
        summary["validation"] = {"passed": v["passed"], "partitions_checked": v["partitions_checked"],
                                 "entries": v["entries"], "divergent": v["divergent"],
                                 "expected": v.get("expected"), "seconds": v["seconds"],
                                 "spark_start_seconds": v["spark_start_seconds"]}
    else:
        summary["validation"] = {"passed": None, "skipped": "--no-validate"}
    summary["seconds"] = round(time.monotonic() - t0, 1)
    return summary


def _rows(dem: DemoDemander) -> tuple[list[MoveRow], tuple[int, int]]:
    """The running moves, and (partitions OWNING, partitions to move)."""
    now = time.monotonic()
    rows = []
    for m in list(dem.moves.values()):
        if m.stage in ("queued", "OWNING"):
            continue
        rate = m.bytes / max(now - m.started, 1e-6) if m.stage == "transfer" and m.bytes else None
        eta = (m.bytes_total - m.bytes) / rate if rate and m.bytes_total else None
        rows.append(MoveRow(key=f"partition {m.partition}", stage=m.stage, bytes=m.bytes,
                            bytes_total=m.bytes_total, rate_bps=rate, eta_s=eta))
    owning = sum(m.stage == "OWNING" for m in dem.moves.values())
    return rows, (owning, len(dem.moves))


def _show_progress(dem: DemoDemander, view: MovesView, stop: threading.Event) -> None:
    while not stop.wait(0.25):
        view.update(*_rows(dem))


def check_invariants(sup_dir: str, dem_dir: str, moved: list[int]) -> dict[str, bool]:
    """The demo's own checks, on the files both processes left behind."""
    from checkpoint import PartitionStore, pagefile
    from indexes import IndexDefinition, IndexStore

    sup_cache = os.path.join(sup_dir, "caches", "default")
    dem_cache = os.path.join(dem_dir, "caches", "default")
    same = True
    for p in moved:
        a = {(e.key, e.value, e.counter) for e in pagefile.iter_entries(
            os.path.join(sup_cache, f"part-{p}.bin"), include_tombstones=False)}
        b = {(e.key, e.value, e.counter) for e in pagefile.iter_entries(
            os.path.join(dem_cache, f"part-{p}.bin"), include_tombstones=False)}
        same &= a == b
    store = PartitionStore.open(dem_cache)
    index = IndexStore.open(os.path.join(dem_dir, "indexes", "default"), [IndexDefinition("city", "city")])
    try:
        index_ok = all(index.ready(p) and index.verify(p, store).ok for p in moved)
    finally:
        index.close()
        store.close()
    leftovers = [os.path.join(d, f) for base in (sup_dir, dem_dir) for d, _, fs in os.walk(base)
                 for f in fs if f.endswith((".delta", ".tmp", ".recv", ".partial"))]
    tmpwal = os.path.join(dem_dir, "tmpwal")
    return {
        "moved_partitions_equal_supplier": same,
        "indexes_agree_with_data": index_ok,
        "no_temp_wal_left": not os.path.exists(tmpwal) or not os.listdir(tmpwal),
        "no_delta_or_temp_file_left": not leftovers,
    }


@click.command("demo")
@click.option("--dir", "root", type=click.Path(file_okay=False), default=None,
              help="Work folder (default: a fresh one under ./demo-run/).")
@click.option("--entries", default=200_000, show_default=True, help="Entries loaded before the move.")
@click.option("--partitions", default=16, show_default=True)
@click.option("--nodes", default=3, show_default=True, help="Nodes before the join (cluster mode).")
@click.option("--two-process", is_flag=True,
              help="Instead of the cluster: the bare file move between two processes "
                   "(supplier with a live writer, demander), every stage in plain sight.")
@click.option("--move-every", default=4, show_default=True,
              help="--two-process: move partitions p with p %% N == 0.")
@click.option("--rate", default=2000.0, show_default=True, help="--two-process: live writes/s.")
@click.option("--no-validate", is_flag=True, help="Skip the Spark validation job.")
@click.option("--master", default="local[2]", show_default=True, help="Spark master for validation.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--keep", is_flag=True, help="Keep the work folder.")
def demo(root: str | None, entries: int, partitions: int, nodes: int, two_process: bool,
         move_every: int, rate: float, no_validate: bool, master: str, as_json: bool,
         keep: bool) -> None:
    """Rebalance a live cluster file-based and validate it with Spark.

    Starts 3 node processes on loopback, loads 200,000 indexed entries, adds a 4th node
    and moves its partitions file-based while a writer keeps writing, checks the
    invariants on every node's files and runs the Spark validation job in local mode.
    Exit 0 only when every invariant holds and validation passes."""
    ui = DemoUI(quiet=as_json)
    if root is None:
        os.makedirs("demo-run", exist_ok=True)
        root = tempfile.mkdtemp(prefix="ferry-demo-", dir="demo-run")
    elif os.path.exists(root) and os.listdir(root):
        raise click.ClickException(f"{root} is not empty; give a fresh folder")
    os.makedirs(root, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if two_process:
        summary = run_demo(root, entries=entries, partitions=partitions, move_every=move_every,
                           rate=rate, validate=not no_validate, master=master, ui=ui)
    else:
        from .cluster_demo import run_cluster_demo
        summary = run_cluster_demo(root, entries=entries, partitions=partitions, nodes=nodes,
                                   validate=not no_validate, master=master, ui=ui)
    summary["dir"] = root
    ok = summary["invariants_ok"] and summary["validation"].get("passed") is not False
    if as_json:
        click.echo(json.dumps(summary, indent=None))
    else:
        print_summary(ui, summary)
    if ok and not keep:
        shutil.rmtree(root, ignore_errors=True)
    sys.exit(0 if ok else 1)
