"""Cost of one partition state change against the size of the node's state table.

A node with N partitions changes their states one at a time (moves, evictions). Per N,
the table is filled with one ``set_many``, then ``changes`` single ``set`` calls are
timed (each is durable on return: real fsyncs, in ``--dir`` or a temp dir), and the
table is opened again (``open_s``). Reported per N: wall ms per change (mean and
max; the max includes a compaction) and bytes written per change (counted by a file
layer that passes every write through).

``--base DIR``: the same measures, in the same run, of the ``node`` package of
another checkout (e.g. ``git archive`` of an earlier commit), in its own process:
the reference. ``--fill``: additionally set N partitions one by one from an empty
table (the whole cost of a node creating N partitions), only for the code here.

Prints ONE JSON object.

    .venv/bin/python bench/states_bench.py [--quick] [--base DIR] [--fill N]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measure(root: str, sizes: list[int], changes: int, where: str | None) -> dict:
    sys.path.insert(0, root)
    from faults import fileio
    from node.states import State, StateTable

    class Counting(fileio.FileLayer):
        def __init__(self) -> None:
            self.bytes = 0

        def write(self, fd: int, data: bytes | memoryview) -> int:
            n = super().write(fd, data)
            self.bytes += n
            return n

        def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
            n = super().pwrite(fd, data, offset)
            self.bytes += n
            return n

    out: dict[str, dict] = {}
    for n in sizes:
        d = tempfile.mkdtemp(prefix="ferry-states-", dir=where)
        try:
            t = StateTable(d)
            t.set_many([("c", p, State.OWNING) for p in range(n)])
            lat = []
            with fileio.use(Counting()) as layer:
                t = StateTable(d)               # files opened under the counting layer
                for i in range(changes):
                    p = (i * 7919) % n
                    t0 = time.perf_counter()
                    t.set("c", p, State.RENTING)
                    lat.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            again = StateTable(d)
            open_s = time.perf_counter() - t0
            assert all(again.get("c", (i * 7919) % n) == State.RENTING for i in range(changes))
            out[str(n)] = {"changes": changes, "ms_per_change": round(1e3 * sum(lat) / changes, 3),
                           "max_ms": round(1e3 * max(lat), 3),
                           "bytes_per_change": round(layer.bytes / changes, 1),
                           "open_s": round(open_s, 3)}
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return out


def fill(n: int, where: str | None) -> dict:
    sys.path.insert(0, ROOT)
    from node.states import State, StateTable
    d = tempfile.mkdtemp(prefix="ferry-states-", dir=where)
    try:
        t = StateTable(d)
        t0 = time.perf_counter()
        for p in range(n):
            t.set("c", p, State.OWNING)
        s = time.perf_counter() - t0
        return {"partitions": n, "seconds": round(s, 2), "ms_per_change": round(1e3 * s / n, 3)}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def child(root: str, sizes: list[int], changes: list[int], where: str | None) -> dict:
    out = {}
    for n, k in zip(sizes, changes):
        out.update(measure(root, [n], k, where))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--base", default=None, help="checkout of the code to compare with")
    ap.add_argument("--fill", type=int, default=0, help="also set N partitions one by one")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    sizes = [1_000, 10_000] if a.quick else [1_000, 10_000, 100_000]
    # The old table rewrites everything per change: fewer changes at 100k keep it short.
    changes = [200, 100] if a.quick else [200, 200, 40]
    if a.child:
        print(json.dumps(child(a.child, sizes, changes, a.dir)))
        return
    out: dict[str, object] = {}
    for name, root in [("here", ROOT)] + ([("base", os.path.abspath(a.base))] if a.base else []):
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", root]
                           + (["--quick"] if a.quick else []) + (["--dir", a.dir] if a.dir else []),
                           capture_output=True, text=True, check=True)
        out[name] = json.loads(r.stdout)
    if a.base:
        out["speedup"] = {n: round(out["base"][n]["ms_per_change"] / out["here"][n]["ms_per_change"], 1)
                          for n in out["here"]}
    if a.fill:
        out["fill"] = fill(a.fill, a.dir)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
