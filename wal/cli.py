"""``ferry wal``: dump, verify and repair a write-ahead log directory.

``dump`` and ``verify`` only read (they work while a writer appends); ``repair`` takes
the writer's lock and changes the log only with ``--backup`` given.
"""
from __future__ import annotations

import base64
import json
import sys

import click

from .errors import CorruptRecordError, WalError


@click.group()
def wal() -> None:
    """Dump, verify and repair write-ahead logs."""


@wal.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--from", "from_lsn", type=int, default=None, help="First LSN to print.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per record: lsn, type, length, payload (base64).")
def dump(directory: str, from_lsn: int | None, as_json: bool) -> None:
    """Print the records of the log in DIRECTORY."""
    from .log import WalReader
    out = sys.stdout
    try:
        for rec in WalReader(directory).read_from(from_lsn):
            lsn, typ, payload = rec
            if as_json:
                out.write(json.dumps({"lsn": lsn, "type": typ, "length": len(payload),
                                      "payload": base64.b64encode(payload).decode()}) + "\n")
            else:
                shown = payload[:48].hex() + ("..." if len(payload) > 48 else "")
                out.write(f"{lsn}\t{typ}\t{len(payload)}\t{shown}\n")
    except WalError as e:
        out.flush()
        click.echo(f"error: {e}", err=True)
        sys.exit(1)


@wal.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def verify(directory: str, as_json: bool) -> None:
    """Check every segment and record; exit 1 at the first corruption (file, offset)."""
    from .recovery import verify as run
    rep = run(directory)
    if as_json:
        from .accel import status
        # append_path: which append path a writer opened here now would use (C or Python).
        click.echo(json.dumps({**rep.as_dict(), "append_path": status()}))
    else:
        span = "empty" if rep.last_lsn is None or rep.first_lsn is None or \
            rep.last_lsn < rep.first_lsn else f"LSN {rep.first_lsn}..{rep.last_lsn}"
        click.echo(f"{rep.directory}: {rep.segments} segment(s), {rep.records} record(s), {span}")
        if rep.torn is not None:
            click.echo(f"torn tail: {rep.torn[0]} at offset {rep.torn[1]} ({rep.torn[2]} bytes); "
                       "the next writer open cuts it (never acknowledged)")
        if rep.corruption is not None:
            path, off, why = rep.corruption
            click.echo(f"CORRUPT: {path} at offset {off}: {why}", err=True)
    sys.exit(0 if rep.ok else 1)


@wal.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--backup", required=True, type=click.Path(file_okay=False),
              help="Copy the log here before changing anything (must be new or empty).")
def repair(directory: str, backup: str) -> None:
    """Cut the log at its first corruption, dropping every record after it.

    Torn tails need no repair: opening the log for writing cuts them."""
    from .log import Wal
    from .recovery import repair as run
    from .recovery import verify as check
    rep = check(directory)
    if rep.ok and rep.torn is None:
        click.echo(f"{directory}: clean, nothing to repair")
        return
    try:
        for line in run(directory, backup):
            click.echo(line)
        Wal.open(directory, sync="none").close()      # cuts a torn tail, if one is left
    except CorruptRecordError as e:
        click.echo(f"error: repair left damage behind: {e}", err=True)
        sys.exit(1)
    except WalError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    after = check(directory)
    click.echo(f"{directory}: now {after.records} record(s), LSN {after.first_lsn}..{after.last_lsn}")
