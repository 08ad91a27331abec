"""``ferry wal``: dump, verify and repair a write-ahead log directory.

``dump`` and ``verify`` only read (they work while a writer appends); ``repair`` takes
the writer's lock and changes the log only with ``--backup`` given.
"""
from __future__ import annotations

import base64
import json
import sys
from typing import NoReturn

import click

from .errors import CorruptRecordError, WalError

# Exit status: 0 fine, 1 the log is corrupt (`repair` can cut it), 2 something a person
# has to fix first (a directory where a segment should be, an unreadable file, usage).
CORRUPT, BLOCKED = 1, 2


def _fail(e: Exception, prefix: str = "error: ") -> NoReturn:
    """One line on stderr -- what, where, what to do -- and the exit status for it."""
    if isinstance(e, OSError):
        where = f" {e.filename}" if e.filename else ""
        click.echo(f"{prefix}cannot read{where}: {e.strerror or e}; check that the "
                   "write-ahead log directory holds only its own files, readable by "
                   "this user", err=True)
        sys.exit(BLOCKED)
    click.echo(f"{prefix}{e}", err=True)
    sys.exit(CORRUPT if isinstance(e, CorruptRecordError) else BLOCKED)


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
    except (WalError, OSError) as e:
        out.flush()
        _fail(e)


@wal.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def verify(directory: str, as_json: bool) -> None:
    """Check every segment and record; exit 1 at the first corruption (file, offset),
    2 when something in the directory is not a segment file that can be read."""
    from .recovery import verify as run
    try:
        rep = run(directory)
    except (WalError, OSError) as e:
        _fail(e)
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
    try:
        rep = check(directory)
    except (WalError, OSError) as e:
        _fail(e)
    if rep.ok and rep.torn is None:
        click.echo(f"{directory}: clean, nothing to repair")
        return
    try:
        for line in run(directory, backup):
            click.echo(line)
        Wal.open(directory, sync="none").close()      # cuts a torn tail, if one is left
        after = check(directory)
    except CorruptRecordError as e:
        _fail(e, "error: repair left damage behind: ")
    except (WalError, OSError) as e:
        _fail(e)
    click.echo(f"{directory}: now {after.records} record(s), LSN {after.first_lsn}..{after.last_lsn}")
