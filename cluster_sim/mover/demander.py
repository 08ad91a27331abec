"""The mover's demander process: moves ``--partitions`` from the supplier, file-based,
and keeps them as a live copy afterwards; restarts any unfinished move after a crash.

Per partition (durable state in ``DATA/moves.json``, atomic rewrite):

  1. MOVING (durable); drop any local data and index of p; a fresh temp WAL;
     SUBSCRIBE on a replica connection: from here every update of p is durable in the
     temp WAL before the supplier acknowledges it (buffer before snapshot)
  2. DEMAND the file (transfer.Demander: sendfile, pre-images, verify, install);
     a cut link is retried and the transfer resumes from the verified chunks
  3. rebuild the partition's LMDB index from the installed file
  4. replay the temp WAL (idempotent by update counter), switch to direct apply at
     the tail under the partition lock
  5. checkpoint, OWNING (durable), delete the temp WAL

Restart: OWNING copies whose counter equals the supplier's at SUBSCRIBE stay (the temp
WAL opened for the subscription is replayed and deleted); any other copy is stale and
moved again; after an unclean stop the indexes of OWNING partitions are rebuilt (an
index update follows its data update, a crash can fall between). Prints ``owning all``
when every partition is OWNING; SIGTERM closes cleanly.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import sys
import threading
import time

import msgpack

from checkpoint import PartitionStore
from faults import crashpoint, fileio
from indexes import IndexDefinition, IndexStore
from transfer import Demander, PartitionStoreStorage, TransferError
from transfer.auth import client_handshake, load_secret
from transfer.frames import read_frame, write_frame
from transfer.transport import connect_tcp, parse_hostport
from wal import Wal, WalError

from .signals import wait_for_sigterm
from .wire import SimFrame

CLEAN = "clean-shutdown"


class Restart(Exception):
    """The supplier went away: start over from the durable state."""


class MoverDemander:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.secret = load_secret(a.secret_file)
        self.parts: list[int] = [int(p) for p in a.partitions.split(",")]
        self.states_path = os.path.join(a.data, "moves.json")
        self.states: dict[int, str] = {}
        if os.path.exists(self.states_path):
            with open(self.states_path) as f:
                self.states = {int(k): v for k, v in json.load(f).items()}
        clean = os.path.exists(os.path.join(a.data, CLEAN))
        if clean:
            fileio.layer().unlink(os.path.join(a.data, CLEAN))
        self.store = PartitionStore.open(os.path.join(a.data, "caches", "default"),
                                         wal_sync="group", checkpoint_interval=0.3)
        self.index = IndexStore.open(os.path.join(a.data, "indexes", "default"),
                                     [IndexDefinition(a.index_name, a.index_field)])
        self.tmpwal_dir = os.path.join(a.data, "tmpwal")
        self.locks = {p: threading.Lock() for p in self.parts}
        self.direct: set[int] = set()
        self.temp: dict[int, Wal] = {}
        self.replicas: dict[int, object] = {}
        self.broken = threading.Event()
        if not clean:
            for p, s in self.states.items():
                if s == "OWNING" and p in self.store.partitions():
                    self.index.rebuild(p, self.store)

    def set_state(self, p: int, state: str) -> None:
        self.states[p] = state
        fileio.atomic_write(self.states_path, json.dumps(self.states, sort_keys=True).encode())

    # -- the replication stream ----------------------------------------------------------
    def subscribe(self, p: int) -> int:
        conn = connect_tcp(*parse_hostport(self.a.control), timeout=10)
        client_handshake(conn, self.secret, role="sim-replica")
        write_frame(conn, SimFrame.SUBSCRIBE, {"p": p})
        c = int(read_frame(conn, expect=[SimFrame.OK]).body["c"])
        conn.set_timeout(None)
        self.replicas[p] = conn
        threading.Thread(target=self._receive, args=(p, conn), daemon=True).start()
        return c

    def _receive(self, p: int, conn: object) -> None:
        try:
            while True:
                f = read_frame(conn, expect=[SimFrame.UPDATE])
                key, value, c = f.body["k"], f.body["v"], int(f.body["c"])
                with self.locks[p]:
                    if p in self.direct:
                        self._apply(p, key, value, c)
                    else:       # durable in the temp WAL before the supplier acknowledges
                        self.temp[p].append(msgpack.packb((key, value, c), use_bin_type=True))
                write_frame(conn, SimFrame.ACK, {})
        except Exception as e:  # noqa: BLE001 - any end of the stream means: start over
            print(f"replica stream of partition {p} ended: {e!r}", flush=True)
            self.broken.set()

    def _apply(self, p: int, key: bytes, value: bytes | None, c: int) -> None:
        old = self.store.get(p, key)
        if self.store.apply(p, key, value, c):       # at or below what p holds: skipped
            self.index.apply(p, key, old, value)

    # -- one partition --------------------------------------------------------------------
    def open_temp(self, p: int) -> Wal:
        path = os.path.join(self.tmpwal_dir, f"part-{p}")
        if os.path.exists(path):
            # Its updates are on the supplier, which acknowledged them; a new move or
            # subscription starts a new buffer.
            try:
                Wal.open(path, sync="group").destroy()
            except WalError:
                shutil.rmtree(path)
        os.makedirs(self.tmpwal_dir, exist_ok=True)
        self.temp[p] = Wal.open(path, sync="group", segment_size=4 << 20)
        return self.temp[p]

    def bring_up(self, p: int) -> None:
        wal = self.open_temp(p)
        if self.states.get(p) == "OWNING":
            c = self.subscribe(p)
            if self.store.counter(p) == c:          # not stale: catch up what was buffered
                self._switch(p, wal)
                wal.destroy()
                del self.temp[p]
                return
            print(f"partition {p} stale (counter {self.store.counter(p)}, supplier {c}): moving again", flush=True)
            self.set_state(p, "MOVING")
            self._drop(p)
        else:
            self.set_state(p, "MOVING")
            self._drop(p)
            self.subscribe(p)
        self.move(p, wal)

    def _drop(self, p: int) -> None:
        if p in self.store.partitions():
            self.store.drop_partition(p)
        self.index.drop(p)

    def move(self, p: int, wal: Wal) -> None:
        crashpoint("demander.after_demand")
        self.fetch(p)
        crashpoint("demander.after_install")
        print(f"partition {p} installed", flush=True)
        self.index.rebuild(p, self.store)
        self._switch(p, wal)
        crashpoint("demander.before_owning")
        self.store.checkpoint()                     # covers install, replay and switch
        self.set_state(p, "OWNING")
        crashpoint("demander.after_owning")
        wal.destroy()
        del self.temp[p]
        print(f"partition {p} OWNING", flush=True)

    def fetch(self, p: int) -> None:
        d = Demander(PartitionStoreStorage(self.store), self.a.transfer, self.secret,
                     chunk_size=64 << 10, timeout=3.0, margin=0)
        delay = 0.2
        while True:
            if self.broken.is_set():
                raise Restart("replica stream broke during the transfer")
            try:
                res = d.fetch(p)
                print(f"partition {p} fetched: C={res.counter} wire={res.bytes_wire} "
                      f"reused={res.bytes_reused} preimages={res.preimages}", flush=True)
                return
            except TransferError as e:
                # A cut link or a restarted supplier: try again, the transfer resumes.
                print(f"partition {p} fetch failed ({e}); retrying", flush=True)
                time.sleep(delay)
                delay = min(2.0, delay * 2)

    def _switch(self, p: int, wal: Wal) -> None:
        nxt = 1
        while True:                                  # catch up without blocking appends
            batch = _read(wal, nxt, 256)
            if len(batch) < 16:
                break
            for rec in batch:
                self._apply(p, *msgpack.unpackb(rec.payload, raw=False))
            crashpoint("demander.mid_replay")
            nxt = batch[-1].lsn + 1
        with self.locks[p]:                          # the last few, then the switch
            for rec in _read(wal, nxt, None):
                self._apply(p, *msgpack.unpackb(rec.payload, raw=False))
                crashpoint("demander.mid_replay")
            self.direct.add(p)

    # -- the process ----------------------------------------------------------------------
    def run(self) -> None:
        while True:
            try:
                for p in self.parts:
                    self.bring_up(p)
                print("owning all", flush=True)
                self.broken.wait()
                raise Restart("replica stream broke")
            except (Restart, TransferError, OSError) as e:
                print(f"restarting the moves: {e}", flush=True)
                self.reset()
                time.sleep(0.3)

    def reset(self) -> None:
        for conn in self.replicas.values():
            conn.close()
        self.replicas.clear()
        for p in list(self.temp):
            with self.locks[p]:
                self.temp.pop(p).close()
        self.direct.clear()
        self.broken.clear()

    def stop(self, *_: object) -> None:
        for p in self.parts:
            self.locks[p].acquire()                  # no update half applied at close
        self.store.close()
        self.index.close()
        fileio.atomic_write(os.path.join(self.a.data, CLEAN), b"1\n")
        print("stopped cleanly", flush=True)
        os._exit(0)


def _read(wal: Wal, lsn: int, limit: int | None) -> list:
    if wal.last_lsn < lsn:
        return []
    return list(itertools.islice(wal.read_from(lsn), limit))


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
    d = MoverDemander(ap.parse_args(argv))
    threading.Thread(target=d.run, daemon=True).start()
    wait_for_sigterm()
    d.stop()


if __name__ == "__main__":
    sys.exit(main())
