"""Parallel scan of a partition file: worker processes take page ranges of the file.

A rebuild is CPU-bound in the interpreter (decoding pages, parsing documents), so a
second core only helps from a second process. For a large partition file the rebuild
starts ``workers - 1`` child processes (``indexes.scanworker.main``) and cuts the
file's pages into ranges of about 1/32 of the file, handed out on demand to the
rebuild itself and to the workers (so a process that gets less CPU on a busy machine
simply takes fewer ranges). A worker decodes its ranges, computes the entry keys with
the same :class:`Indexer`, sorts them with its own :class:`ExternalSorter` (its share
of the memory limit) and leaves its sorted runs in the rebuild's scratch directory;
the rebuild merges them with its own runs in the load stage. Nothing a worker writes
is state: the scratch tree is deleted before and after every rebuild.

Protocol, JSON lines: the task on the worker's stdin, then ``{"pages": [a, b]}`` or
``{"stop": true}`` after each ``{"want": true, "done": n}`` the worker prints; last
``{"result": {...}}`` or ``{"error": {...}}``; then the next task, if any (a process
of a :class:`~indexes.scanpool.ScanPool` serves one rebuild after another). A worker
whose parent died (a SIGKILLed rebuild or node) sees its stdin close and stops; one
that reported an error exits and is not reused.
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from typing import Any, Callable, Mapping

from .errors import IndexStoreError
from .indexer import Indexer
from .source import PartitionFileSource, Source

_BATCH = 1024
MAX_SAMPLES = 20
# A worker costs a Python start (~0.2-0.5 s of CPU with its imports): only worth it
# for files of a few hundred thousand entries and more.
PARALLEL_MIN_BYTES = 16 << 20
RANGES = 32                  # ranges per file (each at least MIN_RANGE pages)
MIN_RANGE = 64


class Ranges:
    """The page ranges not handed out yet (front first)."""

    def __init__(self, page_count: int) -> None:
        step = max(MIN_RANGE, (page_count - 1 + RANGES - 1) // RANGES)
        self.left = [(a, min(a + step, page_count)) for a in range(1, page_count, step)]
        self.left.reverse()

    def next(self) -> tuple[int, int] | None:
        return self.left.pop() if self.left else None


def spawn() -> subprocess.Popen[bytes]:
    """A worker process, waiting for a task on its stdin (it serves one task after
    another until its stdin closes)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    # -c, not -m: the package imports this module, and runpy warns about that.
    return subprocess.Popen([sys.executable, "-c", "from indexes.scanworker import main; main()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=root)


class ScanWorker:
    """The parent's handle on one worker process doing one task. ``proc``: a process
    of a :class:`~indexes.scanpool.ScanPool`, left running after the result (the pool
    takes it back); without it the handle starts its own process, which ends with the
    task."""

    def __init__(self, task: dict[str, Any], ranges: Callable[[], tuple[int, int] | None],
                 proc: subprocess.Popen[bytes] | None = None) -> None:
        self.task, self.ranges = task, ranges
        self.done = 0
        self.result: dict[str, Any] | None = None
        self._buf = b""
        self.keep = proc is not None
        self.proc = proc if proc is not None else spawn()
        self._send(task)

    def _send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def poll(self, timeout: float = 0.0) -> bool:
        """Serve what the worker asked (waiting up to ``timeout``); True when done."""
        out = self.proc.stdout
        assert out is not None
        # poll(2), not select(2): select refuses an fd numbered 1,024 or above, and a
        # node holding many partitions has more files open than that.
        poller = select.poll()
        poller.register(out.fileno(), select.POLLIN)
        while self.result is None:
            if not poller.poll(max(0.0, timeout) * 1000):
                return False
            chunk = os.read(out.fileno(), 65536)
            if not chunk:
                self.proc.wait()
                raise IndexStoreError(f"scan worker of {self.task['path']} exited with status "
                                      f"{self.proc.returncode} without a result")
            self._buf += chunk
            *lines, self._buf = self._buf.split(b"\n")
            for line in lines:
                self._line(json.loads(line))
            timeout = 0.0
        return True

    def _line(self, msg: dict[str, Any]) -> None:
        if "want" in msg:
            self.done = msg["done"]
            r = self.ranges()
            self._send({"pages": list(r)} if r is not None else {"stop": True})
        elif "result" in msg:
            self.result = msg["result"]
            self.done = self.result["scanned"]
            if not self.keep:                   # its own process: no further task
                self.close()
        elif "error" in msg:
            self.proc.wait()
            raise _error_of(msg["error"], self.task["path"])

    def close(self) -> None:
        """End the process after its task: stdin closed, it exits."""
        self._close_pipes(stdin_only=True)
        self.proc.wait()
        self._close_pipes()

    def _close_pipes(self, stdin_only: bool = False) -> None:
        for f in (self.proc.stdin,) if stdin_only else (self.proc.stdin, self.proc.stdout):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._close_pipes()


def plan(source: Source, partition: int, workers: int | None) -> tuple[str, int, int] | None:
    """(file, page count, processes) when the scan should be shared, else None.
    ``workers=None``: 2 processes for a file of PARALLEL_MIN_BYTES or more when a
    CPU is idle (see idle_cpu); 1 or 0: never; n: n processes."""
    from checkpoint import CorruptPageError, read_meta

    if (workers is not None and workers <= 1) or not isinstance(source, PartitionFileSource):
        return None
    path = source.file_for(partition)
    try:
        size = os.path.getsize(path)
        pcount = read_meta(path).page_count
    except (OSError, CorruptPageError):
        return None                             # the serial scan raises the clear error
    if workers is None:
        if size < PARALLEL_MIN_BYTES or not idle_cpu():
            return None
        workers = 2
    if pcount < 3:
        return None
    return path, pcount, workers


def idle_cpu() -> bool:
    """A CPU the rebuild could use: 2+ CPUs and a 1-minute load average that leaves
    one free. On a saturated machine a worker only adds its start-up and an extra
    merge (measured: slower than one process at load 7 on 2 CPUs)."""
    cpus = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return cpus >= 2 and load <= cpus - 1



def common_task(indexer: Indexer, ids: Mapping[str, int], path: str,
                memory: int, verified: bool = False) -> dict[str, Any]:
    """What every worker of one scan is told: the file and how to index it (``ids``:
    the schema's index ids; ``verified``: the file's pages were checked since last
    written, see ``iter_live_columns``)."""
    return {"path": path, "definitions": [d.to_json() for d in indexer.definitions],
            "ids": dict(ids), "codec": indexer.codec, "max_key": indexer.max_key,
            "memory": memory, "verified": verified}


def task(common: dict[str, Any], scratch: str, i: int) -> dict[str, Any]:
    """Worker ``i``'s task; its own scratch folder, named uniquely so that a worker
    orphaned by a killed rebuild (it stops at its next range request) never writes
    into the folder of a later rebuild's worker."""
    return dict(common, scratch=os.path.join(scratch, f"w{i}-{os.urandom(4).hex()}"))


def start(indexer: Indexer, ids: Mapping[str, int], path: str, workers: int, ranges: Ranges,
          scratch: str, memory: int, verified: bool = False) -> list[ScanWorker]:
    """``workers - 1`` workers (the caller is the other process)."""
    common = common_task(indexer, ids, path, memory, verified)
    handles: list[ScanWorker] = []
    try:
        for i in range(1, workers):
            handles.append(ScanWorker(task(common, scratch, i), ranges.next))
    except BaseException:
        for h in handles:
            h.kill()
        raise
    return handles


def _run(task: dict[str, Any], ask: Callable[[int], tuple[int, int] | None]) -> dict[str, Any]:
    from checkpoint.pagefile import iter_live_columns

    from .definitions import IndexDefinition
    from .extsort import ExternalSorter

    defs = [IndexDefinition.from_json(d) for d in task["definitions"]]
    ix = Indexer(defs, task["ids"], task["codec"], task["max_key"])
    sorter = ExternalSorter(task["scratch"], task["memory"])
    res: dict[str, Any] = {"scanned": 0, "bad": 0, "bad_samples": []}

    def on_bad(pk: bytes, bad: list) -> None:
        res["bad"] += len(bad)
        if len(res["bad_samples"]) < MAX_SAMPLES:
            res["bad_samples"].extend(f"key {pk!r}: index {b.index.name!r}: {b.reason}"
                                      for b in bad[:MAX_SAMPLES - len(res["bad_samples"])])

    verified = bool(task.get("verified", False))
    while (pages := ask(res["scanned"])) is not None:
        for batch in iter_live_columns(task["path"], pages=pages, verified=verified):
            if not isinstance(batch, list):    # LiveColumns: one read chunk, whole
                res["scanned"] += ix.feed_many(batch, sorter.append, sorter.add_with_data,
                                               on_bad)
                sorter.check()
                continue
            for i in range(0, len(batch), _BATCH):
                res["scanned"] += ix.feed_many(batch[i:i + _BATCH], sorter.append,
                                               sorter.add_with_data, on_bad)
                sorter.check()
    res["runs"] = sorter.spill_all()
    res["count"] = len(sorter)
    return res


def _say(msg: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def main() -> None:
    """Serve tasks until stdin closes (a pool's process serves many; a rebuild's own
    worker one). A failed task ends the process: the parent discards it."""
    while True:
        line = sys.stdin.readline()
        if not line:
            return                              # the parent closed stdin or died
        _serve(json.loads(line))


def _serve(task: dict[str, Any]) -> None:
    def ask(done: int) -> tuple[int, int] | None:
        _say({"want": True, "done": done})
        line = sys.stdin.readline()
        if not line:
            raise SystemExit(3)                 # the rebuild is gone: stop
        msg = json.loads(line)
        return None if msg.get("stop") else (msg["pages"][0], msg["pages"][1])

    try:
        _say({"result": _run(task, ask)})
    except Exception as e:  # noqa: BLE001 - every failure goes back to the rebuild
        _say({"error": _error_message(e)})
        raise SystemExit(1) from None


# An error crosses the process boundary as JSON: its ``kind`` names the class the
# parent raises again (with the fields that class is built from); any other error is
# an IndexStoreError carrying the worker's message.
KIND_CORRUPT_PAGE = "corrupt_page"


def _error_message(e: Exception) -> dict[str, Any]:
    """The worker's side: ``e`` as the ``{"error": ...}`` message's body."""
    from checkpoint import CorruptPageError     # the worker has read pages: loaded
    err: dict[str, Any] = {"message": f"{type(e).__name__}: {e}"}
    if isinstance(e, CorruptPageError):
        err.update(kind=KIND_CORRUPT_PAGE, path=e.path, page=e.page, offset=e.offset,
                   reason=e.reason)
    return err


def _error_of(err: dict[str, Any], path: str) -> Exception:
    """The parent's side: the error a worker's ``{"error": ...}`` message stands for."""
    if err.get("kind") == KIND_CORRUPT_PAGE:
        from checkpoint import CorruptPageError
        return CorruptPageError(err["path"], err["page"], err["offset"], err["reason"])
    return IndexStoreError(f"scan worker of {path} failed: {err['message']}")


if __name__ == "__main__":
    main()
