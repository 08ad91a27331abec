"""Key index build: the C path (checkpoint/_keyaccel.c) vs pure Python, in the same run.

Two figures, interleaved C/Python, best and median of ``--repeat`` runs:

- ``index_build``: keys/s of building a KeyIndex from ``--keys`` keys (``user:%010d``,
  3 per page as with 1 KiB values in 4 KiB pages) handed over in the open-time scan's
  batches of SCAN_BATCH keys: Python ``add_page_keys`` vs the C ``scan_pages`` +
  ``add_hashed`` that ``Partition._scan`` runs. The key lists exist before timing.
- ``partition_open``: ``PartitionStore.prepare_install`` (the demander's install scan;
  a reopen does the same) of a partition file of 1 KiB values written by a real store,
  in four settings: ``pure`` (FERRY_PAGE_ACCEL=0: no C at all), ``page_accel`` (the
  C page decoder only), ``tuples`` (decoder and key index in C,
  the decoder's per-key tuples hashed by ``_keyaccel.scan_pages``: commit 52a0516)
  and ``all`` (the decoder hashes keys straight from the read chunk:
  ``_pageaccel.scan_keys``, no per-key Python object), plus two floors:
  ``decoder_floor`` (``iter_page_keys`` alone with the C decoder: what ``tuples``
  pays before hashing) and ``crc_read_floor`` (the same reads plus the C CRC and
  structure check of every page, no keys: what any scan of the file must pay).
  The file is in the page cache.

Prints ONE JSON object; ratios are Python seconds / C seconds.

    python bench/keyindex_bench.py [--quick] [--keys 1000000] [--mb 256] [--repeat 5]
"""
from __future__ import annotations

import argparse
import array
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from checkpoint import accel as switch  # noqa: E402
from checkpoint import PartitionStore, keyindex, pagefile  # noqa: E402
from checkpoint.keyindex import KeyIndex  # noqa: E402
from checkpoint.partition import SCAN_BATCH  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pagefile_bench import build  # noqa: E402


def _stats(times: list[float]) -> dict:
    return {"best_s": round(min(times), 4), "median_s": round(statistics.median(times), 4)}


def _batches(n: int) -> list[list[tuple]]:
    """iter_page_keys items, 3 keys a page, cut into SCAN_BATCH-key batches."""
    out, cur, nk = [], [], 0
    for p in range(n // 3 + 1):
        keys = [(s, b"user:%010d" % (3 * p + s)) for s in range(3) if 3 * p + s < n]
        if not keys:
            break
        cur.append((p + 1, 2, 0, keys))
        nk += len(keys)
        if nk >= SCAN_BATCH:
            out.append(cur)
            cur, nk = [], 0
    return out + [cur]


def index_build(n: int, repeat: int, accel) -> dict:
    batches = _batches(n)
    space = array.array("I", bytes(4 * (n // 3 + 2)))

    def python() -> KeyIndex:
        idx = KeyIndex(lambda loc: b"")
        for pages in batches:
            idx.add_page_keys(pages)
        return idx

    def c() -> KeyIndex:
        idx = KeyIndex(lambda loc: b"")
        it = (page for pages in batches for page in pages)
        more = True
        while more:
            h, locs, more = accel.scan_pages(it, SCAN_BATCH, 4096, 1024, space, set(), [])
            idx.add_hashed(h, locs)
        return idx

    times: dict[str, list[float]] = {"python": [], "c": []}
    saved = keyindex._accel
    try:
        for _ in range(repeat):
            for mode, fn, mod in (("python", python, None), ("c", c, accel)):
                keyindex._accel = mod
                t = time.perf_counter()
                idx = fn()
                times[mode].append(time.perf_counter() - t)
                assert len(idx) == n
                del idx
    finally:
        keyindex._accel = saved
    row: dict = {"keys": n}
    for mode in times:
        row[mode] = _stats(times[mode])
        row[mode]["keys_per_s"] = round(n / min(times[mode]))
    row["ratio_best"] = round(min(times["python"]) / min(times["c"]), 2)
    row["ratio_median"] = round(statistics.median(times["python"]) /
                                statistics.median(times["c"]), 2)
    return row


class _NoScanKeys:
    """The C decoder without its hashed scan: _scan takes the 52a0516 route."""

    def __init__(self, mod) -> None:
        self._mod = mod

    def __getattr__(self, attr):
        if attr == "scan_keys":
            raise AttributeError(attr)
        return getattr(self._mod, attr)


def _crc_read_floor(path: str, chunk_bytes: int, page_accel) -> None:
    """The scan's reads and the C page checks (CRC + structure) of every page."""
    meta = pagefile.read_meta(path)
    r = pagefile.PageReader(path, meta)
    r.per = max(1, chunk_bytes // meta.page_size)
    try:
        for first, chunk in r.chunks():
            n = len(chunk) // meta.page_size
            assert page_accel.check_pages(chunk, first, meta.page_size, 0) == n
    finally:
        r.close()


def partition_open(path: str, entries: int, repeat: int, page_accel, key_accel) -> dict:
    work = tempfile.mkdtemp(prefix="keyindex-open-", dir=os.path.dirname(path))
    s = PartitionStore.open(work, wal_sync="none", checkpoint_interval=None)
    settings = {"pure": (None, None), "page_accel": (page_accel, None),
                "tuples": (_NoScanKeys(page_accel), key_accel), "all": (page_accel, key_accel)}
    if getattr(page_accel, "scan_keys", None) is None:
        del settings["tuples"]                 # a decoder without scan_keys: all = tuples
    times: dict[str, list[float]] = {m: [] for m in (*settings, "decoder_floor",
                                                      "crc_read_floor")}
    saved = switch.page, keyindex._accel
    try:
        for _ in range(repeat):
            for mode, (pa, ka) in settings.items():
                switch.page, keyindex._accel = pa, ka
                t = time.perf_counter()
                part = s.prepare_install(1, path)
                times[mode].append(time.perf_counter() - t)
                assert len(part.index) == entries
                part.close()
            switch.page = page_accel
            t = time.perf_counter()
            for _p in pagefile.iter_page_keys(path, s.mem.io_bytes):
                pass
            times["decoder_floor"].append(time.perf_counter() - t)
            t = time.perf_counter()
            _crc_read_floor(path, s.mem.io_bytes, page_accel)
            times["crc_read_floor"].append(time.perf_counter() - t)
    finally:
        switch.page, keyindex._accel = saved
        s.close()
        shutil.rmtree(work, ignore_errors=True)
    row: dict = {"entries": entries, "file_mb": round(os.path.getsize(path) / 1e6, 1)}
    for mode, ts in times.items():
        row[mode] = _stats(ts)
        row[mode]["us_per_entry"] = round(1e6 * min(ts) / entries, 3)
    row["ratio_all_vs_pure"] = round(min(times["pure"]) / min(times["all"]), 2)
    row["ratio_all_vs_page_accel"] = round(min(times["page_accel"]) / min(times["all"]), 2)
    row["ratio_all_vs_page_accel_median"] = round(statistics.median(times["page_accel"]) /
                                                  statistics.median(times["all"]), 2)
    if "tuples" in times:
        row["ratio_all_vs_tuples"] = round(min(times["tuples"]) / min(times["all"]), 2)
        row["ratio_all_vs_tuples_median"] = round(statistics.median(times["tuples"]) /
                                                  statistics.median(times["all"]), 2)
    row["all_over_crc_read_floor"] = round(min(times["all"]) / min(times["crc_read_floor"]), 2)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="200k keys, 32 MB file, 3 repeats")
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--mb", type=int, default=256, help="1 KiB values in the opened file")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the partition file goes (default: tmp)")
    args = ap.parse_args()
    keys, mb, repeat = (200_000, 32, 3) if args.quick else (args.keys, args.mb, args.repeat)
    key_accel, page_accel = keyindex._accel, switch.page
    if key_accel is None or page_accel is None:
        print(json.dumps({"error": "checkpoint._keyaccel/_pageaccel not built or FERRY_PAGE_ACCEL=0"}))
        sys.exit(2)
    result: dict = {"bench": "keyindex", "quick": args.quick,
                    "loadavg_start": os.getloadavg()[0]}
    result["index_build"] = index_build(keys, repeat, key_accel)
    work = tempfile.mkdtemp(prefix="keyindex-bench-", dir=args.dir)
    try:
        path = os.path.join(work, "part-1.bin")
        t = time.perf_counter()
        n = build(path, 1024, mb << 20)
        result["file_build_s"] = round(time.perf_counter() - t, 2)
        result["partition_open"] = partition_open(path, n, repeat, page_accel, key_accel)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["loadavg_end"] = os.getloadavg()[0]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
