"""The mover's supplier process: the owner (primary) of every partition.

Start-up: open the store (checkpoint + WAL recovery), load the preload entries once
(marker file ``loaded`` written after the checkpoint that makes them durable), serve
files on ``--transfer-port`` and the sim protocol on ``--control-port``, print
``serving``. SIGTERM: close the store (final checkpoint) and exit 0.

The write path (one lock per partition keeps counters and forwarding in order): the
update is made durable here (WAL, group sync), then forwarded to every subscriber of
the partition, then acknowledged. The checkpointer runs every 0.2 s so pages of a
partition being sent are overwritten during the send and pre-images travel.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import threading

from checkpoint import PartitionStore
from faults import fileio
from node import partition_of
from transfer import Limits, PartitionStoreStorage, SupplierServer
from transfer.auth import load_secret, server_handshake
from transfer.errors import TransferError
from transfer.frames import read_frame, write_frame
from transfer.transport import SocketConn

from ..scenario import WorkloadSpec
from ..workload import preload
from .signals import wait_for_sigterm
from .wire import SimFrame

FORWARD_TIMEOUT = 5.0     # a subscriber silent this long is dropped, the write still acked


class MoverSupplier:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.secret = load_secret(a.secret_file)
        self.cache_dir = os.path.join(a.data, "caches", "default")
        self.partitions = a.partitions
        self.locks = [threading.Lock() for _ in range(a.partitions)]
        self.subs: dict[int, list[SocketConn]] = {p: [] for p in range(a.partitions)}

    def load(self) -> None:
        marker = os.path.join(self.a.data, "loaded")
        if os.path.exists(marker):
            return
        os.makedirs(self.cache_dir, exist_ok=True)
        # WAL off for the bulk load; the checkpoint at close makes it durable, and the
        # marker after it says so. A crash before the marker loads again (same values).
        store = PartitionStore.open(self.cache_dir, wal_sync="none", checkpoint_interval=None)
        for p in range(self.partitions):
            if p not in store.partitions():
                store.create_partition(p)
        spec = WorkloadSpec(preload=self.a.preload, value_size=(self.a.value_lo, self.a.value_hi))
        for k, v in preload(spec, self.a.seed):
            store.put(partition_of(k, self.partitions), k, v)
        store.close()
        fileio.atomic_write(marker, b"1\n")

    def serve(self) -> None:
        self.store = PartitionStore.open(self.cache_dir, wal_sync="group", checkpoint_interval=0.2)
        rate = self.a.rate or None
        self.server = SupplierServer(PartitionStoreStorage(self.store), self.secret,
                                     port=self.a.transfer_port, limits=Limits(4, rate=rate)).start()
        ctl = socket.create_server(("127.0.0.1", self.a.control_port))
        threading.Thread(target=self._accept, args=(ctl,), daemon=True).start()
        print(f"serving transfer={self.a.transfer_port} control={self.a.control_port}", flush=True)

    def _accept(self, ctl: socket.socket) -> None:
        while True:
            sock, _ = ctl.accept()
            threading.Thread(target=self._session, args=(SocketConn(sock),), daemon=True).start()

    def _session(self, conn: SocketConn) -> None:
        try:
            role = server_handshake(conn, self.secret)
            if role == "sim-replica":
                self._subscribe(conn)
                return                     # the connection now belongs to the forwarder
            while True:
                f = read_frame(conn, expect=[SimFrame.PUT, SimFrame.REMOVE])
                key = f.body["k"]
                value = f.body.get("v") if f.type == SimFrame.PUT else None
                try:
                    c = self.write(key, value)
                except Exception as e:      # noqa: BLE001 - answered, the harness records it
                    write_frame(conn, SimFrame.FAIL, {"why": repr(e)})
                    continue
                write_frame(conn, SimFrame.OK, {"c": c})
        except (TransferError, OSError):
            conn.close()

    def _subscribe(self, conn: SocketConn) -> None:
        f = read_frame(conn, expect=[SimFrame.SUBSCRIBE])
        p = int(f.body["p"])
        conn.set_timeout(FORWARD_TIMEOUT)
        # Under the partition lock: every update after this counter is forwarded
        # (buffer before snapshot: the DEMAND that follows fixes C at or after it).
        with self.locks[p]:
            self.subs[p].append(conn)
            write_frame(conn, SimFrame.OK, {"c": self.store.counter(p)})

    def write(self, key: bytes, value: bytes | None) -> int:
        p = partition_of(key, self.partitions)
        with self.locks[p]:
            c = self.store.put(p, key, value) if value is not None else self.store.remove(p, key)
            for sub in list(self.subs[p]):
                try:
                    write_frame(sub, SimFrame.UPDATE, {"p": p, "k": key, "v": value, "c": c})
                    read_frame(sub, expect=[SimFrame.ACK])
                except (TransferError, OSError) as e:
                    print(f"subscriber of partition {p} dropped: {e}", flush=True)
                    self.subs[p].remove(sub)
                    sub.close()
            return c

    def stop(self, *_: object) -> None:
        self.server.stop()
        self.store.close()
        print("stopped cleanly", flush=True)
        os._exit(0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="cluster_sim.mover.supplier")
    ap.add_argument("--data", required=True)
    ap.add_argument("--secret-file", required=True)
    ap.add_argument("--partitions", type=int, required=True)
    ap.add_argument("--transfer-port", type=int, required=True)
    ap.add_argument("--control-port", type=int, required=True)
    ap.add_argument("--preload", type=int, default=0)
    ap.add_argument("--value-lo", type=int, default=60)
    ap.add_argument("--value-hi", type=int, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=float, default=0.0, help="transfer bytes/s (0: unlimited)")
    s = MoverSupplier(ap.parse_args(argv))
    s.load()
    s.serve()
    wait_for_sigterm()
    s.stop()


if __name__ == "__main__":
    sys.exit(main())
