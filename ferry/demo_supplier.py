"""The supplier process of ``ferry demo``: a partition store under a live writer.

Run as ``python -m ferry.demo_supplier`` by :mod:`ferry.demo`. It loads the initial
entries, then serves its partition files with :class:`transfer.SupplierServer` while a
writer thread keeps updating every partition. Updates of partitions a demander has
subscribed to (MOVING there) are forwarded to it, and the write is acknowledged only
once the demander has made it durable in its temp WAL: the role the primary's
replication to MOVING copies plays in a node.

Its control port speaks transfer.frames after the transfer.auth handshake (roles
``demo-control`` and ``demo-replica``); the demo frame types live in
:mod:`ferry.demo_wire`.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sys
import threading
import time

from checkpoint import PartitionStore
from faults import fileio
from transfer import PartitionStoreStorage, SupplierServer
from transfer.auth import load_secret, server_handshake
from transfer.frames import read_frame, write_frame
from transfer.transport import SocketConn

from .demo_wire import DemoFrame, demo_key, demo_value


class Supplier:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.secret = load_secret(args.secret_file)
        self.cache_dir = os.path.join(args.data, "caches", "default")
        self.rng = random.Random(args.seed)
        self.model: dict[bytes, tuple[int, bytes | None]] = {}   # key -> (partition, value)
        self.subscribed: set[int] = set()
        self.replica: SocketConn | None = None
        self.lock = threading.Lock()          # guards subscribed/replica/model
        # held by the writer from a write to its acknowledgement: a SUBSCRIBE answers
        # with a counter every update up to which is already forwarded or in the snapshot
        self.write_lock = threading.Lock()
        self.writing = threading.Event()
        self.stop_writing = threading.Event()
        self.writer_done = threading.Event()
        self.writes = 0
        self.forwarded = 0

    # -- phases ------------------------------------------------------------------------
    def load(self) -> None:
        """Initial load. WAL mode "none" for speed; the checkpoint at close makes it
        durable before anything is acknowledged to the demo."""
        os.makedirs(self.cache_dir, exist_ok=True)
        with open(os.path.join(self.args.data, "node.id"), "w") as f:
            f.write("supplier\n")
        store = PartitionStore.open(self.cache_dir, wal_sync="none")
        for p in range(self.args.partitions):
            store.create_partition(p)
        n, parts = self.args.entries, self.args.partitions
        for i in range(n):
            key = demo_key(i)
            p = i % parts
            value = demo_value(i, 0)
            store.put(p, key, value)
            self.model[key] = (p, value)
            if i % 20000 == 0:
                _say({"event": "loading", "done": i, "total": n})
        store.close()

    def serve(self) -> None:
        self.store = PartitionStore.open(self.cache_dir, wal_sync="group")
        self.server = SupplierServer(PartitionStoreStorage(self.store), self.secret).start()
        ctl = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._accept, args=(ctl,), daemon=True).start()
        threading.Thread(target=self._writer, daemon=True).start()
        fileio.atomic_write(self.args.port_file, json.dumps({
            "transfer_port": self.server.address[1], "control_port": ctl.getsockname()[1],
            "pid": os.getpid()}).encode())
        _say({"event": "serving", "transfer_port": self.server.address[1]})

    # -- connections -------------------------------------------------------------------
    def _accept(self, ctl: socket.socket) -> None:
        while True:
            sock, _ = ctl.accept()
            conn = SocketConn(sock)
            role = server_handshake(conn, self.secret)
            if role == "demo-replica":
                with self.lock:
                    self.replica = conn
            else:
                threading.Thread(target=self._control, args=(conn,), daemon=True).start()

    def _control(self, conn: SocketConn) -> None:
        while True:
            f = read_frame(conn)
            if f.type == DemoFrame.SUBSCRIBE:
                # From here on every update of p is forwarded before it is acknowledged;
                # the DEMAND that follows fixes C after this point (buffer before snapshot).
                # Again before OWNING: every update up to the answered counter has
                # reached the demander by then (the node's second ``register``).
                with self.write_lock, self.lock:
                    self.subscribed.update(f.body["partitions"])
                    c = max(self.store.counter(p) for p in f.body["partitions"])
                write_frame(conn, DemoFrame.OK, {"c": c})
            elif f.type == DemoFrame.START_WRITES:
                self.writing.set()
                write_frame(conn, DemoFrame.OK, {})
            elif f.type == DemoFrame.STOP_WRITES:
                self.stop_writing.set()
                self.writer_done.wait()
                path = os.path.join(self.args.data, "expected.jsonl")
                self._dump_model(path)
                write_frame(conn, DemoFrame.OK, {"writes": self.writes, "forwarded": self.forwarded,
                                                 "expected": path})
            elif f.type == DemoFrame.SHUTDOWN:
                self.server.stop()
                self.store.close()            # final checkpoint
                write_frame(conn, DemoFrame.OK, {})
                os._exit(0)

    # -- the live writer ---------------------------------------------------------------
    def _writer(self) -> None:
        self.writing.wait()
        n, parts = self.args.entries, self.args.partitions
        interval = 1.0 / self.args.rate if self.args.rate > 0 else 0.0
        next_t = time.monotonic()
        while not self.stop_writing.is_set():
            i = self.rng.randrange(int(n * 1.05))          # mostly updates, some inserts
            key, p = demo_key(i), i % parts
            with self.write_lock:
                if self.rng.random() < 0.05:
                    counter, value = self.store.remove(p, key), None
                else:
                    value = demo_value(i, self.writes + 1)
                    counter = self.store.put(p, key, value)
                with self.lock:
                    replica = self.replica if p in self.subscribed else None
                if replica is not None:
                    write_frame(replica, DemoFrame.UPDATE, {"p": p, "k": key, "v": value, "c": counter})
                    read_frame(replica, expect=[DemoFrame.OK])   # durable in the demander's temp WAL
                    self.forwarded += 1
            self.model[key] = (p, value)                     # acknowledged
            self.writes += 1
            if interval:
                next_t += interval
                delay = next_t - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
        self.writer_done.set()

    def _dump_model(self, path: str) -> None:
        lines = []
        for key, (p, value) in self.model.items():
            # value null: the key was removed and must be absent everywhere
            lines.append(json.dumps({"key": key.decode(), "partition": p,
                                     "value": None if value is None else value.decode()}))
        fileio.atomic_write(path, ("\n".join(lines) + "\n").encode())


def _say(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="ferry.demo_supplier")
    ap.add_argument("--data", required=True)
    ap.add_argument("--entries", type=int, required=True)
    ap.add_argument("--partitions", type=int, required=True)
    ap.add_argument("--secret-file", required=True)
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--rate", type=float, default=2000.0, help="writes/s during the move")
    ap.add_argument("--seed", type=int, default=1)
    s = Supplier(ap.parse_args(argv))
    s.load()
    s.serve()
    threading.Event().wait()


if __name__ == "__main__":
    main()
