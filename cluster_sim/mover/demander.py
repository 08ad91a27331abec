"""The mover's demander process: moves ``--partitions`` from the supplier, file-based,
and keeps them as a live copy afterwards; restarts any unfinished move after a crash.

Each move is the node's move engine (:mod:`node.move`: prepare, demand, transfer,
install, index rebuild, replay, checkpoint wait, owning, with the node's crash points),
hosted over the node's storage (``CacheData``) and this process's ports: the durable
state store ``DATA/moves.json`` (``{partition: state}``, atomic rewrite), and the
supplier's sim protocol as the replica feed (SUBSCRIBE on a ``sim-replica``
connection: from then on every update of p is durable in the temp WAL, or applied on
the direct path, before the supplier acknowledges it).

Restart: OWNING copies whose counter equals the supplier's at SUBSCRIBE stay (the
temp WAL opened for the subscription is replayed and deleted); any other copy is stale
and moved again; after an unclean stop the indexes are rebuilt (an index update
follows its data update, a crash can fall between). Prints ``owning all`` when every
partition is OWNING; SIGTERM closes cleanly.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time

from faults import fileio
from node import CacheConfig, IndexConfig, NodeConfig
from node import NodeError
from node.move import Move, MoveContext, MoveEngine
from node import State
from node import CacheData
from transfer import TransferError
from transfer.auth import client_handshake, load_secret
from transfer.frames import read_frame, write_frame
from transfer.transport import Conn, connect_tcp, parse_hostport

from .signals import wait_for_sigterm
from .wire import CACHE, SimFrame

CLEAN = "clean-shutdown"


class Restart(Exception):
    """A replica stream broke: start over from the durable state."""


class MovesFile:
    """The state store: ``DATA/moves.json`` (the harness's driver reads it too)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.states: dict[int, State] = {}
        if os.path.exists(path):
            with open(path) as f:
                self.states = {int(k): State(v) for k, v in json.load(f).items()}

    def get(self, cache: str, p: int) -> State | None:
        return self.states.get(p)

    def set(self, cache: str, p: int, new: State, *, reason: str = "") -> State | None:
        old, self.states[p] = self.states.get(p), new
        doc = {str(k): v.value for k, v in self.states.items()}
        fileio.atomic_write(self.path, json.dumps(doc, sort_keys=True).encode())
        return old


class MoverDemander:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.secret = load_secret(a.secret_file)
        self.parts: list[int] = [int(p) for p in a.partitions.split(",")]
        self.states = MovesFile(os.path.join(a.data, "moves.json"))
        clean = os.path.exists(os.path.join(a.data, CLEAN))
        if clean:
            fileio.layer().unlink(os.path.join(a.data, CLEAN))
        self.data = CacheData(NodeConfig(id="demander", data=a.data, checkpoint_interval_s=0.3),
                              CacheConfig(indexes=(IndexConfig(a.index_name, a.index_field),)),
                              clean=clean)
        self.locks = {p: threading.RLock() for p in self.parts}
        self.moves: dict[int, Move] = {}
        self.replicas: dict[int, Conn] = {}
        self.broken = threading.Event()
        self.stopping = threading.Event()
        self.engine = MoveEngine(MoveContext(
            me="demander", data_dir=a.data, secret=self.secret, data={CACHE: self.data},
            states=self.states, plock=lambda cache, p: self.locks[p], feed=self, locator=self,
            stopping=self.stopping, chunk_size=64 << 10, transfer_timeout=3.0, margin=0,
            retry_s=0.3))

    # -- the engine's ports: the supplier is the primary and the only owner ---------------
    def register(self, primary: str, cache: str, p: int) -> int:
        conn = connect_tcp(*parse_hostport(primary), timeout=10)
        client_handshake(conn, self.secret, role="sim-replica")
        write_frame(conn, SimFrame.SUBSCRIBE, {"p": p})
        c = int(read_frame(conn, expect=[SimFrame.OK]).body["c"])
        conn.set_timeout(None)
        old, self.replicas[p] = self.replicas.get(p), conn
        threading.Thread(target=self._receive, args=(p, conn), daemon=True).start()
        if old is not None:
            old.close()             # the new subscription carries every later update
        return c

    def primary(self, cache: str, p: int) -> tuple[str, str]:
        return "supplier", self.a.control

    def suppliers(self, cache: str, p: int) -> list[tuple[str, str]]:
        return [("supplier", self.a.transfer)]

    def check_files(self, cache: str, p: int) -> None:
        pass

    def _receive(self, p: int, conn: Conn) -> None:
        try:
            while True:
                f = read_frame(conn, expect=[SimFrame.UPDATE])
                with self.locks[p]:
                    self.engine.buffer_update(self.moves[p], f.body["k"], f.body["v"], int(f.body["c"]), None)
                write_frame(conn, SimFrame.ACK, {})
        except Exception as e:  # noqa: BLE001 - any end of the stream means: start over
            if self.replicas.get(p) is conn:
                print(f"replica stream of partition {p} ended: {e!r}", flush=True)
                self.moves[p].gap = f"replica stream of partition {p} ended"
                self.broken.set()

    # -- one partition --------------------------------------------------------------------
    def bring_up(self, p: int) -> None:
        mv = self.moves[p] = Move(CACHE, p, mode="files")
        try:
            if self.states.get(CACHE, p) == State.OWNING:
                if self.engine.resubscribe(mv, self.data):
                    return              # not stale: caught up, on the direct path
                print(f"partition {p} stale (counter {self.data.counter(p)}): moving again", flush=True)
            if not self.engine.run(mv):
                raise Restart(f"the move of partition {p} stopped")
        finally:
            self.engine.finish(mv)
        print(f"partition {p} OWNING", flush=True)

    # -- the process ----------------------------------------------------------------------
    def run(self) -> None:
        while True:
            try:
                for p in self.parts:
                    self.bring_up(p)
                print("owning all", flush=True)
                self.broken.wait()
                raise Restart("replica stream broke")
            except (Restart, NodeError, TransferError, OSError) as e:
                print(f"restarting the moves: {e}", flush=True)
                self.reset()
                time.sleep(0.3)

    def reset(self) -> None:
        replicas, self.replicas = dict(self.replicas), {}
        for conn in replicas.values():
            conn.close()
        self.broken.clear()

    def stop(self, *_: object) -> None:
        self.stopping.set()
        for p in self.parts:
            self.locks[p].acquire()                  # no update half applied at close
        self.data.close()
        fileio.atomic_write(os.path.join(self.a.data, CLEAN), b"1\n")
        print("stopped cleanly", flush=True)
        os._exit(0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="cluster_sim.mover.demander")
    ap.add_argument("--data", required=True)
    ap.add_argument("--secret-file", required=True)
    ap.add_argument("--partitions", required=True, help="comma-separated partitions to move")
    ap.add_argument("--control", required=True, help="supplier's sim control HOST:PORT")
    ap.add_argument("--transfer", required=True, help="supplier's transfer HOST:PORT (or a proxy)")
    ap.add_argument("--index-name", default="by_city")
    ap.add_argument("--index-field", default="city")
    os.makedirs(ap.parse_args(argv).data, exist_ok=True)
    # the engine's stage lines (stage=transfer ... reused=N, stage=owning ...) are the
    # mover's output, in the harness's log of this process
    logging.basicConfig(level=logging.INFO, format="demander: %(message)s", stream=sys.stdout)
    d = MoverDemander(ap.parse_args(argv))
    threading.Thread(target=d.run, daemon=True).start()
    wait_for_sigterm()
    d.stop()


if __name__ == "__main__":
    sys.exit(main())
