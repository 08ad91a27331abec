"""The ceiling of group commit in CPython on this machine, without the WAL.

16 appender threads each queue a token and block on their own lock until a sync thread
releases it -- the shape of ``Wal.append`` in mode ``group``, with nothing else: no
framing, no CRC, no segment. The sync thread either does nothing (``handoff``: the
cost of the thread hand-offs alone) or writes and ``fdatasync``s a file per batch
(``fsync``: an ideal group commit). The reference is ``always``: the same 16 threads
each writing and ``fdatasync``ing under one lock, as ``Wal`` mode ``always`` does.

If ``fsync / always`` stays below 8 here, the issue's "16 threads reach 8x the
acknowledged appends/s of mode always" is beyond any group commit with one blocking
thread per append in this interpreter on this machine, not only beyond Ferry's.
Prints one JSON object.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import tempfile
import threading
import time

THREADS = 16


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run(mode: str, seconds: float, path: str) -> dict[str, float]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    q: collections.deque = collections.deque()
    kick = threading.Semaphore(0)
    lock = threading.Lock()
    stop = False
    count = [0] * THREADS

    def syncer() -> None:
        while not stop:
            kick.acquire(timeout=0.01)
            items = [q.popleft() for _ in range(len(q))]
            if not items:
                continue
            if mode == "fsync":
                os.write(fd, b"x" * (120 * len(items)))
                os.fdatasync(fd)
            for g in items:
                g.release()

    def appender(i: int) -> None:
        alloc = threading.Lock
        while not stop:
            if mode == "always":
                with lock:
                    os.write(fd, b"x" * 120)
                    os.fdatasync(fd)
            else:
                g = alloc()
                g.acquire()
                q.append(g)
                kick.release()
                g.acquire()
            count[i] += 1

    threads = [threading.Thread(target=appender, args=(i,), daemon=True) for i in range(THREADS)]
    s = threading.Thread(target=syncer, daemon=True)
    s.start()
    c0, t0 = _cpu(), time.monotonic()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop = True
    el, cpu = time.monotonic() - t0, _cpu() - c0
    for t in threads + [s]:
        t.join(5)
    os.close(fd)
    n = sum(count)
    return {"acked_per_s": round(n / el, 1), "cpu_us_per_ack": round(cpu / max(n, 1) * 1e6, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--quick", action="store_true", help="1 s per mode")
    ap.add_argument("--dir", default=None, help="where the fsynced file goes")
    a = ap.parse_args()
    secs = 1.0 if a.quick else a.seconds
    with tempfile.TemporaryDirectory(dir=a.dir or ("/work" if os.path.isdir("/work") else None)) as d:
        path = os.path.join(d, "handoff.bin")
        out = {m: run(m, secs, path) for m in ("always", "handoff", "fsync")}
    out = {"bench": "gil_handoff_ceiling", "threads": THREADS, **out,
           "ideal_group_vs_always": round(out["fsync"]["acked_per_s"] / out["always"]["acked_per_s"], 2),
           "machine_load": list(os.getloadavg())}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
