"""The demo's Spark validation with progress: the session is started here (so starting
Spark, ~6 s, shows as its own step) and a thread reads the Spark status tracker for the
job's tasks while ``validation.validate`` runs. The JVM's own stderr (log4j banner,
warnings) goes to a log file instead of between the demo's lines. No JVM outlives it."""
from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from .demo_ui import DemoUI

POLL_S = 0.25


def _watch(sc: Any, report: Callable[[int, int, str], None], stop: threading.Event) -> None:
    """Tasks done/total over every stage seen so far (a finished stage counts whole)."""
    tracker = sc.statusTracker()
    stages: dict[int, tuple[int, int]] = {}
    while not stop.wait(POLL_S):
        try:
            active = tracker.getActiveStageIds()
            detail = ""
            for sid in active:
                info = tracker.getStageInfo(sid)
                if info is not None:
                    stages[sid] = (info.numCompletedTasks, info.numTasks)
                    # "collect at job.py:123" -> "collect"; Scala closure names say nothing
                    name = info.name.split(" at ")[0]
                    detail = f"stage {sid}" + (f": {name}" if name and not name.startswith("$") else "")
            for sid, (_, total) in stages.items():
                if sid not in active:
                    stages[sid] = (total, total)
            if stages:
                report(sum(d for d, _ in stages.values()), sum(t for _, t in stages.values()), detail)
        except Exception:           # the progress is a courtesy: never fail the validation
            return


@contextmanager
def _stderr_to(path: str) -> Iterator[None]:
    """File descriptor 2 goes to ``path`` meanwhile: a process started now (the JVM)
    keeps writing there; this process gets its stderr back at the end."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def validate(ui: DemoUI, dirs: list[str], *, master: str, expected: str,
             jvm_log: str) -> dict[str, Any]:
    """``validation.validate`` on ``dirs`` against ``expected``; the returned
    ``seconds`` include starting Spark, ``spark_start_seconds`` is that part. The
    JVM's stderr goes to ``jvm_log``."""
    from validation import validate as spark_validate
    from validation.session import start, stop_gateway

    t0 = time.monotonic()
    with ui.tasks("Spark validation") as report:
        report(0, 0, f"starting Spark ({master}); its log: {jvm_log}")
        try:
            with _stderr_to(jvm_log):
                spark = start(master)
            started = time.monotonic() - t0
            report(0, 0, "reading the partition files")
            stop = threading.Event()
            watcher = threading.Thread(target=_watch, args=(spark.sparkContext, report, stop),
                                       name="demo-spark-progress", daemon=True)
            watcher.start()
            try:
                v = spark_validate(dirs, master=master, expected=expected, spark=spark)
            finally:
                stop.set()
                watcher.join()
                spark.stop()
        finally:
            stop_gateway()        # no JVM outlives the demo
    v["seconds"] = round(time.monotonic() - t0, 1)
    v["spark_start_seconds"] = round(started, 1)
    return v
