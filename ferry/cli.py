"""``ferry``: one command, one group per package, each imported lazily.

A group lives in ``<package>/cli.py`` as a click object named in ``GROUPS``. Listing
and ``--help`` read only this table; a package's module is imported when its group runs,
so pyspark (validation) is never imported for ``ferry --help``.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import click

# name -> (module, attribute, one-line help)
GROUPS: dict[str, tuple[str, str, str]] = {
    "demo": ("ferry.demo", "demo", "Run the end-to-end demonstration on loopback."),
    "wal": ("wal.cli", "wal", "Dump and verify write-ahead logs."),
    "partition": ("checkpoint.cli", "partition", "Inspect, dump and verify partition files."),
    "transfer": ("transfer.cli", "transfer", "Serve and fetch partition files."),
    "secret": ("transfer.cli", "secret", "Generate a cluster secret."),
    "index": ("indexes.cli", "index", "Rebuild and verify LMDB secondary indexes."),
    "node": ("node.cli", "node", "Run a storage node."),
    "cluster": ("node.cli", "cluster", "Cluster status and data operations."),
    "certs": ("node.etcd_cli", "certs", "A CA and certificates for etcd (the control plane)."),
    "etcd": ("node.etcd_cli", "etcd", "etcd's roles, users and auth for a cluster."),
    "sim": ("cluster_sim.cli", "sim", "Crash-point simulation scenarios and matrices."),
    "validate": ("validation.cli", "validate", "Validate partitions with Spark."),
}


def _available(module: str) -> bool:
    """True when ``module`` exists, without importing it (only its parent package's
    spec is looked up, which does not execute the package)."""
    pkg, _, leaf = module.rpartition(".")
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(os.path.exists(os.path.join(d, leaf + ".py"))
               for d in spec.submodule_search_locations)


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [n for n, (m, _, _) in GROUPS.items() if _available(m)]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in GROUPS or not _available(GROUPS[name][0]):
            return None
        module, attr, _ = GROUPS[name]
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(n, GROUPS[n][2]) for n in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ferry-rebalance")
def cli() -> None:
    """Ferry: file-based partition rebalancing under live writes."""


def main() -> None:
    try:
        cli.main(prog_name="ferry", standalone_mode=True)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - a FerryError becomes one line, anything else is re-raised
        # A FerryError is an error on purpose: its message says what, where and what to
        # do. One a command did not turn into its own output still gets one line, not
        # a traceback; anything else is a bug and keeps its traceback.
        from faults import FerryError
        if not isinstance(e, FerryError):
            raise
        group = next((a for a in sys.argv[1:] if a in GROUPS), "")
        print(f"ferry{' ' + group if group else ''}: error: {' '.join(str(e).split())}",
              file=sys.stderr)
        sys.exit(1)
