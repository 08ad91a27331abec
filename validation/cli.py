"""``ferry validate``: the validation job from the command line.

Kept import-light: pyspark (and the job modules that need it) are imported inside
the command, so ``ferry --help`` never starts loading Spark.
"""
from __future__ import annotations

import sys

import click


@click.command("validate")
@click.argument("dirs", nargs=-1, type=click.Path())
@click.option("--cluster", default=None, metavar="HOST:PORT[,...]",
              help="Validate this RUNNING cluster (live mode): node RPC addresses.")
@click.option("--control-plane", "control_plane", default=None, metavar="URL[,...]",
              help="Live mode: find the nodes through the cluster's etcd.")
@click.option("--prefix", default="/ferry/default", show_default=True,
              help="Live mode: the cluster's key prefix in etcd.")
@click.option("--secret-file", type=click.Path(), default=None,
              help="Live mode: the cluster secret (mode 600).")
@click.option("--tls-ca", type=click.Path(dir_okay=False), default=None,
              help="Live mode, a cluster with mutual TLS: the cluster CA's certificate (with "
                   "--tls-cert and --tls-key; replaces the secret).")
@click.option("--tls-cert", type=click.Path(dir_okay=False), default=None,
              help="Live mode, mutual TLS: a validator certificate, ferry://validator/NAME "
                   "(ferry certs issue CA_DIR NAME --validator).")
@click.option("--tls-key", type=click.Path(dir_okay=False), default=None,
              help="Live mode, mutual TLS: the certificate's key.")
@click.option("--etcd-ca", type=click.Path(dir_okay=False), default=None,
              help="--control-plane over https: the CA that signed etcd's certificate "
                   "(default: $FERRY_ETCD_CA).")
@click.option("--etcd-cert", type=click.Path(dir_okay=False), default=None,
              help="--control-plane: a client certificate for etcd (default: $FERRY_ETCD_CERT).")
@click.option("--etcd-key", type=click.Path(dir_okay=False), default=None,
              help="--control-plane: that certificate's key (default: $FERRY_ETCD_KEY).")
@click.option("--etcd-user", default=None,
              help="--control-plane: an etcd user that may read the prefix, e.g. the cluster's "
                   "ferry-NAME-reader (default: $FERRY_ETCD_USER).")
@click.option("--etcd-password-file", type=click.Path(dir_okay=False), default=None,
              help="--control-plane: a file holding that user's password "
                   "(default: $FERRY_ETCD_PASSWORD_FILE).")
@click.option("--cache", "caches", multiple=True, help="Live mode: only this cache (repeatable).")
@click.option("--parallel", type=click.IntRange(min=1), default=4, show_default=True,
              help="Live mode: partitions fenced and fetched at once, cluster-wide.")
@click.option("--rate", default=None, metavar="BYTES/S",
              help="Live mode: cap on validation transfers, cluster-wide (default 100MB; 0 = none).")
@click.option("--partitions", type=click.IntRange(min=1, max=65536), default=None,
              help="Partition count per cache, to place --expected rows without a partition "
                   "column (default: the cluster's, or the highest partition file + 1).")
@click.option("--master", default="local[*]", show_default=True,
              help="Spark master URL: local[N], spark://host:7077, yarn, k8s://...")
@click.option("--expected", type=click.Path(), default=None,
              help="Expected contents: JSON lines or Parquet "
                   "(key, value|value_hash[, partition][, cache]).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a summary.")
@click.option("--report", type=click.Path(), default=None, help="Write an HTML report here.")
@click.option("--export", type=(click.Choice(["parquet"]), click.Path()), default=None,
              metavar="parquet DIR",
              help="Write the decoded entries as Parquet, by cache and partition.")
@click.option("--max-keys", type=click.IntRange(min=0), default=100, show_default=True,
              help="Differing keys listed per divergent partition (all are counted).")
@click.option("--conf", multiple=True, metavar="KEY=VALUE",
              help="Extra Spark setting (repeatable).")
def validate(dirs: tuple[str, ...], cluster: str | None, control_plane: str | None, prefix: str,
             secret_file: str | None, tls_ca: str | None, tls_cert: str | None, tls_key: str | None,
             etcd_ca: str | None, etcd_cert: str | None, etcd_key: str | None,
             etcd_user: str | None, etcd_password_file: str | None,
             caches: tuple[str, ...], parallel: int, rate: str | None,
             partitions: int | None, master: str, expected: str | None, as_json: bool,
             report: str | None, export: tuple[str, str] | None, max_keys: int,
             conf: tuple[str, ...]) -> None:
    """Validate partitions with Spark: of node data folders DIR... (stopped nodes,
    backups), or of a running cluster (--cluster / --control-plane).

    DIR is a node data folder (DIR/caches/<cache>/part-<p>.bin, node id in
    DIR/node.id) or a folder of part-<p>.bin files. Live mode fetches every in-sync
    copy through the nodes' transfer agents, all copies of a partition at one update
    counter; it authenticates with --secret-file, or on a cluster with mutual TLS with
    a validator certificate (--tls-ca, --tls-cert, --tls-key). Exit status: 0 passed, 1 replicas diverge / corrupt pages /
    expected-data mismatches / copies not checked, 2 error.
    """
    from .errors import ValidationError
    from .job import execute, live_settings, parse_conf  # imports pyspark

    try:
        settings = parse_conf(list(conf))
        live = live_settings(cluster, control_plane, prefix, secret_file, list(caches),
                             parallel, rate, (tls_ca, tls_cert, tls_key),
                             (etcd_ca, etcd_cert, etcd_key, etcd_user, etcd_password_file))
    except ValidationError as exc:
        raise click.UsageError(str(exc)) from exc
    if not dirs and live is None:
        raise click.UsageError("give node data folders DIR..., or --cluster/--control-plane "
                               "for a running cluster")
    sys.exit(execute(list(dirs), master=master, expected=expected, as_json=as_json,
                     report=report, export=export[1] if export else None,
                     max_keys=max_keys, conf=settings, partitions=partitions, live=live))
