"""The index store's LMDB layout at many partitions: rebuild, drop and query costs.

One cache, N documents (~60-byte JSON, one int index and one string index: 2N
entries) spread over P partitions, from an in-memory source (no file decoding: the
index's own work). Measured, in this order, on one store:

* ``rebuild_fresh``: ``rebuild(p)`` for p = 0..P-1 into an empty store;
* ``rebuild_again``: every partition rebuilt again, highest first (each one's key
  range then sits between filled ranges: the load cannot append at the end of the
  database);
* ``lookup``: 2,000 ``lookup`` calls of the int index (each seeks every ready
  partition) and 200 ``range`` calls of 100 results;
* ``drop``: ``drop(p)`` of every partition.

Each figure is wall seconds and CPU seconds (``process_time``); LMDB commits fsync,
so the wall time also holds one to three fsyncs per partition.

``--base DIR``: the same run, in the same invocation, of the ``indexes`` package of
another checkout (e.g. ``git archive`` of an earlier commit): the reference. Runs
alternate (here, base, here, base) and the best of each is kept.

Prints ONE JSON object.

    .venv/bin/python bench/index_layout_bench.py [--entries N] [--partitions P] [--base DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CITIES = ["oslo", "lima", "pune", "kyiv", "baku", "doha", "riga", "bern"]


def _timed(fn) -> dict[str, float]:
    w, c = time.perf_counter(), time.process_time()
    fn()
    return {"wall_s": round(time.perf_counter() - w, 3), "cpu_s": round(time.process_time() - c, 3)}


def child(root: str, n: int, parts: int, where: str | None) -> dict:
    sys.path.insert(0, root)
    from indexes import IndexDefinition, IndexStore, MemorySource
    rng = random.Random(7)
    data: dict[int, dict[bytes, bytes]] = {p: {} for p in range(parts)}
    for i in range(n):
        doc = {"age": rng.randrange(100_000), "city": CITIES[i % 8] + str(i % 1000), "i": i}
        data[i % parts][b"user:%09d" % i] = json.dumps(doc).encode()
    src = MemorySource(data)
    d = tempfile.mkdtemp(prefix="ferry-ixlayout-", dir=where)
    out: dict[str, object] = {}
    try:
        s = IndexStore.open(d, [IndexDefinition("age", "age", type="int"),
                                IndexDefinition("city", "city", type="str")])
        out["rebuild_fresh"] = _timed(lambda: [s.rebuild(p, src) for p in range(parts)])
        out["rebuild_again"] = _timed(lambda: [s.rebuild(p, src) for p in reversed(range(parts))])
        ages = [rng.randrange(100_000) for _ in range(2000)]
        out["lookup_2000"] = _timed(lambda: [s.lookup("age", a) for a in ages])
        out["range_200x100"] = _timed(lambda: [s.range("age", a, None, limit=100) for a in ages[:200]])
        out["entries"] = sum(s.entry_count(p) for p in range(parts)) if hasattr(s, "entry_count") else None
        out["drop"] = _timed(lambda: [s.drop(p) for p in range(parts)])
        s.close()
        out["file_mb"] = round(os.path.getsize(os.path.join(d, "data.mdb")) / 1e6, 1)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return out


def _best(a: dict, b: dict) -> dict:
    out = {}
    for k, v in a.items():
        if isinstance(v, dict):
            out[k] = v if v["wall_s"] <= b[k]["wall_s"] else b[k]
        else:
            out[k] = v
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=300_000)
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--base", default=None)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.entries, a.partitions, a.dir)))
        return
    roots = [("here", ROOT)] + ([("base", os.path.abspath(a.base))] if a.base else [])
    runs: dict[str, list[dict]] = {name: [] for name, _ in roots}
    for _ in range(2):
        for name, root in roots:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", root,
                   "--entries", str(a.entries), "--partitions", str(a.partitions)]
            r = subprocess.run(cmd + (["--dir", a.dir] if a.dir else []),
                               capture_output=True, text=True, check=True)
            runs[name].append(json.loads(r.stdout))
    out: dict[str, object] = {"documents": a.entries, "partitions": a.partitions}
    for name, rs in runs.items():
        out[name] = _best(*rs)
    if a.base:
        h, b = out["here"], out["base"]
        out["ratio_here_over_base_wall"] = {k: round(h[k]["wall_s"] / b[k]["wall_s"], 2)  # type: ignore[index]
                                            for k in h if isinstance(h[k], dict)}  # type: ignore[union-attr]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
