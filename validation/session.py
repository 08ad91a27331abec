"""Starting (or joining) the Spark session the validation job runs in.

Facts that shape this module: Spark's Python workers run ``python3`` from PATH unless
``PYSPARK_PYTHON`` names this environment's interpreter (then they lack pyarrow and
Ferry and every Python task fails); ``SPARK_LOCAL_IP`` avoids a warning and a wrong
address on machines whose hostname resolves elsewhere; a local session takes ~6 s
to start, so callers that validate often pass their own session in.
"""
from __future__ import annotations

import logging
import os
import sys
import tempfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def prepare_env(master: str) -> None:
    """Environment a Spark JVM started from this process needs (only what is unset)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if is_local(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def start(master: str = DEFAULT_MASTER, *, app_name: str = "ferry-validate",
          conf: dict[str, str] | None = None) -> "SparkSession":
    """A Spark session for ``master``; under spark-submit, the one it configured."""
    prepare_env(master)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    settings = {
        # Result tables are small (one row per partition and node): a few shuffle
        # partitions suffice, and adaptive execution coalesces them further.
        "spark.sql.shuffle.partitions": "16" if is_local(master) else "200",
        "spark.ui.showConsoleProgress": "false",
    }
    if is_local(master):
        settings["spark.ui.enabled"] = "false"
    settings.update(conf or {})
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("FERRY_SPARK_LOG", "ERROR"))
    return spark


def ship_decoder(spark: "SparkSession", *, live: bool = False) -> str:
    """Send the page decoder and this package to the executors (cluster mode).

    Local mode needs nothing: its workers import the installed Ferry. On a cluster
    the executors get a zip (``validation.ship``) through ``addPyFile``; they still
    need pyarrow and crc32c installed, as C extensions cannot travel in a zip.
    """
    from .ship import LIVE_ROOTS, ROOTS, build_zip

    sc = spark.sparkContext
    name = "ferry_live.zip" if live else "ferry_decoder.zip"
    shipped: dict[str, str] = getattr(sc, "_ferry_zips", {})
    if name in shipped:     # Spark refuses a second file of the same name in one context
        return shipped[name]
    out = os.path.join(tempfile.mkdtemp(prefix="ferry-validate-"), name)
    build_zip(out, LIVE_ROOTS if live else ROOTS)
    sc.addPyFile(out)
    shipped[name] = out
    sc._ferry_zips = shipped  # type: ignore[attr-defined]
    return out


def stop_gateway(timeout: float = 20.0) -> bool:
    """End the JVM that pyspark launched for this process, and wait until it is gone.

    ``SparkSession.stop()`` leaves the gateway JVM running until this interpreter
    exits; it then dies a second or two *after* the Python process, when it sees EOF
    on its stdin. A command that promises to leave no process behind (``ferry demo``)
    calls this at its end. Returns True if a JVM of ours was ended; False when there
    was none (never started, or the JVM belongs to spark-submit)."""
    import subprocess

    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    gw = SparkContext._gateway
    proc = getattr(gw, "proc", None)      # set only when pyspark launched the JVM itself
    if gw is None or proc is None:
        return False
    try:
        gw.shutdown()
    except Exception as e:  # noqa: BLE001 - the JVM may already be on its way out
        logging.getLogger("ferry.validate").debug("Spark gateway shutdown: %r", e)
    try:
        proc.stdin.close()                # PythonGatewayServer exits on EOF of stdin
    except (OSError, AttributeError):
        pass
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    SparkContext._gateway = None          # a later session launches a fresh JVM
    SparkContext._jvm = None
    return True
