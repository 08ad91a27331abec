"""The demo's Spark validation with progress: the session is started here (so starting
Spark, ~6 s, shows as its own step) and a thread reads the Spark status tracker for the
job's tasks while ``validation.validate`` runs. No JVM outlives it."""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

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


def validate(ui: DemoUI, dirs: list[str], *, master: str, expected: str) -> dict[str, Any]:
    """``validation.validate`` on ``dirs`` against ``expected``; the returned
    ``seconds`` include starting Spark, ``spark_start_seconds`` is that part."""
    from validation import validate as spark_validate
    from validation.session import start, stop_gateway

    t0 = time.monotonic()
    with ui.tasks("Spark validation") as report:
        report(0, 0, f"starting Spark ({master})")
        try:
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
