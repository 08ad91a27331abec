"""Child process for the first-change undo image tests (test_first_change.py).

usage: first_change_child.py STORE_DIR REF_DIR ACK_FILE SEED [powerloss KEEP CUT_AT]

Loads a deterministic set of entries (``load``), takes a checkpoint, copies the
partition files to REF_DIR (the state every undo image must restore), prints
"ready", then applies ``ops(seed)`` forever, appending the number of each
acknowledged op to ACK_FILE.  No checkpoint runs after the copy (no interval, a
budget far above the data), so the parent's SIGKILL lands after first-change images
were logged and before any checkpoint overwrote a page.

With ``powerloss KEEP CUT_AT`` the process runs on faults.powerloss.PowerLossLayer,
checkpoints every 25 ops with more ops applied while each checkpoint writes its pages
(images logged between its mark and its marker), and at the CUT_AT-th
``checkpoint.mid_write`` cuts the power (the layer rewrites the files to their durable
state plus a random subset KEEP of unsynced writes) and SIGKILLs itself.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import sys
import threading
from typing import Iterator

PAGE_SIZE = 1024
LOAD = 300


def load(seed: int) -> Iterator[tuple[int, bytes, bytes]]:
    rnd = random.Random(seed)
    for i in range(LOAD):
        yield i % 2, b"k%d" % i, rnd.randbytes(rnd.choice([20, 90, 300, 2600]))


def ops(seed: int) -> Iterator[tuple[int, bytes, bytes | None]]:
    rnd = random.Random(seed + 1000)
    i = 0
    while True:
        p = rnd.randrange(2)
        k = b"k%d" % rnd.randrange(LOAD + 40)          # mostly existing keys
        r = rnd.random()
        if r < 0.15:
            yield p, k, None
        else:
            yield p, k, (b"%d:" % i * 900)[:rnd.choice([10, 70, 250, 1800, 3500])]
        i += 1


def model(seed: int, n: int) -> dict[tuple[int, bytes], bytes]:
    state = {(p, k): v for p, k, v in load(seed)}
    for j, (p, k, v) in enumerate(ops(seed)):
        if j >= n:
            break
        if v is None:
            state.pop((p, k), None)
        else:
            state[(p, k)] = v
    return state


class _GatedLayer:
    """Wraps a PowerLossLayer so that the power cut and the SIGKILL happen with every
    other thread's file operation stopped at the gate (none lands after the cut)."""

    def __init__(self, keep: float, seed: int) -> None:
        from faults.powerloss import PowerLossLayer

        class Gated(PowerLossLayer):
            gate = threading.Lock()

        for name in ("open", "write", "pwrite", "fsync", "fdatasync", "ftruncate", "close",
                     "replace", "unlink", "fsync_dir"):
            base = getattr(PowerLossLayer, name)

            def op(self, *a, _base=base, **kw):
                with Gated.gate:
                    return _base(self, *a, **kw)
            setattr(Gated, name, op)
        self.layer = Gated(keep_unsynced=keep, seed=seed)

    def cut_and_die(self) -> None:
        type(self.layer).gate.acquire()        # never released: the process dies
        self.layer.cut()
        os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    directory, ref, ack, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    power = len(sys.argv) > 5 and sys.argv[5] == "powerloss"
    from faults import fileio
    gated = None
    if power:
        gated = _GatedLayer(float(sys.argv[6]), seed)
        fileio.use(gated.layer).__enter__()
    from checkpoint import PartitionStore, checkpointer
    s = PartitionStore.open(directory, page_size=PAGE_SIZE, memory_budget=16 << 20,
                            checkpoint_interval=None, wal_sync="group",
                            wal_segment_size=64 * 1024)
    for p, k, v in load(seed):
        s.put(p, k, v)
    s.checkpoint()
    os.makedirs(ref, exist_ok=True)
    for name in os.listdir(directory):
        if name.startswith("part-") and name.endswith(".bin"):
            shutil.copyfile(os.path.join(directory, name), os.path.join(ref, name))
    fd = os.open(ack, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    stream = enumerate(ops(seed))

    def step() -> None:
        j, (p, k, v) = next(stream)
        if v is None:
            s.remove(p, k)
        else:
            s.put(p, k, v)
        os.write(fd, b"%d\n" % (j + 1))        # acknowledged: durable in the WAL

    if power:
        assert gated is not None
        cut_at, hits = int(sys.argv[7]), [0]

        def mid_write(name: str) -> None:
            if name != "checkpoint.mid_write":
                return
            hits[0] += 1
            for _ in range(8):                 # updates arrive while pages are written
                step()
            if hits[0] >= cut_at:
                gated.cut_and_die()
        checkpointer.crashpoint = mid_write
    print("ready", flush=True)
    n = 0
    while True:
        step()
        n += 1
        if power and n % 25 == 0:
            s.checkpoint()


if __name__ == "__main__":
    main()
