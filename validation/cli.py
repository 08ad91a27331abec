"""``ferry validate``: the validation job from the command line.

Kept import-light: pyspark (and the job modules that need it) are imported inside
the command, so ``ferry --help`` never starts loading Spark.
"""
from __future__ import annotations

import sys

import click


@click.command("validate")
@click.argument("dirs", nargs=-1, required=True, type=click.Path())
@click.option("--master", default="local[*]", show_default=True,
              help="Spark master URL: local[N], spark://host:7077, yarn, k8s://...")
@click.option("--expected", type=click.Path(), default=None,
              help="Expected contents: JSON lines or Parquet "
                   "(key, value|value_hash, partition[, cache]).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a summary.")
@click.option("--report", type=click.Path(), default=None, help="Write an HTML report here.")
@click.option("--export", type=(click.Choice(["parquet"]), click.Path()), default=None,
              metavar="parquet DIR",
              help="Write the decoded entries as Parquet, by cache and partition.")
@click.option("--max-keys", type=click.IntRange(min=0), default=100, show_default=True,
              help="Differing keys listed per divergent partition (all are counted).")
@click.option("--conf", multiple=True, metavar="KEY=VALUE",
              help="Extra Spark setting (repeatable).")
def validate(dirs: tuple[str, ...], master: str, expected: str | None, as_json: bool,
             report: str | None, export: tuple[str, str] | None, max_keys: int,
             conf: tuple[str, ...]) -> None:
    """Validate partitions of node data folders DIR... with Spark.

    DIR is a node data folder (DIR/caches/<cache>/part-<p>.bin, node id in
    DIR/node.id) or a folder of part-<p>.bin files. Exit status: 0 passed,
    1 replicas diverge / corrupt pages / expected-data mismatches, 2 error.
    """
    from .errors import ValidationError
    from .job import execute, parse_conf  # imports pyspark

    try:
        settings = parse_conf(list(conf))
    except ValidationError as exc:
        raise click.UsageError(str(exc)) from exc
    sys.exit(execute(list(dirs), master=master, expected=expected, as_json=as_json,
                     report=report, export=export[1] if export else None,
                     max_keys=max_keys, conf=settings))
