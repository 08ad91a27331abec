"""Child processes for the WAL tests (run as a script, not collected by pytest).

    wal_child.py append DIR THREADS SEGMENT_SIZE   appends in group mode until killed,
                                                   printing "ACK lsn thread i" per ack
    wal_child.py follow DIR COUNT                   follows from LSN 1 (another process),
                                                   checks every record, prints a summary
"""
from __future__ import annotations

import sys
import threading
import zlib


def payload(thread: int, i: int) -> bytes:
    return f"{thread}:{i}:".encode() * (1 + (i * 7 + thread) % 40)


def follow_payload(lsn: int) -> bytes:
    return lsn.to_bytes(8, "little") * (1 + lsn % 13)


def append(directory: str, threads: int, segment_size: int) -> None:
    from wal import Wal
    w = Wal.open(directory, segment_size=segment_size, sync="group")
    out = sys.stdout
    lock = threading.Lock()

    def run(t: int) -> None:
        i = 0
        while True:
            lsn = w.append(payload(t, i))
            with lock:
                out.write(f"ACK {lsn} {t} {i}\n")
                out.flush()
            i += 1

    print("READY", flush=True)
    for t in range(threads):
        threading.Thread(target=run, args=(t,), daemon=True).start()
    threading.Event().wait()


def follow(directory: str, count: int) -> None:
    from wal import follow_dir
    expect = 1
    digest = 0
    for rec in follow_dir(directory, 1, timeout=60):
        if rec.lsn != expect:
            print(f"BAD order: got {rec.lsn}, expected {expect}", flush=True)
            sys.exit(3)
        if rec.payload != follow_payload(rec.lsn):
            print(f"BAD payload at {rec.lsn}", flush=True)
            sys.exit(4)
        digest = zlib.crc32(rec.payload, digest)
        expect += 1
        if expect > count:
            break
    print(f"DONE {expect - 1} {digest}", flush=True)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "append":
        append(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "follow":
        follow(sys.argv[2], int(sys.argv[3]))
    else:
        raise SystemExit(f"unknown command {cmd}")
