"""The demo's Spark validations with progress: one session for all of them, started
here by the first (so starting Spark, ~6 s, shows as its own line), and a thread that
reads the Spark status tracker for the job's tasks while ``validation.validate`` runs.
The cluster demo runs two: a live validation of the running cluster, then the offline
one of the stopped nodes' files. The JVM's own stderr (log4j banner, warnings) goes to
a log file instead of between the demo's lines. No JVM outlives the demo."""
from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator

from .demo_ui import DemoUI

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from validation.live import LiveSettings

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


class DemoSpark:
    """One Spark session for the demo's validations: started by the first one (~6 s,
    shown as that step's first line), reused by the next, stopped by :func:`session`."""

    def __init__(self, ui: DemoUI, master: str, jvm_log: str) -> None:
        self.ui, self.master, self.jvm_log = ui, master, jvm_log
        self.spark: SparkSession | None = None
        self.tried = False          # a session was (being) started: its JVM is ended at close

    def validate(self, what: str, dirs: list[str], *, reading: str, expected: str | None = None,
                 live: "LiveSettings | None" = None) -> dict[str, Any]:
        """``validation.validate`` of the folders ``dirs`` (or, with ``live``, of the
        running cluster) with a progress view named ``what``; ``reading`` says what the
        job reads. The returned ``seconds`` include starting Spark if this call
        started it; ``spark_start_seconds`` is that part (else 0)."""
        from validation import validate as spark_validate
        from validation.session import start

        t0 = time.monotonic()
        started = 0.0
        with self.ui.tasks(what) as report:
            if self.spark is None:
                self.tried = True
                report(0, 0, f"starting Spark ({self.master}); its log: {self.jvm_log}")
                with _stderr_to(self.jvm_log):
                    self.spark = start(self.master)
                started = time.monotonic() - t0
            assert self.spark is not None
            report(0, 0, reading)
            stop = threading.Event()
            watcher = threading.Thread(target=_watch, args=(self.spark.sparkContext, report, stop),
                                       name="demo-spark-progress", daemon=True)
            watcher.start()
            try:
                v = spark_validate(dirs, master=self.master, spark=self.spark, expected=expected,
                                   live=live)
            finally:
                stop.set()
                watcher.join()
        v["seconds"] = round(time.monotonic() - t0, 1)
        v["spark_start_seconds"] = round(started, 1)
        return v

    def close(self) -> None:
        if not self.tried:
            return                  # --no-validate: pyspark is not even imported
        from validation.session import stop_gateway
        try:
            if self.spark is not None:
                self.spark.stop()
        finally:
            self.spark = None
            stop_gateway()        # no JVM outlives the demo


@contextmanager
def session(ui: DemoUI, *, master: str, jvm_log: str) -> Iterator[DemoSpark]:
    """A :class:`DemoSpark` whose session (if one was started) is stopped at the end."""
    s = DemoSpark(ui, master, jvm_log)
    try:
        yield s
    finally:
        s.close()


def validate(ui: DemoUI, dirs: list[str], *, master: str, expected: str,
             jvm_log: str) -> dict[str, Any]:
    """``validation.validate`` on the folders ``dirs`` against ``expected`` in a
    session of its own. The JVM's stderr goes to ``jvm_log``."""
    with session(ui, master=master, jvm_log=jvm_log) as s:
        return s.validate("Spark validation", dirs, reading="reading the partition files",
                          expected=expected)
