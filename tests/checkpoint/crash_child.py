"""Child process for the crash tests: applies a deterministic stream of updates to a
store and appends the number of each acknowledged update to an ack file.

usage: crash_child.py STORE_DIR SEED TOTAL ACK_FILE
It resumes from the number of updates the store already holds (sum of partition
counters), so the parent can crash and restart it any number of times.
FERRY_TEST_PARTITIONS (default 3) spreads the updates over that many partitions,
FERRY_TEST_OPEN_FILES sets the store's open files budget (test_open_files.py).
"""
from __future__ import annotations

import os
import random
import sys
from typing import Iterator

PARTITIONS = 3
PAGE_SIZE = 1024


def ops(seed: int, total: int, partitions: int = PARTITIONS
        ) -> Iterator[tuple[int, bytes, bytes | None]]:
    rnd = random.Random(seed)
    for i in range(total):
        p = rnd.randrange(partitions)
        k = b"k%d" % rnd.randrange(150)
        if rnd.random() < 0.15:
            yield p, k, None
        else:
            n = rnd.choice([8, 60, 200, 700, 3000])
            yield p, k, (b"%d:" % i * (n // 4 + 1))[:n]


def model(seed: int, n: int, partitions: int = PARTITIONS) -> dict[tuple[int, bytes], bytes]:
    state: dict[tuple[int, bytes], bytes] = {}
    for p, k, v in ops(seed, n, partitions):
        if v is None:
            state.pop((p, k), None)
        else:
            state[(p, k)] = v
    return state


def main() -> None:
    from checkpoint import PartitionStore, writeback
    if os.environ.get("FERRY_TEST_WRITE_BEHIND"):     # test_writeback: start writeback per run
        writeback.WRITE_BEHIND_BYTES = int(os.environ["FERRY_TEST_WRITE_BEHIND"])
    directory, seed, total, ack = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    partitions = int(os.environ.get("FERRY_TEST_PARTITIONS", PARTITIONS))
    open_files = os.environ.get("FERRY_TEST_OPEN_FILES")
    s = PartitionStore.open(directory, page_size=PAGE_SIZE, memory_budget=48 * PAGE_SIZE,
                            checkpoint_interval=0.02, wal_sync="group",
                            wal_segment_size=32 * 1024,
                            open_files=int(open_files) if open_files else None)
    done = sum(s.counter(p) for p in s.partitions())
    fd = os.open(ack, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    print("start", done, flush=True)
    for i, (p, k, v) in enumerate(ops(seed, total, partitions)):
        if i < done:
            continue
        if v is None:
            s.remove(p, k)
        else:
            s.put(p, k, v)
        os.write(fd, b"%d\n" % (i + 1))      # acknowledged: put returned after the WAL fsync
    s.close()
    print("finished", flush=True)


if __name__ == "__main__":
    main()
