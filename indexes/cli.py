"""``ferry index``: rebuild and verify LMDB secondary indexes from partition files.

Definitions: ``--def name=field.path[:unique][:skip|refuse][:type=T]`` (repeatable) or
``--defs FILE`` (JSON: a list of {"name", "field", "unique", "on_bad", "type"}, or
{"codec": ..., "indexes": [...]}). Without either, the definitions stored in the
index directory by its last use are used.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any

import click


def _definitions(defs: tuple[str, ...], defs_file: str | None) -> tuple[list[Any] | None, str | None]:
    from .definitions import IndexDefinition
    from .errors import IndexDefinitionError
    out: list[IndexDefinition] = []
    codec = None
    if defs_file:
        try:
            with open(defs_file, "rb") as f:
                body = json.loads(f.read().decode("utf-8"))
        except OSError as e:
            raise IndexDefinitionError(f"--defs {defs_file}: cannot read it: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise IndexDefinitionError(f"--defs {defs_file}: not UTF-8 text (byte {e.start}); "
                                       "write the definitions as JSON in UTF-8") from None
        except (ValueError, RecursionError) as e:
            raise IndexDefinitionError(f"--defs {defs_file}: not valid JSON ({e})") from None
        if isinstance(body, dict):
            codec = body.get("codec")
            body = body.get("indexes", [])
        if not isinstance(body, list) or not all(isinstance(d, dict) for d in body):
            raise IndexDefinitionError(
                f"--defs {defs_file}: expected a JSON list of definitions "
                '([{"name", "field", "unique", "on_bad", "type"}, ...]) or '
                '{"codec": ..., "indexes": [...]}')
        out.extend(IndexDefinition.from_json(d) for d in body)
    out.extend(IndexDefinition.parse(d) for d in defs)
    return (out or None), codec


def _open(index: str, defs: tuple[str, ...], defs_file: str | None, codec: str | None,
          reset_corrupt: bool = False) -> Any:
    from .store import IndexStore
    definitions, file_codec = _definitions(defs, defs_file)
    return IndexStore.open(index, definitions, codec=codec or file_codec,
                           reset_corrupt=reset_corrupt)


class InputError(click.ClickException):
    """A wrong path or argument: exit status 2 (1 means the index differs or is corrupt)."""

    exit_code = 2


def _index_dir(index: str) -> str:
    """``--index`` names the environment's directory; its ``data.mdb`` is taken to mean
    the directory too (IndexCorruptError's advice names the file)."""
    if os.path.basename(index) == "data.mdb" and os.path.isfile(index):
        return os.path.dirname(index) or "."
    return index


def _existing_index(index: str) -> str:
    """The directory of an index that exists. Opening a mistyped path would create an
    empty index there and report every partition missing."""
    index = _index_dir(index)
    if not os.path.isdir(index):
        what = "is not a directory" if os.path.exists(index) else "does not exist"
        raise InputError(f"--index {index} {what}; give the directory of an existing index "
                         "(`ferry index rebuild` creates one)")
    if not os.path.isfile(os.path.join(index, "data.mdb")):
        raise InputError(f"--index {index} is not an index (no data.mdb in it); give the "
                         "directory of an existing index (`ferry index rebuild` creates one)")
    return index


def _partitions(source: Any, chosen: tuple[int, ...]) -> list[int]:
    return sorted(chosen) if chosen else source.partitions()


_common = [
    click.option("--data", "data", required=True, type=click.Path(exists=True),
                 help="Directory of part-<p>.bin files (or one partition file)."),
    click.option("--index", "index", required=True, type=click.Path(),
                 help="Index directory (one LMDB environment)."),
    click.option("--partition", "-p", "partitions", type=int, multiple=True,
                 help="Partition(s) to handle; default: every part-<p>.bin in --data."),
    click.option("--def", "defs", multiple=True, metavar="NAME=FIELD[:OPTS]",
                 help="Index definition; repeatable. OPTS: unique, skip, refuse, type=T."),
    click.option("--defs", "defs_file", type=click.Path(exists=True),
                 help="JSON file of index definitions."),
    click.option("--codec", type=click.Choice(["json", "msgpack"]), default=None,
                 help="Document codec of the values (default: stored, else json)."),
]


def common(f: Any) -> Any:
    for opt in reversed(_common):
        f = opt(f)
    return f


@click.group("index")
def index() -> None:
    """Rebuild and verify LMDB secondary indexes."""


@index.command("rebuild")
@common
@click.option("--memory", type=click.IntRange(min=1), default=256, show_default=True,
              help="MiB of sort buffer before runs spill to scratch files.")
@click.option("--reset-corrupt", is_flag=True,
              help="Move a corrupt index file aside and start empty.")
@click.option("--json", "as_json", is_flag=True, help="Print results as JSON.")
def rebuild_cmd(data: str, index: str, partitions: tuple[int, ...], defs: tuple[str, ...],
                defs_file: str | None, codec: str | None, memory: int, reset_corrupt: bool,
                as_json: bool) -> None:
    """Rebuild the index of partitions from their partition files."""
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeRemainingColumn)

    from checkpoint import CheckpointError  # the partition files' decoder (lower layer)

    from .errors import IndexStoreError
    from .source import PartitionFileSource
    index = _index_dir(index)
    try:
        store = _open(index, defs, defs_file, codec, reset_corrupt)
    except OSError as e:
        raise click.ClickException(f"--index {index}: cannot create or open it: "
                                   f"{e.strerror}") from None
    except (IndexStoreError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    source = PartitionFileSource(data)
    results = []
    console = Console(stderr=True)
    try:
        if not store.definitions:
            raise click.ClickException(f"no index definitions given and none stored in {index}; "
                                       "use --def or --defs")
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.fields[rate]:>10}"), TimeRemainingColumn(),
                      console=console, disable=as_json or not console.is_terminal) as bar:
            for p in _partitions(source, partitions):
                task = bar.add_task(f"partition {p}: clear", total=None, rate="")

                def on(pr: Any, task: Any = task, p: int = p) -> None:
                    bar.update(task, description=f"partition {p}: {pr.stage}",
                               completed=pr.done, total=pr.total,
                               rate=f"{pr.rate:,.0f}/s" if pr.rate else "")
                res = store.rebuild(p, source, progress=on, memory_limit=memory << 20)
                results.append(res.to_dict())
                if not as_json:
                    console.print(f"partition {p}: {res.entries:,} entries from {res.scanned:,} "
                                  f"values in {res.seconds:.2f}s ({res.bad} bad skipped, "
                                  f"{res.unique_conflicts} unique conflicts, {res.runs} runs)")
        # which code did the per-value work (indexes/accel.py): "c" or "python"
        value_path = "c" if store.indexer.accelerated else "python"
    except (IndexStoreError, CheckpointError) as e:  # CheckpointError: e.g. a corrupt page
        raise click.ClickException(str(e)) from None
    finally:
        store.close()
    if as_json:
        click.echo(json.dumps({"index": index, "partitions": results, "value_path": value_path},
                              default=str))
    else:
        console.print(f"per-value work: {value_path} (FERRY_INDEX_ACCEL=0 forces python)")


@index.command("verify")
@common
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--max-details", type=click.IntRange(min=0), default=100, show_default=True,
              help="Entries listed per kind of mismatch and partition.")
@click.option("--structure", is_flag=True,
              help="First check the LMDB file's structure offline (slow on big files).")
def verify_cmd(data: str, index: str, partitions: tuple[int, ...], defs: tuple[str, ...],
               defs_file: str | None, codec: str | None, as_json: bool, max_details: int,
               structure: bool) -> None:
    """Compare the index with the partition files: entries missing, extra, or pointing
    to the wrong value. Exit status 1 when anything differs."""
    from .errors import IndexStoreError
    from .source import PartitionFileSource
    try:
        index = _existing_index(index)
    except InputError as e:
        if as_json:
            click.echo(json.dumps({"index": index, "ok": False, "error": e.message,
                                   "structure": []}))
            sys.exit(e.exit_code)
        raise
    problems: list[str] = []
    if structure:
        import lmdb.verify as lv
        try:
            problems = lv.verify(os.path.join(index, "data.mdb"))
        except (lv.VerifyError, OSError) as e:
            problems = [str(e)]
    try:
        store = _open(index, defs, defs_file, codec)
    except (IndexStoreError, OSError, ValueError) as e:
        if as_json:
            click.echo(json.dumps({"index": index, "ok": False, "error": str(e),
                                   "structure": problems}))
            sys.exit(1)
        raise click.ClickException(str(e)) from None
    source = PartitionFileSource(data)
    from checkpoint import CheckpointError
    try:
        parts = _partitions(source, partitions)
        reports = [store.verify(p, source, max_details=max_details) for p in parts]
        orphans = [p for p in store.ready_partitions() if p not in parts and not partitions]
    except (IndexStoreError, CheckpointError) as e:     # e.g. a corrupt partition file
        raise click.ClickException(str(e)) from None
    finally:
        store.close()
    ok = all(r.ok for r in reports) and not problems and not orphans
    if as_json:
        click.echo(json.dumps({"index": index, "ok": ok, "structure": problems,
                               "orphan_partitions": orphans,
                               "partitions": [r.to_dict() for r in reports]}, default=str))
    else:
        _print_reports(reports, problems, orphans)
    sys.exit(0 if ok else 1)


def _print_reports(reports: list[Any], problems: list[str], orphans: list[int]) -> None:
    from rich.console import Console
    from rich.table import Table
    console = Console()
    for p in problems:
        console.print(f"[red]LMDB structure:[/red] {p}")
    if orphans:
        console.print(f"[yellow]ready in the index but no partition file:[/yellow] {orphans}")
    t = Table("partition", "ready", "expected", "indexed", "missing", "extra", "wrong", "bad",
              "status")
    for r in reports:
        t.add_row(str(r.partition), "yes" if r.ready else "NO", str(r.expected), str(r.indexed),
                  str(r.missing_count), str(r.extra_count), str(r.wrong_count), str(r.bad),
                  "[green]ok[/green]" if r.ok else "[red]DIFFERS[/red]")
    console.print(t)
    bad = [r.partition for r in reports if not r.ok]
    console.print(f"[red]index DIFFERS from the data in partitions {bad}[/red]" if bad
                  else f"index matches the data in {len(reports)} partition(s)")
    for r in reports:
        for e in r.missing[:5]:
            console.print(f"  p{r.partition} missing: {e.to_dict()}")
        for e in r.extra[:5]:
            console.print(f"  p{r.partition} extra:   {e.to_dict()}")
        for w in r.wrong[:5]:
            console.print(f"  p{r.partition} wrong:   {w.to_dict()}")
