"""WAL benchmark: appends per durability mode, group commit, replay, follower latency.

Prints ONE JSON object. Every append figure is set against a reference measured in
the same run: plain ``os.write`` of the same frame-sized bytes (and, for the fsync
modes, ``os.write`` + ``fdatasync`` per record). Targets (docs/benchmarks.md, WAL):
100 B ``append`` in mode none >= 300k/s, ``append_many`` >= 1M/s, replay >= 1M/s,
4 KiB appends >= 70% of plain os.write bandwidth, group commit with 16 threads >= 8x
the acknowledged appends/s of mode ``always``.

    .venv/bin/python bench/wal_bench.py [--quick] [--dir DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from wal import Wal, accel  # noqa: E402
from wal.format import FRAME_HEADER_SIZE  # noqa: E402


def rate(n: int, seconds: float) -> float:
    return round(n / seconds, 1) if seconds > 0 else float("inf")


def ref_write(path: str, size: int, n: int, fsync: bool = False) -> dict[str, float]:
    """Plain os.write of frame-sized buffers (what a log costs with no log code)."""
    data = os.urandom(size + FRAME_HEADER_SIZE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    t, c0 = time.perf_counter(), time.thread_time()
    for _ in range(n):
        os.write(fd, data)
        if fsync:
            os.fdatasync(fd)
    dt, cpu = time.perf_counter() - t, time.thread_time() - c0
    os.close(fd)
    os.unlink(path)
    return {"records_per_s": rate(n, dt), "mb_per_s": round(n * size / dt / 1e6, 2),
            "cpu_records_per_s": rate(n, cpu)}


def ref_write_segmented(root: str, size: int, n: int, segment: int = 64 << 20) -> dict[str, float]:
    """Plain os.write of frame-sized buffers into files of ``segment`` bytes, each
    fdatasync'ed when the next one starts: the least a segmented log does in mode
    none (a segment with a successor must be whole on disk). The plain reference
    above never reaches the disk: 245 MB stay dirty in the page cache and its file is
    deleted before writeback, so it times memory copies only."""
    d = tempfile.mkdtemp(dir=root)
    data = os.urandom(size + FRAME_HEADER_SIZE)
    per = max(1, segment // len(data))
    files = 0
    fd = os.open(os.path.join(d, "0"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    t, c0 = time.perf_counter(), time.thread_time()
    for i in range(n):
        if i and i % per == 0:
            os.fdatasync(fd)
            os.close(fd)
            files += 1
            fd = os.open(os.path.join(d, str(files)), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(fd, data)
    dt, cpu = time.perf_counter() - t, time.thread_time() - c0
    os.close(fd)
    shutil.rmtree(d, ignore_errors=True)
    return {"records_per_s": rate(n, dt), "mb_per_s": round(n * size / dt / 1e6, 2),
            "cpu_records_per_s": rate(n, cpu), "segments": files + 1}


def wal_append(root: str, size: int, n: int, mode: str, batch: int = 0) -> dict[str, float]:
    d = tempfile.mkdtemp(dir=root)
    w = Wal.open(d, sync=mode)
    p = os.urandom(size)
    t, c0 = time.perf_counter(), time.thread_time()
    if batch:
        chunk = [p] * batch
        for _ in range(n // batch):
            w.append_many(chunk)
    else:
        append = w.append
        for _ in range(n):
            append(p)
    dt, cpu = time.perf_counter() - t, time.thread_time() - c0
    w.destroy()
    return {"records_per_s": rate(n, dt), "mb_per_s": round(n * size / dt / 1e6, 2),
            "cpu_records_per_s": rate(n, cpu)}


def threaded(root: str, mode: str, threads: int, seconds: float) -> tuple[int, float, float]:
    """(acknowledged appends, seconds, process CPU seconds) with ``threads`` appenders,
    each append waiting until durable as the mode promises. Mode ``always`` is measured
    exactly like ``group``: the same threads, each appending 100 B records in a loop,
    each append returning once its own fsync is done."""
    d = tempfile.mkdtemp(dir=root)
    w = Wal.open(d, sync=mode)
    p = os.urandom(100)
    counts = [0] * threads
    stop = threading.Event()

    def run(i: int) -> None:
        while not stop.is_set():
            w.append(p)
            counts[i] += 1

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    t, c0 = time.perf_counter(), time.process_time()
    for th in ts:
        th.start()
    time.sleep(seconds)
    stop.set()
    for th in ts:
        th.join()
    dt, cpu = time.perf_counter() - t, time.process_time() - c0
    w.destroy()
    return sum(counts), dt, cpu


def threaded_interleaved(root: str, seconds: float, rounds: int) -> dict[str, dict]:
    """Modes always and group with 1, 4 and 16 threads, measured in ``rounds`` short
    rounds that alternate the configurations: fsync latency on a shared machine drifts
    by 2-3x within seconds, and the ratios must compare like with like."""
    configs = [(mode, t) for mode in ("always", "group") for t in (1, 4, 16)]
    total = {c: [0, 0.0, 0.0] for c in configs}
    for _ in range(rounds):
        for c in configs:
            n, dt, cpu = threaded(root, c[0], c[1], seconds / rounds)
            total[c][0] += n
            total[c][1] += dt
            total[c][2] += cpu
    # cpu_us_per_ack: CPU time of the whole process (user + system, every thread) per
    # acknowledged append: what an acknowledgement costs, whatever the disk does.
    return {f"{m}_{t}": {"acked_per_s": rate(n, dt),
                         "cpu_us_per_ack": round(cpu / n * 1e6, 1) if n else None}
            for (m, t), (n, dt, cpu) in total.items()}


def replay(root: str, n: int) -> dict[str, float]:
    """Sequential read of ``n`` 100 B records written by ``append``: best of 3 passes each (the first pass
    also warms the page cache). ``*_cpu_*`` divides by the thread's CPU time instead of
    wall time: what the code costs, whatever share of a core the machine gave it."""
    d = tempfile.mkdtemp(dir=root)
    w = Wal.open(d, sync="none")
    p = os.urandom(100)
    # Written with append, one plain frame per record: the harder case to replay (an
    # append_many batch frame is expanded with C-level calls only, several times faster).
    append = w.append
    for _ in range(n):
        append(p)

    def count_records(it) -> int:
        c = 0
        for _ in it:
            c += 1
        return c

    def count_batches(it) -> int:
        return sum(map(len, it))

    out = {}
    for name, it, count in (
            ("same_process", lambda: w.read_from(1), count_records),
            ("same_process_batches", lambda: w.read_batches(1), count_batches),
            ("other_process_reader", lambda: Wal.reader(d).read_from(1), count_records)):
        best_wall, best_cpu = float("inf"), float("inf")
        for _ in range(3):
            t, c0 = time.perf_counter(), time.thread_time()
            c = count(it())
            best_cpu = min(best_cpu, time.thread_time() - c0)
            best_wall = min(best_wall, time.perf_counter() - t)
            assert c == n, (c, n)
        out[f"{name}_records_per_s"] = rate(n, best_wall)
        out[f"{name}_cpu_records_per_s"] = rate(n, best_cpu)
    w.destroy()
    return out


def follower_latency(root: str, count: int) -> dict[str, float]:
    """Latency from append returning to the record reaching a follower: one in the
    writer's process (condition wake-up) and one reading the directory (polling)."""
    d = tempfile.mkdtemp(dir=root)
    w = Wal.open(d, sync="none")
    ts = struct.Struct("<d")
    lat: dict[str, list[float]] = {"same_process": [], "directory": []}

    def follow(name: str, it) -> None:
        for rec in it:
            lat[name].append(time.perf_counter() - ts.unpack_from(rec.payload)[0])
            if rec.lsn >= count:
                return

    threads = [threading.Thread(target=follow, args=("same_process", w.follow(1, timeout=10))),
               threading.Thread(target=follow, args=("directory",
                                                     Wal.reader(d).follow(1, timeout=10)))]
    for th in threads:
        th.start()
    for _ in range(count):
        w.append(ts.pack(time.perf_counter()) + bytes(92))
        time.sleep(0.002)
    for th in threads:
        th.join()
    w.destroy()
    out = {}
    for name, xs in lat.items():
        xs.sort()
        out[f"{name}_p50_ms"] = round(statistics.median(xs) * 1e3, 3)
        out[f"{name}_p99_ms"] = round(xs[int(len(xs) * 0.99) - 1] * 1e3, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (< 30 s)")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args()
    q = args.quick
    root = tempfile.mkdtemp(prefix="walbench-", dir=args.dir)
    n_small = 50_000 if q else 400_000
    n_big = 10_000 if q else 60_000
    n_sync = 100 if q else 500
    secs = 1.2 if q else 4.0
    try:
        ref = os.path.join(root, "ref")
        res: dict[str, object] = {"bench": "wal", "quick": q, "machine_load": os.getloadavg(),
                                  # which append path ran: wal/_accel.c or pure Python
                                  # (FERRY_WAL_ACCEL=0 turns the C one off, for A/B)
                                  "accel": accel.status().startswith("c-"),
                                  "accel_path": accel.status()}
        res["reference_os_write"] = {
            "100B": ref_write(ref, 100, n_small), "4KiB": ref_write(ref, 4096, n_big),
            "100B_fdatasync_each": ref_write(ref, 100, n_sync, fsync=True),
            "4KiB_segments_fdatasync": ref_write_segmented(root, 4096, n_big)}
        appends: dict[str, object] = {}
        for mode in ("none", "group", "always"):
            n1, n4 = (n_small, n_big) if mode == "none" else (n_sync, n_sync)
            appends[mode] = {"100B": wal_append(root, 100, n1, mode),
                             "4KiB": wal_append(root, 4096, n4, mode)}
        appends["none"]["100B_append_many_1000"] = wal_append(root, 100, n_small * 2, "none",
                                                              batch=1000)
        res["append"] = appends
        res["threads"] = threaded_interleaved(root, secs, 4)
        res["replay"] = replay(root, n_small * 2)
        res["follower_latency"] = follower_latency(root, 200 if q else 1000)
        r100 = res["reference_os_write"]["100B"]["records_per_s"]
        r4k = res["reference_os_write"]["4KiB"]["mb_per_s"]
        thr = res["threads"]
        res["ratios"] = {
            "append_100B_none_vs_os_write": round(appends["none"]["100B"]["records_per_s"] / r100, 3),
            "append_100B_none_cpu_vs_os_write_cpu": round(
                appends["none"]["100B"]["cpu_records_per_s"]
                / res["reference_os_write"]["100B"]["cpu_records_per_s"], 3),
            "append_many_100B_vs_os_write": round(
                appends["none"]["100B_append_many_1000"]["records_per_s"] / r100, 3),
            "append_4KiB_none_bandwidth_vs_os_write": round(
                appends["none"]["4KiB"]["mb_per_s"] / r4k, 3),
            # the same bytes through plain os.write into 64 MiB files, each fdatasync'ed
            # at the switch (what the WAL's segments need); see ref_write_segmented
            "append_4KiB_none_vs_os_write_segments_fdatasync": round(
                appends["none"]["4KiB"]["mb_per_s"]
                / res["reference_os_write"]["4KiB_segments_fdatasync"]["mb_per_s"], 3),
            "group16_vs_always16": round(thr["group_16"]["acked_per_s"]
                                         / thr["always_16"]["acked_per_s"], 2),
            "group16_vs_always1": round(thr["group_16"]["acked_per_s"]
                                        / thr["always_1"]["acked_per_s"], 2),
            "always1_vs_fdatasync_each": round(
                thr["always_1"]["acked_per_s"]
                / res["reference_os_write"]["100B_fdatasync_each"]["records_per_s"], 3),
        }
        ratios = res["ratios"]
        res["targets"] = {
            "append_100B_none_300k": appends["none"]["100B"]["records_per_s"] >= 300_000,
            "append_many_100B_1M": appends["none"]["100B_append_many_1000"]["records_per_s"]
            >= 1_000_000,
            "replay_1M": res["replay"]["same_process_records_per_s"] >= 1_000_000,
            "replay_batches_1M": res["replay"]["same_process_batches_records_per_s"]
            >= 1_000_000,
            "append_4KiB_70pct_of_os_write": ratios["append_4KiB_none_bandwidth_vs_os_write"] >= 0.7,
            "group16_8x_always": ratios["group16_vs_always16"] >= 8,
        }
        res["machine_load_after"] = os.getloadavg()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
