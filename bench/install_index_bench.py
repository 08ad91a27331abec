"""CPU of a files move's install and index path on the joining node, per GiB.

One partition file of N documents shaped like the cluster's (ferry/localcluster.py
``value_of``: ``{"i", "city", "pad"}``, one JSON index on ``city``), written the way
the tests write them (tests/indexes/pagegen.py), then per round:

* ``install``: ``PartitionStore.prepare_install`` of a copy of the file (the store's
  install scan: every page's CRC and structure, the key index and space maps);
* ``rebuild``: ``IndexStore.rebuild`` of the installed file as the move does it
  (node/move/rebuild.py: ``PartitionFileSource(path, verified=store.file_checked(p))``,
  in the process), split into ``scan`` (decode + index feed) and ``load`` (sort + LMDB).

CPU seconds (``process_time``) per GiB of file, and rebuild entries per CPU second; the
best of the rounds. ``--base DIR``: the same rounds, alternating, with the code of
another checkout (its own accelerators built in place), for a before/after in one run
on a shared machine. Prints one JSON object, with the 1-minute load average.

    .venv/bin/python bench/install_index_bench.py --value-size 256 --entries 800000
    .venv/bin/python bench/install_index_bench.py --value-size 1024 --base /tmp/before
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
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CITIES = ["Paris", "Lyon", "Berlin", "Tokyo", "Lima", "Oslo", "Cairo", "Quito"]


def value_of(i: int, size: int) -> bytes:
    doc: dict[str, object] = {"i": i, "city": CITIES[i % len(CITIES)]}
    pad = max(0, size - len(json.dumps(doc)) - 10)
    doc["pad"] = "x" * pad
    return json.dumps(doc).encode()


def write_file(path: str, entries: int, value_size: int) -> None:
    sys.path.insert(0, os.path.join(ROOT, "tests", "indexes"))
    from pagegen import write_partition_file
    write_partition_file(path, 3, ((f"key-{i:09d}".encode(), value_of(i, value_size))
                                   for i in range(entries)))


def one_round(src: str, work: str) -> dict[str, float]:
    """One install + rebuild of ``src`` with the code on sys.path (run in a child)."""
    import indexes.rebuild as rb
    from checkpoint import PartitionStore
    from indexes import IndexDefinition, IndexStore, PartitionFileSource

    cpu: dict[str, float] = {"scan": 0.0, "load": 0.0}

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*a: Any, **k: Any) -> Any:
            c = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                cpu[name] += time.process_time() - c
        return run
    rb.scan_partition = timed("scan", rb.scan_partition)
    rb._load = timed("load", rb._load)
    shutil.rmtree(work, ignore_errors=True)
    store = PartitionStore.open(os.path.join(work, "data"), wal_sync="none", checkpoint_interval=None)
    tmp = os.path.join(work, "data", "received.tmp")
    shutil.copyfile(src, tmp)
    c0 = time.process_time()
    prepared = store.prepare_install(3, tmp)
    cpu["install"] = time.process_time() - c0
    store.install_partition(3, tmp, prepared)
    ix = IndexStore.open(os.path.join(work, "ix"), [IndexDefinition("by_city", "city")])
    checked = getattr(store, "file_checked", None)
    path = store.partition_path(3)
    # what node/move/rebuild.py does (a checkout without file_checked: a plain source)
    source = (PartitionFileSource(path, verified=True) if callable(checked) and checked(3)
              else PartitionFileSource(path))
    c0 = time.process_time()
    res = ix.rebuild(3, source, workers=1)
    cpu["rebuild"] = time.process_time() - c0
    cpu["entries"] = res.entries
    ix.close()
    store.close()
    shutil.rmtree(work, ignore_errors=True)
    return cpu


def run_child(code: str, src: str, work: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=code)
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", src, "--work", work],
                         cwd=code, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--value-size", type=int, default=1024)
    ap.add_argument("--entries", type=int, default=None,
                    help="documents (default: about 256 MiB of them)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--base", default=None, help="a checkout to compare, rounds alternating")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--work", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        sys.path.insert(0, os.getcwd())
        print(json.dumps(one_round(args.child, args.work)))
        return
    n = args.entries or max(1000, (256 << 20) // (args.value_size + 40))
    top = tempfile.mkdtemp(prefix="install-index-bench-", dir=args.dir)
    try:
        src = os.path.join(top, "part-3.bin")
        write_file(src, n, args.value_size)
        gib = os.path.getsize(src) / 2**30
        codes = {"this": ROOT} | ({"base": os.path.abspath(args.base)} if args.base else {})
        rounds: dict[str, list[dict[str, float]]] = {k: [] for k in codes}
        for _ in range(args.rounds):
            for name, code in codes.items():
                rounds[name].append(run_child(code, src, os.path.join(top, "w")))
        out: dict[str, object] = {"value_size": args.value_size, "entries": n,
                                  "file_mb": round(gib * 2**30 / 1e6, 1), "rounds": args.rounds}
        for name, rs in rounds.items():
            best = {k: min(r[k] for r in rs) for k in ("install", "scan", "load", "rebuild")}
            out[name] = {**{f"{k}_cpu_s_per_gib": round(v / gib, 3) for k, v in best.items()},
                         "rebuild_entries_per_cpu_s": round(n / best["rebuild"]),
                         "runs": rs}
        out["loadavg"] = [round(x, 2) for x in os.getloadavg()]
        print(json.dumps(out, indent=1))
    finally:
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
