"""``ferry partition info|dump|verify FILE``: inspect partition files.

Imports only the decoder (no WAL, no store), so it works on a copied file anywhere.
"""
from __future__ import annotations

import base64
import json
import os
import sys

import click

from .decode import iter_entries
from .decode import verify as verify_file
from .errors import CorruptPageError
from .reader import read_meta


@click.group("partition")
def partition() -> None:
    """Inspect, dump and verify partition files (part-<p>.bin)."""


def _fail(e: CorruptPageError) -> None:
    click.echo(f"error: {e}", err=True)
    sys.exit(1)


@partition.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
def info(file: str, as_json: bool) -> None:
    """Meta page of FILE: partition, page size, page count, update counter."""
    try:
        meta = read_meta(file)
    except CorruptPageError as e:
        _fail(e)
        return
    size = os.path.getsize(file)
    out = {"file": file, "format_version": meta.version, "partition": meta.partition,
           "page_size": meta.page_size, "page_count": meta.page_count,
           "counter": meta.counter, "file_bytes": size}
    if as_json:
        click.echo(json.dumps(out))
        return
    for k, v in out.items():
        click.echo(f"{k:15} {v}")


@partition.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per entry: key, value (base64), counter, tombstone.")
@click.option("--tombstones/--no-tombstones", default=False, help="Include removed keys.")
def dump(file: str, as_json: bool, tombstones: bool) -> None:
    """Every live entry of FILE (exit 1 at the first bad page)."""
    try:
        for e in iter_entries(file, include_tombstones=tombstones):
            if as_json:
                click.echo(json.dumps({
                    "key": base64.b64encode(e.key).decode(),
                    "value": None if e.value is None else base64.b64encode(e.value).decode(),
                    "counter": e.counter, "tombstone": e.tombstone}))
            else:
                shown = "<removed>" if e.tombstone else _show(e.value or b"")
                click.echo(f"{e.counter:>10}  {_show(e.key)}  {shown}")
    except CorruptPageError as e:
        _fail(e)


def _show(b: bytes, limit: int = 60) -> str:
    text = repr(b)[2:-1]
    return text if len(text) <= limit else text[:limit] + f"... ({len(b)} bytes)"


@partition.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="One JSON object with every problem.")
def verify(file: str, as_json: bool) -> None:
    """Check every page CRC and structure of FILE; exit 1 naming the first bad page."""
    problems = verify_file(file)
    if as_json:
        click.echo(json.dumps({"file": file, "ok": not problems,
                               "problems": [p.__dict__ for p in problems]}))
    elif not problems:
        meta = read_meta(file)
        click.echo(f"ok: {file}: {meta.page_count} pages of {meta.page_size} bytes, "
                   f"counter {meta.counter}")
    else:
        first = problems[0]
        click.echo(f"error: {file}: page {first.page} (byte offset {first.offset}): "
                   f"{first.reason}", err=True)
        if len(problems) > 1:
            click.echo(f"  ... and {len(problems) - 1} more bad page(s)", err=True)
    if problems:
        sys.exit(1)
