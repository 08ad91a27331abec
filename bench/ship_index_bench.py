"""The shipped index against a rebuild, in one process, for one partition: what the
``index rebuild`` stage of a files move costs either way (``[rebalance]
index_transfer``), without the cluster around it.

One partition of N entries (JSON values of V bytes with a ``city`` field, the
localcluster's documents, one index) in a real PartitionStore and a real LMDB index
store; then, alternating R times:

- ``export``: the supplier's read of the partition's entries in one transaction
  (what runs under the partition lock) and its paging (``indexes.shipped``);
- ``ship``: the demander's checks and load of those pages (``node.move.ship.
  index_shipped``: header, digest, samples against the partition's file, the load,
  the ready marker) into a fresh index store;
- ``rebuild``: ``IndexStore.rebuild`` from the partition's file into a fresh index
  store (the move's default: ``PartitionFileSource(verified=True)``).

Wall seconds and CPU seconds of this process for each; prints ONE JSON object.

    .venv/bin/python bench/ship_index_bench.py --entries 1048576 --value-size 256 --repeat 3
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
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from checkpoint import PartitionStore  # noqa: E402
from ferry.localcluster import value_of  # noqa: E402
from indexes import IndexDefinition, IndexStore, PartitionFileSource  # noqa: E402
from indexes.shipped import export  # noqa: E402
from node.move.ship import index_shipped, live_docs  # noqa: E402

P = 3


class Data:
    def __init__(self, store: PartitionStore, indexes: IndexStore) -> None:
        self.store, self.indexes = store, indexes

    def counter(self, p: int) -> int:
        return int(self.store.counter(p))


class Supply:
    def __init__(self, shot: Any) -> None:
        self.shot = shot

    def want(self, supplier: str, cache: str, p: int, below: int = 0) -> bool:
        return True

    def page(self, supplier: str, cache: str, p: int, counter: int, page: int
             ) -> tuple[dict[str, object], bytes]:
        return self.shot.header.to_wire(), (self.shot.pages[page] if self.shot.pages else b"")


def timed(fn: Any) -> tuple[Any, float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=262144)
    ap.add_argument("--value-size", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="ferry-ship-index-bench-")
    defs = [IndexDefinition("by_city", "city")]
    try:
        store = PartitionStore.open(os.path.join(root, "data"), wal_sync="none",
                                    checkpoint_interval=None)
        store.create_partition(P)
        n, step = args.entries, 8192
        for i in range(0, n, step):
            c = store.counter(P)
            store.apply_many(P, [(b"key-%010d" % j, value_of(j, args.value_size), c + 1 + j - i)
                                 for j in range(i, min(n, i + step))], logged=False)
        store.checkpoint()
        supplier = IndexStore.open(os.path.join(root, "ix-supplier"), defs)
        supplier.rebuild(P, PartitionFileSource(store.partition_path(P)))
        docs = live_docs(store, P) or 0
        runs: dict[str, list[dict[str, float]]] = {"export": [], "ship": [], "rebuild": []}
        for r in range(args.repeat):
            shot, w, c = timed(lambda: export(supplier, P, store.counter(P), docs))
            runs["export"].append({"seconds": w, "cpu": c})
            ix = IndexStore.open(os.path.join(root, f"ix-ship-{r}"), defs)
            res, w, c = timed(lambda ix=ix, shot=shot: index_shipped(
                "default", P, Data(store, ix), Supply(shot), "n1", store.counter(P), None,
                lambda: False))
            assert ix.ready(P) and res.entries == shot.header.count
            runs["ship"].append({"seconds": w, "cpu": c})
            ix.close()
            ix = IndexStore.open(os.path.join(root, f"ix-rebuild-{r}"), defs)
            res, w, c = timed(lambda ix=ix: ix.rebuild(P, PartitionFileSource(
                store.partition_path(P), verified=True)))
            runs["rebuild"].append({"seconds": w, "cpu": c})
            ix.close()
        wire = sum(map(len, shot.pages))
        supplier.close()
        store.close()
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    med = {k: {f: round(statistics.median(x[f] for x in v), 3) for f in ("seconds", "cpu")}
           for k, v in runs.items()}
    print(json.dumps({"bench": "ship_index", "entries": args.entries, "value_size": args.value_size,
                      "repeat": args.repeat, "shipped_bytes": wire, "median": med,
                      "runs": {k: [{f: round(x[f], 3) for f in x} for x in v] for k, v in runs.items()},
                      "loadavg": os.getloadavg()}))


if __name__ == "__main__":
    main()
