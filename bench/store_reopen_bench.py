"""Two costs of a page store that a returning node's catch-up pays, each against its
reference in the same run:

- **recovery** (``PartitionStore.open`` after a SIGKILL): entering the node WAL at
  ``wal.start`` (checkpoint/walstart.py) against reading every kept segment from its
  start (the same crashed store with the hint removed). The store is made by a child
  process that loads ``--entries`` values into ``--partitions`` partitions (the load
  stays in the kept 64 MiB segment), checkpoints every ``--checkpoint-every`` puts,
  puts ``--after`` more and is SIGKILLed; each round opens a fresh copy of its
  directory.
- **a transfer snapshot's open under writes** (``open_transfer_snapshot``): the flush
  of the one partition against a checkpoint of the whole store (what a snapshot took
  before). Each round changes ``--changed`` keys in every partition, then times either
  way on one partition, taking turns.

Prints ONE JSON object: medians and every round.

    .venv/bin/python bench/store_reopen_bench.py --rounds 5
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from checkpoint import PartitionStore, walstart  # noqa: E402

CHILD = """
import os, sys, random
sys.path.insert(0, {root!r})
from checkpoint import PartitionStore
s = PartitionStore.open({path!r}, checkpoint_interval=None, wal_sync="none")
rnd = random.Random(7)
n = 0
while True:
    p = n % {parts}
    s.put(p, b"k%08d" % rnd.randrange({entries}), rnd.randbytes({value}))
    n += 1
    if n % {every} == 0:
        s.checkpoint()
    if n == {entries} + {after}:
        s.wal.sync()
        print("ready", flush=True)
"""


def crashed_store(root: str, args: argparse.Namespace) -> str:
    path = os.path.join(root, "crashed")
    code = CHILD.format(root=ROOT, path=path, parts=args.partitions, entries=args.entries,
                        value=args.value_size, every=args.checkpoint_every,
                        after=args.after)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise SystemExit("the loading child did not get ready")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    os.sync()
    return path


def recovery_rounds(root: str, path: str, rounds: int) -> dict[str, object]:
    hint = walstart.read(path)
    out: dict[str, list[float]] = {"hint": [], "no_hint": []}
    for i in range(rounds):
        for way in ("hint", "no_hint") if i % 2 == 0 else ("no_hint", "hint"):
            copy = os.path.join(root, "copy")
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(path, copy)
            if way == "no_hint":
                os.unlink(os.path.join(copy, walstart.NAME))
            os.sync()          # the copy's own writes are not the open's to pay
            t0 = time.perf_counter()
            s = PartitionStore.open(copy, checkpoint_interval=None)
            out[way].append(round(time.perf_counter() - t0, 4))
            s.close(checkpoint=False)
    wal_bytes = sum(os.path.getsize(os.path.join(path, "wal", n))
                    for n in os.listdir(os.path.join(path, "wal")) if n.endswith(".wal"))
    return {"wal_bytes_kept": wal_bytes, "hint_lsn": hint.lsn if hint else None,
            "seconds": out, "median_hint": statistics.median(out["hint"]),
            "median_no_hint": statistics.median(out["no_hint"]),
            "no_hint_over_hint": round(statistics.median(out["no_hint"])
                                       / statistics.median(out["hint"]), 2)}


def snapshot_rounds(root: str, args: argparse.Namespace) -> dict[str, object]:
    path = os.path.join(root, "live")
    s = PartitionStore.open(path, checkpoint_interval=None)
    rnd = random.Random(3)
    per = args.entries // args.partitions
    try:
        for i in range(args.entries):
            s.put(i % args.partitions, b"k%08d" % (i // args.partitions), rnd.randbytes(args.value_size))
        s.checkpoint()
        out: dict[str, list[float]] = {"flush": [], "checkpoint": []}
        pages: dict[str, list[int]] = {"flush": [], "checkpoint": []}
        for i in range(2 * args.rounds):
            for p in range(args.partitions):
                for _ in range(args.changed):
                    s.put(p, b"k%08d" % rnd.randrange(per), rnd.randbytes(args.value_size))
            way = ("flush", "checkpoint")[i % 2]
            p = i % args.partitions
            t0 = time.perf_counter()
            if way == "checkpoint":
                st = s.checkpoint()          # the reference: what a snapshot took before
                snap = s.open_transfer_snapshot(p)
                written = st.pages if st else 0
            else:
                dirty = len(s.mem.dirty)
                snap = s.open_transfer_snapshot(p)
                written = dirty - len(s.mem.dirty)
            out[way].append(round(time.perf_counter() - t0, 4))
            pages[way].append(written)
            snap.close()
            s.checkpoint()                   # the next round starts from a clean store
        return {"seconds": out, "pages_written": pages,
                "median_flush": statistics.median(out["flush"]),
                "median_checkpoint": statistics.median(out["checkpoint"]),
                "checkpoint_over_flush": round(statistics.median(out["checkpoint"])
                                               / statistics.median(out["flush"]), 2)}
    finally:
        s.close(checkpoint=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="where the stores go (default: a temp dir)")
    ap.add_argument("--partitions", type=int, default=10)
    ap.add_argument("--entries", type=int, default=50000,
                    help="values loaded (the default's WAL stays in one 64 MiB segment)")
    ap.add_argument("--value-size", type=int, default=1024)
    ap.add_argument("--checkpoint-every", type=int, default=5000)
    ap.add_argument("--after", type=int, default=300,
                    help="puts after the last checkpoint, replayed by recovery")
    ap.add_argument("--changed", type=int, default=50, help="keys changed per partition per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="ferry-reopen-", dir=args.dir)
    try:
        crashed = crashed_store(root, args)
        result = {"partitions": args.partitions, "entries": args.entries,
                  "value_size": args.value_size, "rounds": args.rounds,
                  "recovery": recovery_rounds(root, crashed, args.rounds),
                  "snapshot_open": snapshot_rounds(root, args)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
