"""The validation job: list files, decode them in Spark, compare owners, check the
expected data, render the outcome. Runs three ways, all through
:func:`validate_outcome`:

    ferry validate DATA1 DATA2 ...                         (validation/cli.py)
    ferry validate --cluster HOST:PORT --secret-file F     (live mode: validation.live;
                   or --tls-ca CA --tls-cert CERT --tls-key KEY instead of the secret)
    spark-submit validation/job.py DATA1 DATA2 ...         (this file as a script)
    validation.validate([...]) -> dict                     (harness, ferry demo)
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not __package__:
    # spark-submit runs this file as a script with validation/ first on sys.path: put
    # the checkout root there instead so ``validation`` and ``checkpoint`` import as
    # packages (no-op when Ferry is installed or shipped with --py-files).
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.path.insert(0, os.path.dirname(_here))

import argparse
import json
import time
from typing import TYPE_CHECKING, Mapping

from validation import compare, expected as expected_mod, live as live_mod, report as report_mod
from validation.errors import ExpectedFileError, ValidationError, short_error
from validation.layout import PartitionFile, list_folders
from validation.session import DEFAULT_MASTER, is_local, ship_decoder, start
from validation.source import SOURCE_NAME, FerryDataSource

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

MAX_KEYS = 100          # differing keys listed per divergent partition (all are counted)
MAX_EXAMPLES = 20       # expected-data mismatches listed per kind (all are counted)


def read_raw(spark: "SparkSession", files: list[PartitionFile]) -> "DataFrame":
    """Raw rows (``source.RAW_SCHEMA``) of ``files``, decoded in the executors."""
    spark.dataSource.register(FerryDataSource)
    # Larger files first: the longest tasks start early, so the job's tail is short.
    tasks = [f.to_dict() for f in sorted(files, key=lambda f: -f.size)]
    return spark.read.format(SOURCE_NAME).option("tasks", json.dumps(tasks)).load()


def partition_counts(files: list[PartitionFile]) -> dict[str, int]:
    """Folder mode's partition count per cache: the highest partition file + 1 (a
    cluster creates every partition, so the owners' folders hold them all)."""
    out: dict[str, int] = {}
    for f in files:
        out[f.cache] = max(out.get(f.cache, 0), f.partition + 1)
    return out


def run(spark: "SparkSession", files: list[PartitionFile], *, expected: str | None = None,
        max_keys: int = MAX_KEYS, export: str | None = None,
        partitions: int | Mapping[str, int] | None = None,
        live: live_mod.LivePlan | None = None) -> report_mod.Outcome:
    """Validate ``files`` (from ``layout.list_folders``) in ``spark``; or, with ``live``,
    the running cluster it plans (``files`` is then empty)."""
    t0 = time.monotonic()
    # files the layout found but does not decode (a bad name): findings, not tasks
    findings = [compare.file_problem(f) for f in files if f.problem]
    files = [f for f in files if not f.problem]
    caches = set(live.partition_counts) if live else {f.cache for f in files}
    counts = dict(live.partition_counts if live else partition_counts(files))
    if isinstance(partitions, int):          # --partitions N: every cache has N
        counts = {c: partitions for c in caches}
    elif partitions:
        counts = dict(partitions)
    # The expected file is read first: a bad one fails before any file is decoded.
    exp_rows = None
    if expected is not None:
        exp_rows = expected_mod.read_expected(spark, expected, caches, counts)
    raw = live_mod.read_raw(spark, live) if live else read_raw(spark, files)
    # Each pass over ``raw`` decodes every file again (Python, the dominant cost);
    # when the expected check or the export need a second full pass, keep the decoded
    # rows in executor memory, spilling to executor disk, not on the driver. Live mode
    # always keeps them: a second pass would fence and fetch every partition again.
    reuse = expected is not None or export is not None or live is not None
    if reuse:
        from pyspark import StorageLevel
        raw = raw.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        states, problems = compare.digests(raw, files)
        problems = findings + problems
        divergent_parts = {(s.cache, s.partition) for s in states if s.divergent}
        divergent: list[dict] = []
        if divergent_parts:
            # Only the divergent partitions' files are decoded again for the key lists.
            if reuse:       # already decoded and persisted: keep those partitions' rows
                from pyspark.sql import functions as F
                parts = spark.createDataFrame(sorted(divergent_parts),
                                              "cache string, partition int")
                source = raw.join(F.broadcast(parts), ["cache", "partition"])
            else:
                source = read_raw(spark, [f for f in files
                                          if (f.cache, f.partition) in divergent_parts])
            divergent = compare.key_diffs(compare.entries(source), states, max_keys)
        exp = None
        if exp_rows is not None:
            exp = expected_mod.check(exp_rows, compare.entries(raw), states, MAX_EXAMPLES)
        if export is not None:
            export_parquet(raw, export)
    finally:
        if reuse:
            raw.unpersist()
    if live is not None:
        copies = sum(1 for s in states for r in s.replicas.values() if r.error is None)
        return report_mod.Outcome(states, divergent, problems, exp, time.monotonic() - t0,
                                  files=copies,
                                  nodes=sorted({n for s in states for n in s.replicas if n}),
                                  live=live_mod.summary(states, live))
    return report_mod.Outcome(states, divergent, problems, exp, time.monotonic() - t0,
                              files=len(files), nodes=sorted({f.node for f in files}))


def export_parquet(raw: "DataFrame", out: str) -> None:
    """The decoded entries (with values) as Parquet under ``out``, partitioned by
    cache and partition (``out/cache=c/partition=p/part-*.parquet``)."""
    try:
        (compare.entries(raw, with_value=True).write.mode("overwrite")
         .partitionBy("cache", "partition").parquet(out))
    except Exception as exc:  # noqa: BLE001 - Spark wraps the OS error of the writer
        raise ValidationError(f"cannot export Parquet to {out}: {short_error(exc)}") from exc


def validate_outcome(dirs: list[str], *, master: str | None = DEFAULT_MASTER,
                     expected: str | None = None, spark: "SparkSession | None" = None,
                     max_keys: int = MAX_KEYS, report: str | None = None,
                     export: str | None = None,
                     conf: dict[str, str] | None = None,
                     partitions: int | Mapping[str, int] | None = None,
                     live: live_mod.LiveSettings | None = None) -> report_mod.Outcome:
    """Validate node data folders, or with ``live`` a running cluster (then ``dirs``
    must be empty). Pass ``spark`` to reuse a session (a new one costs ~6 s to
    start); else one is started on ``master`` (None: the master spark-submit
    configured, else local) and stopped at the end."""
    t0 = time.monotonic()
    # bad folders, an unreachable cluster or a wrong secret fail here, before Spark starts
    plan = None
    if live is not None:
        if dirs:
            raise ValidationError("give data folders (folder mode) or --cluster/--control-plane "
                                  "(live mode), not both")
        plan = live_mod.plan(live)
        files: list[PartitionFile] = []
    else:
        files = list_folders(list(dirs))
    if expected is not None and not os.path.exists(expected):
        raise ExpectedFileError(f"expected file {expected} does not exist")
    own = spark is None
    if spark is None:
        if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
            master = DEFAULT_MASTER      # not under spark-submit: nobody chose a master
        spark = start(master or "", conf=conf)
    try:
        spark_master = spark.sparkContext.master
        assert spark_master is not None          # a SparkContext does not start without one
        if not is_local(spark_master):
            ship_decoder(spark, live=plan is not None or expected is not None)
        outcome = run(spark, files, expected=expected, max_keys=max_keys, export=export,
                      partitions=partitions, live=plan)
        outcome.seconds = time.monotonic() - t0
        if report:
            report_mod.write_html(report, outcome)
        return outcome
    finally:
        if own:
            spark.stop()


def validate(dirs: list[str], *, master: str = DEFAULT_MASTER, expected: str | None = None,
             spark: "SparkSession | None" = None, max_keys: int = MAX_KEYS,
             report: str | None = None, export: str | None = None,
             conf: dict[str, str] | None = None,
             partitions: int | Mapping[str, int] | None = None,
             live: live_mod.LiveSettings | None = None) -> dict:
    """Validate node data folders (or, with ``live``, a running cluster); returns the
    ``--json`` object (see ``report.JSON_KEYS``); ``result["passed"]`` is False when
    anything diverges."""
    return validate_outcome(dirs, master=master, expected=expected, spark=spark,
                            max_keys=max_keys, report=report, export=export,
                            conf=conf, partitions=partitions, live=live).to_json()


def execute(dirs: list[str], *, master: str | None, expected: str | None, as_json: bool,
            report: str | None, export: str | None, max_keys: int,
            conf: dict[str, str], partitions: int | None = None,
            live: live_mod.LiveSettings | None = None) -> int:
    """The command-line job: prints the outcome, returns the exit status
    (0 passed, 1 divergent/corrupt/mismatched, 2 could not validate)."""
    try:
        outcome = validate_outcome(dirs, master=master, expected=expected, report=report,
                                   export=export, max_keys=max_keys, conf=conf,
                                   partitions=partitions, live=live)
    except ValidationError as exc:
        print(f"ferry validate: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a Spark failure: one line, not a Java stack
        if not _from_spark(exc):
            raise
        print(f"ferry validate: Spark failed: {short_error(exc)}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(outcome.to_json()))
    else:
        print(report_mod.summary(outcome))
    return 0 if outcome.passed else 1


def add_live_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--cluster", default=None, help="HOST:PORT[,...] of running nodes (live mode)")
    ap.add_argument("--control-plane", default=None, help="etcd URL[,...] (live mode)")
    ap.add_argument("--prefix", default=live_mod.DEFAULT_PREFIX)
    ap.add_argument("--secret-file", default=None)
    ap.add_argument("--tls-ca", default=None, help="mutual TLS: the cluster CA's certificate")
    ap.add_argument("--tls-cert", default=None, help="mutual TLS: a validator certificate "
                    "(ferry://validator/NAME)")
    ap.add_argument("--tls-key", default=None, help="mutual TLS: its key")
    for name, what in ETCD_OPTIONS:
        ap.add_argument(f"--etcd-{name}", dest=f"etcd_{name.replace('-', '_')}", default=None, help=what)
    ap.add_argument("--cache", action="append", default=[])
    ap.add_argument("--parallel", type=int, default=live_mod.DEFAULT_PARALLEL)
    ap.add_argument("--rate", default=None, help="bytes/s of validation transfers (200MB, 0 = unlimited)")
    ap.add_argument("--partitions", type=int, default=None)


ETCD_OPTIONS = (
    ("ca", "--control-plane over https: the CA that signed etcd's certificate ($FERRY_ETCD_CA)"),
    ("cert", "--control-plane: a client certificate for etcd's --client-cert-auth ($FERRY_ETCD_CERT)"),
    ("key", "--control-plane: that certificate's key ($FERRY_ETCD_KEY)"),
    ("user", "--control-plane: an etcd user allowed to read the prefix, e.g. ferry-NAME-reader "
             "($FERRY_ETCD_USER)"),
    ("password-file", "--control-plane: a file holding that user's password ($FERRY_ETCD_PASSWORD_FILE)"),
)


def live_settings(cluster: str | None, control_plane: str | None, prefix: str,
                  secret_file: str | None, caches: list[str], parallel: int,
                  rate: str | None, tls: tuple[str | None, str | None, str | None] = (None, None, None),
                  etcd: tuple[str | None, ...] = (None,) * 5,
                  ) -> live_mod.LiveSettings | None:
    """The live-mode settings of the command line, or None (folder mode). ``tls``: the
    --tls-ca, --tls-cert and --tls-key paths (all three or none; they replace the
    secret). ``etcd``: --etcd-ca, --etcd-cert, --etcd-key, --etcd-user and
    --etcd-password-file, how --control-plane reaches an etcd with TLS and access
    control (none given: the environment's ``FERRY_ETCD_*``, as ``ferry cluster``)."""
    from node.control import EtcdAccess
    from node.errors import ConfigError
    access = EtcdAccess(*etcd) if any(etcd) else EtcdAccess.from_env()
    if not access.empty and not control_plane:
        raise ValidationError("--etcd-* options are for --control-plane (the cluster's etcd)")
    if control_plane and not access.empty:
        try:
            access.check([x for x in control_plane.split(",") if x],
                         name=lambda k: "--control-plane" if k == "endpoints" else "--etcd-" + k.replace("_", "-"))
        except ConfigError as exc:
            raise ValidationError(str(exc)) from exc
    if any(tls) and not all(tls):
        missing = ", ".join(f"--tls-{k}" for k, v in zip(("ca", "cert", "key"), tls) if not v)
        raise ValidationError(f"mutual TLS needs all of --tls-ca, --tls-cert and --tls-key; {missing} "
                              "not given")
    if all(tls) and secret_file:
        raise ValidationError("give --secret-file or --tls-ca/--tls-cert/--tls-key, not both: a "
                              "cluster runs one of the two")
    if not cluster and not control_plane:
        if any(tls):
            raise ValidationError("--tls-ca/--tls-cert/--tls-key are for live mode (--cluster or "
                                  "--control-plane)")
        return None
    from transfer import parse_rate
    try:
        bps = live_mod.DEFAULT_RATE if rate is None else parse_rate(rate)
    except Exception as exc:  # noqa: BLE001 - parse_rate raises ValueError or TransferError
        raise ValidationError(f"--rate {rate!r}: {exc}") from exc
    if parallel < 1:
        raise ValidationError(f"--parallel {parallel}: use 1 or more")
    split = lambda v: [x for x in (v or "").split(",") if x]  # noqa: E731
    files = None
    if all(tls):
        from transfer.tls import TlsFiles
        ca, cert, key = tls
        assert ca and cert and key
        files = TlsFiles(ca, cert, key)
    return live_mod.LiveSettings(split(cluster), split(control_plane), prefix, secret_file,
                                 list(caches), parallel, bps or None, files,
                                 None if access.empty else access)


def _from_spark(exc: BaseException) -> bool:
    """An error raised by Spark or its Py4J bridge (their classes live in those packages)."""
    return any(c.__module__.startswith(("pyspark.", "py4j.")) for c in type(exc).__mro__)


def parse_conf(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValidationError(f"--conf {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point under spark-submit (argparse: the driver may lack click)."""
    ap = argparse.ArgumentParser(prog="validation/job.py", description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="*", metavar="DIR")
    ap.add_argument("--master", default=None,
                    help="Spark master (default: the one spark-submit configured)")
    ap.add_argument("--expected", default=None)
    ap.add_argument("--json", dest="as_json", action="store_true")
    ap.add_argument("--report", default=None)
    ap.add_argument("--export", nargs=2, metavar=("FORMAT", "DIR"), default=None)
    ap.add_argument("--max-keys", type=int, default=MAX_KEYS)
    ap.add_argument("--conf", action="append", default=[])
    add_live_arguments(ap)
    a = ap.parse_args(argv)
    if a.export and a.export[0] != "parquet":
        ap.error("--export supports only: parquet DIR")
    try:
        conf = parse_conf(a.conf)
        live = live_settings(a.cluster, a.control_plane, a.prefix, a.secret_file, a.cache,
                             a.parallel, a.rate, (a.tls_ca, a.tls_cert, a.tls_key),
                             (a.etcd_ca, a.etcd_cert, a.etcd_key, a.etcd_user, a.etcd_password_file))
    except ValidationError as exc:
        ap.error(str(exc))
    if not a.dirs and live is None:
        ap.error("give node data folders DIR..., or --cluster/--control-plane")
    return execute(a.dirs, master=a.master, expected=a.expected, as_json=a.as_json,
                   report=a.report, export=a.export[1] if a.export else None,
                   max_keys=a.max_keys, conf=conf, partitions=a.partitions, live=live)


if __name__ == "__main__":
    sys.exit(main())
