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
from typing import TYPE_CHECKING, Any, Callable

import click

from node.move import FILE_STAGES, Move, Stage

from .demo_ui import DemoUI, MovesView, MoveRow, move_row, print_summary, rebalance_rates
from .demo_ui import passed as demo_passed

if TYPE_CHECKING:
    from transfer.transport import Conn

CACHE = "default"

class DemoHost:
    """The ports of the move engine over the demo's two connections to the supplier
    process: ``register`` is SUBSCRIBE on the control connection (the supplier then
    forwards every update of p before acknowledging it), and the one supplier serves
    every file."""

    def __init__(self, call: Callable[[int, dict[str, object]], dict[str, Any]], transfer: str) -> None:
        self.call, self.transfer = call, transfer

    def register(self, primary: str, cache: str, p: int) -> int:
        from .demo_wire import DemoFrame
        return int(self.call(DemoFrame.SUBSCRIBE, {"partitions": [p]})["c"])

    def primary(self, cache: str, p: int) -> tuple[str, str]:
        return "supplier", "control"

    def suppliers(self, cache: str, p: int) -> list[tuple[str, str]]:
        return [("supplier", self.transfer)]

    def check_files(self, cache: str, p: int) -> None:
        pass                                   # one page size on both sides


class DemoDemander:
    """The demander process: the node's move engine over :class:`DemoHost`, the node's
    storage (``CacheData``: data + LMDB index) and state table."""

    def __init__(self, root: str, secret: bytes, peer_transfer: str, peer_control: tuple[str, int]) -> None:
        from node import CacheConfig, CacheData, IndexConfig, NodeConfig, StateTable
        from node.move import MoveContext, MoveEngine

        os.makedirs(root, exist_ok=True)
        with open(os.path.join(root, "node.id"), "w") as f:
            f.write("demander\n")
        self.data = CacheData(NodeConfig(id="demander", data=root),
                              CacheConfig(indexes=(IndexConfig("city", "city"),)))
        self.secret = secret
        self.locks: dict[int, threading.RLock] = {}
        self.moves: dict[int, Move] = {}        # the moves started so far
        self.moving: list[int] = []             # the partitions to move
        self.stopping = threading.Event()
        self.control = self._connect(peer_control, "demo-control")
        self._control_lock = threading.Lock()   # one request/response at a time on it
        self.replica = self._connect(peer_control, "demo-replica")
        host = DemoHost(self.call, peer_transfer)
        self.engine = MoveEngine(MoveContext(
            me="demander", data_dir=root, secret=secret, data={CACHE: self.data},
            states=StateTable(root), plock=lambda cache, p: self.locks[p], feed=host, locator=host,
            stopping=self.stopping))
        threading.Thread(target=self._receive_updates, daemon=True).start()

    def _connect(self, addr: tuple[str, int], role: str) -> Conn:
        from transfer.auth import client_handshake
        from transfer.transport import connect_tcp
        conn = connect_tcp(*addr, timeout=120)
        client_handshake(conn, self.secret, role=role)
        return conn

    def call(self, ftype: int, body: dict[str, object] | None = None) -> dict[str, Any]:
        from transfer.frames import read_frame, write_frame
        from .demo_wire import DemoFrame
        # The moves run in threads and share the control connection: without the lock
        # two requests' frames interleaved on the wire ("bad frame magic" on the reply).
        with self._control_lock:
            write_frame(self.control, ftype, body or {})
            return read_frame(self.control, expect=[DemoFrame.OK]).body

    # -- the replication stream: the engine buffers or applies ---------------------------
    def _receive_updates(self) -> None:
        from transfer.frames import read_frame, write_frame
        from .demo_wire import DemoFrame
        try:
            while True:
                f = read_frame(self.replica, expect=[DemoFrame.UPDATE])
                p = f.body["p"]
                with self.locks[p]:
                    # durable in the temp WAL before the supplier acknowledges the write
                    self.engine.buffer_update(self.moves[p], f.body["k"], f.body["v"], f.body["c"], None)
                write_frame(self.replica, DemoFrame.OK, {})
        except BaseException as e:  # noqa: BLE001 - a broken stream restarts the moves
            for mv in self.moves.values():
                mv.gap = f"replica stream ended: {e!r}"

    def move(self, p: int) -> dict[str, Any]:
        """One move, start to OWNING (the engine's stages), as its summary."""
        mv = self.moves[p] = Move(CACHE, p, mode="files")
        try:
            if not self.engine.run(mv):
                raise click.ClickException(f"the move of partition {p} did not reach OWNING")
        finally:
            self.engine.finish(mv)
        return mv.summary("demander")

    def close(self) -> None:
        self.stopping.set()
        self.data.close()


def _start_supplier(root: str, secret_file: str, entries: int, partitions: int, rate: float,
                    ui: DemoUI) -> tuple[subprocess.Popen, dict]:
    port_file = os.path.join(root, "supplier.ports")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ferry.demo_supplier", "--data", os.path.join(root, "supplier"),
         "--entries", str(entries), "--partitions", str(partitions), "--secret-file", secret_file,
         "--port-file", port_file, "--rate", str(rate)],
        stdout=subprocess.PIPE, text=True)
    out = proc.stdout
    assert out is not None                # stdout=PIPE
    with ui.counter("entries loaded", entries) as report:
        for line in out:                  # loading progress, then "serving"
            ev = json.loads(line)
            if ev["event"] == "loading":
                report(ev["done"])
            elif ev["event"] == "serving":
                report(entries)
                break
    if proc.poll() is not None:
        raise click.ClickException(f"supplier process exited with status {proc.returncode}")
    threading.Thread(target=lambda: [None for _ in out], daemon=True).start()
    with open(port_file) as f:
        return proc, json.load(f)


def run_demo(root: str, *, entries: int, partitions: int, move_every: int, rate: float,
             validate: bool, master: str, ui: DemoUI, raw_mb: int = 0) -> dict:
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
        from .cluster_demo import measure_raw
        raw = measure_raw(ui, root, raw_mb)
        dem = DemoDemander(os.path.join(root, "demander"), secret,
                           f"127.0.0.1:{ports['transfer_port']}", ("127.0.0.1", ports["control_port"]))
        moving = [p for p in range(partitions) if p % move_every == 0]
        for p in range(partitions):
            dem.locks[p] = threading.RLock()
        dem.moving = moving
        ui.step(f"moving {len(moving)} partitions to the demander process under live writes")
        dem.call(DemoFrame.START_WRITES)
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
    stages = [st.value for st in FILE_STAGES]
    rows = [move_row(str(m["partition"]), "supplier", "demander", m["bytes"],
                     {k: v for k, v in m["stage_seconds"].items() if k in stages},
                     m["seconds_to_owning"], m["buffered"], m["replayed"]) for m in done]
    summary = {
        "flow": "two-process file move (supplier process -> demander process on loopback)",
        "partitions_moved": len(done),
        **rebalance_rates(done, rows),
        "raw": raw,
        "seconds_to_owning": {str(m["partition"]): m["seconds_to_owning"] for m in done},
        "stage_seconds": {str(m["partition"]): m["stage_seconds"] for m in done},
        "writes_during_move": stopped["writes"],
        "updates_buffered_in_temp_wal": sum(int(m["buffered"]) for m in done),
        "updates_replayed": sum(int(m["replayed"]) for m in done),
        "entries": entries,
        "load_put_seconds": round(t_loaded - t0, 1),
        "load_entries_per_s": round(entries / max(t_loaded - t0, 1e-6)),
        "stages": stages,
        "moves": rows,
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
        if m.stage == Stage.OWNING:
            continue
        rate = m.bytes / max(now - m.started, 1e-6) if m.stage == Stage.TRANSFER and m.bytes else None
        eta = (m.bytes_total - m.bytes) / rate if rate and m.bytes_total else None
        rows.append(MoveRow(key=f"partition {m.p}", stage=m.stage.value, bytes=m.bytes,
                            bytes_total=m.bytes_total, rate_bps=rate, eta_s=eta))
    owning = sum(m.stage == Stage.OWNING for m in dem.moves.values())
    return rows, (owning, len(dem.moving))


def _show_progress(dem: DemoDemander, view: MovesView, stop: threading.Event) -> None:
    while not stop.wait(0.25):
        view.update(*_rows(dem))


def check_invariants(sup_dir: str, dem_dir: str, moved: list[int]) -> dict[str, bool]:
    """The demo's own checks, on the files both processes left behind."""
    from checkpoint import PartitionStore, pagefile
    from indexes import IndexDefinition, IndexStore
    from node.move import tempwal

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
    return {
        "moved_partitions_equal_supplier": same,
        "indexes_agree_with_data": index_ok,
        "no_temp_wal_left": not tempwal.leftovers(dem_dir),
        "no_delta_or_temp_file_left": not leftovers,
    }


@click.command("demo")
@click.option("--dir", "root", type=click.Path(file_okay=False), default=None,
              help="Work folder (default: a fresh one under ./demo-run/).")
@click.option("--entries", type=int, default=None,
              help="Entries loaded before the move (default: 8,192 of 64 KiB, 512 MB, in the "
                   "cluster; 200,000 with --two-process).")
@click.option("--value-size", type=int, default=None,
              help="Bytes per loaded value (cluster; default 65,536 with the default "
                   "--entries, else 100).")
@click.option("--raw-mb", type=click.IntRange(min=0), default=256, show_default=True,
              help="MB of the raw sendfile over loopback measured beside the moves (0: none).")
@click.option("--no-protect", is_flag=True,
              help="Cluster: turn the nodes' foreground protection off ([rebalance] protect), "
                   "so the moves are not paced while the writer writes.")
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
def demo(root: str | None, entries: int | None, value_size: int | None, raw_mb: int,
         no_protect: bool, partitions: int, nodes: int, two_process: bool, move_every: int, rate: float,
         no_validate: bool, master: str, as_json: bool, keep: bool) -> None:
    """Rebalance a live cluster file-based and validate it with Spark.

    Starts 3 node processes on loopback, loads 512 MB of indexed entries (16 partitions
    of about 32 MB), measures a raw sendfile over loopback, adds a 4th node and moves its
    partitions file-based while a writer keeps writing, validates the running cluster
    with Spark (live mode, the writer still writing), then checks the invariants on
    every node's files and runs the Spark validation job on them. The summary gives
    each move's rate, the whole rebalance's, and the raw rate beside them.
    Exit 0 only when every invariant holds and both validations pass."""
    ui = DemoUI(quiet=as_json)
    if root is None:
        os.makedirs("demo-run", exist_ok=True)
        root = tempfile.mkdtemp(prefix="ferry-demo-", dir="demo-run")
    elif os.path.exists(root) and os.listdir(root):
        raise click.ClickException(f"{root} is not empty; give a fresh folder")
    os.makedirs(root, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if two_process:
        summary = run_demo(root, entries=200_000 if entries is None else entries,
                           partitions=partitions, move_every=move_every, rate=rate,
                           validate=not no_validate, master=master, ui=ui, raw_mb=raw_mb)
    else:
        from .cluster_demo import ENTRIES, VALUE_SIZE, run_cluster_demo
        if value_size is None:
            value_size = VALUE_SIZE if entries is None else 100
        summary = run_cluster_demo(root, entries=ENTRIES if entries is None else entries,
                                   value_size=value_size, partitions=partitions, nodes=nodes,
                                   validate=not no_validate, master=master, ui=ui, raw_mb=raw_mb,
                                   protect=not no_protect)
    summary["dir"] = root
    ok = demo_passed(summary)
    if as_json:
        click.echo(json.dumps(summary, indent=None))
    else:
        print_summary(ui, summary)
    if ok and not keep:
        shutil.rmtree(root, ignore_errors=True)
    sys.exit(0 if ok else 1)
