"""``ferry demo``: a live node cluster rebalanced file-based under writes and validated
with Spark (the run itself: ferry/cluster_demo.py; its display: ferry/demo_ui.py)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile

import click

from .demo_ui import DemoUI, print_summary
from .demo_ui import passed as demo_passed


@click.command("demo")
@click.option("--dir", "root", type=click.Path(file_okay=False), default=None,
              help="Work folder (default: a fresh one under ./demo-run/).")
@click.option("--entries", type=int, default=None,
              help="Entries loaded before the join (default: 8,192 of 64 KiB, 512 MB).")
@click.option("--value-size", type=int, default=None,
              help="Bytes per loaded value (default 65,536 with the default --entries, "
                   "else 100).")
@click.option("--raw-mb", type=click.IntRange(min=0), default=256, show_default=True,
              help="MB of the raw sendfile over loopback measured beside the moves (0: none).")
@click.option("--no-protect", is_flag=True,
              help="Turn the nodes' foreground protection off ([rebalance] protect), "
                   "so the moves are not paced while the writer writes.")
@click.option("--tls", "use_tls", is_flag=True,
              help="The nodes' links mutual TLS (certificates of the cluster's CA, one per "
                   "node, one for the demo's clients and one for the live validator) instead "
                   "of the shared secret.")
@click.option("--partitions", default=16, show_default=True)
@click.option("--nodes", default=3, show_default=True, help="Nodes before the join.")
@click.option("--no-validate", is_flag=True, help="Skip the Spark validation job.")
@click.option("--master", default="local[2]", show_default=True, help="Spark master for validation.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--keep", is_flag=True, help="Keep the work folder.")
def demo(root: str | None, entries: int | None, value_size: int | None, raw_mb: int,
         no_protect: bool, use_tls: bool, partitions: int, nodes: int, no_validate: bool, master: str, as_json: bool, keep: bool) -> None:
    """Rebalance a live cluster file-based and validate it with Spark.

    Starts 3 node processes on loopback (their links authenticated with the cluster
    secret; --tls: mutual TLS with certificates of the cluster's CA), loads 512 MB of indexed entries (16 partitions
    of about 32 MB), measures a raw sendfile over loopback, adds a 4th node and moves its
    partitions file-based while a writer keeps writing, validates the running cluster
    with Spark (live mode, the writer still writing; with --tls over mutual TLS with a
    validator certificate), then checks the invariants on
    every node's files and runs the Spark validation job on them. The summary gives
    each move's rate, the whole rebalance's, and the raw rate beside them.
    Exit 0 only when every invariant holds and both validations pass."""
    ui = DemoUI(quiet=as_json)
    if root is None:
        os.makedirs("demo-run", exist_ok=True)
        root = tempfile.mkdtemp(prefix="ferry-demo-", dir="demo-run")
    elif os.path.exists(root) and os.listdir(root):
        raise click.ClickException(f"{root} is not empty; give a fresh folder")
    os.makedirs(root, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from .cluster_demo import ENTRIES, VALUE_SIZE, run_cluster_demo
    if value_size is None:
        value_size = VALUE_SIZE if entries is None else 100
    summary = run_cluster_demo(root, entries=ENTRIES if entries is None else entries,
                               value_size=value_size, partitions=partitions, nodes=nodes,
                               validate=not no_validate, master=master, ui=ui, raw_mb=raw_mb,
                               protect=not no_protect, tls=use_tls)
    summary["dir"] = root
    ok = demo_passed(summary)
    if as_json:
        click.echo(json.dumps(summary, indent=None))
    else:
        print_summary(ui, summary)
    if ok and not keep:
        shutil.rmtree(root, ignore_errors=True)
    sys.exit(0 if ok else 1)
