"""One delta fetch, its base copied, cloned or handed over: what a returning copy's
catch-up of one partition costs on the file system under ``--dir``.

Two page stores under ``--dir`` (a supplier and a demander, in this process), one
partition of ``--entries`` values of ``--value-size`` bytes fetched whole once; then
``--rounds`` times: ``--changed`` keys spread over the partition are overwritten and
checkpointed on the supplier, and the demander fetches it again (a delta fetch). Rounds
take turns between three ways to get the base: copied byte by byte (``clone_file``
answering "cannot"), cloned (``ioctl(FICLONE)``, where the file system shares extents:
XFS with reflink, btrfs; elsewhere it copies too), and handed over (``adopt``: the
store's file becomes the temp file and the pages are written in place, what a node's
move does). Per round: seconds, this process's CPU seconds, the bytes the device
under ``--dir`` wrote during the fetch (``device_write_bytes``, bench/devio.py), the
bytes this process dirtied (``/proc/self/io`` write_bytes, counted a page-cache folio
at a time: larger than what reached the disk where the kernel uses large folios),
pages sent, and the demander's stage seconds.

Prints ONE JSON object (medians per way, and every round).

    mkfs.xfs -f -m reflink=1 img && mount -o loop img /mnt/x
    .venv/bin/python bench/delta_bench.py --dir /mnt/x --rounds 8
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from checkpoint.store import PartitionStore  # noqa: E402
from devio import device_stat, device_written  # noqa: E402
from transfer import Demander, PartitionStoreStorage, SupplierServer, delta  # noqa: E402

SECRET = b"delta-bench-secret-0123456789abcdef"
P = 3
WAYS = ("copy", "clone", "adopt")


def write_bytes() -> int:
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("write_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="where the two stores go (default: a temp dir)")
    ap.add_argument("--entries", type=int, default=8300)
    ap.add_argument("--value-size", type=int, default=1000)
    ap.add_argument("--changed", type=int, default=50, help="keys changed before each delta fetch")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ferry-delta-bench-", dir=args.dir)
    dev = device_stat(work)
    real_clone = delta.clone_file
    rounds: list[dict[str, object]] = []
    try:
        a = PartitionStore.open(os.path.join(work, "a"), wal_sync="group", checkpoint_interval=None)
        b = PartitionStore.open(os.path.join(work, "b"), wal_sync="group", checkpoint_interval=None)
        srv = SupplierServer(PartitionStoreStorage(a), SECRET).start()
        peer = f"{srv.address[0]}:{srv.address[1]}"
        try:
            for i in range(args.entries):
                a.put(P, b"key-%08d" % i, b"v" * args.value_size)
            a.checkpoint()
            Demander(PartitionStoreStorage(b), peer, SECRET).fetch(P)
            step = max(1, args.entries // max(1, args.changed))
            for rnd in range(args.rounds):
                way = WAYS[rnd % len(WAYS)]
                delta.clone_file = real_clone if way == "clone" else (lambda s, d: False)
                for i in range(rnd % step, args.entries, step):
                    a.put(P, b"key-%08d" % i, b"r%d" % rnd * (args.value_size // 3))
                a.checkpoint()
                os.sync()
                d0 = device_written(dev)
                w0, c0, t0 = write_bytes(), time.process_time(), time.perf_counter()
                r = Demander(PartitionStoreStorage(b), peer, SECRET, adopt=way == "adopt").fetch(P)
                secs, cpu = time.perf_counter() - t0, time.process_time() - c0
                d1 = device_written(dev)
                rounds.append({"way": way, "mode": r.mode, "seconds": round(secs, 4),
                               "cpu_seconds": round(cpu, 4),
                               "device_write_bytes": d1 - d0 if d0 >= 0 and d1 >= 0 else -1,
                               "write_bytes": write_bytes() - w0,
                               "pages": r.pages, "pages_sent": r.pages_sent,
                               "stages": {k: round(v, 4) for k, v in r.stages.items()}})
                print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
        finally:
            delta.clone_file = real_clone
            srv.stop()
            a.close()
            b.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def med(way: str, key: str) -> float:
        return statistics.median(float(r[key]) for r in rounds if r["way"] == way)  # type: ignore[arg-type]
    out: dict[str, object] = {"dir": args.dir, "entries": args.entries, "value_size": args.value_size,
                              "changed": args.changed, "rounds": rounds}
    for way in WAYS:
        if any(r["way"] == way for r in rounds):
            out[way] = {k: med(way, k) for k in ("seconds", "cpu_seconds", "device_write_bytes",
                                                 "write_bytes", "pages_sent")}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
