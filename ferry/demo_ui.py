"""What ``ferry demo`` shows: progress while it runs (stderr) and the summary (stdout).

On a terminal, rich live displays: a bar for the load, one row per running move with
its stage, bytes, rate and ETA, and the Spark job's tasks; then the summary as tables
(one row per move, a column per stage) and the invariants as a checklist. When the
stream is not a terminal (a pipe, a log file, a test capturing output), the same calls
print plain lines: one per step, one each time a move enters a stage, and the tables
without colour. ``--json`` silences the progress; the summary is then the JSON object.
"""
from __future__ import annotations

import os
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID,
                           TextColumn, TimeElapsedColumn, TimeRemainingColumn)
from rich.table import Column, Table

PLAIN_WIDTH = 120           # tables printed to a file or pipe (rich's default is 80)


def _console(stderr: bool, quiet: bool = False) -> Console:
    c = Console(stderr=stderr, quiet=quiet, highlight=False)
    if not c.is_terminal and "COLUMNS" not in os.environ:
        c.width = PLAIN_WIDTH
    return c


def mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


@dataclass
class MoveRow:
    """One running move as a demo sees it at a poll."""
    key: str                    # what identifies it across polls: "default/3 -> n4"
    stage: str
    bytes: int = 0
    bytes_total: int = 0
    rate_bps: float | None = None
    eta_s: float | None = None
    label: str = ""             # what names it on screen (default: the key)


class DemoUI:
    def __init__(self, quiet: bool = False) -> None:
        self.err = _console(stderr=True, quiet=quiet)
        self.out = _console(stderr=False)
        self.live = self.err.is_terminal and not quiet
        utf = (self.out.encoding or "").lower().startswith("utf")
        self.ok_mark, self.bad_mark = ("✓", "✗") if utf else ("ok", "FAILED")
        self.arrow = "→" if utf else "->"

    def step(self, text: str) -> None:
        """A phase of the demo begins (plain text: no markup is read from it)."""
        self.err.print(f"[bold cyan]>[/] {escape(text)}")

    def note(self, text: str) -> None:
        self.err.print(f"  {escape(text)}", style="dim")

    # -- load -------------------------------------------------------------------------
    @contextmanager
    def counter(self, what: str, total: int) -> Iterator[Callable[[int], None]]:
        """``report(done)`` as the work proceeds: a bar with rate and ETA on a terminal,
        else a line every 5 s and one at the end."""
        if self.live:
            with Progress(TextColumn("  {task.description}"), BarColumn(bar_width=40),
                          MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                          TimeRemainingColumn(), console=self.err, transient=False) as prog:
                task = prog.add_task(what, total=total, rate="")
                t0 = time.monotonic()

                def report(done: int) -> None:
                    el = max(time.monotonic() - t0, 1e-6)
                    prog.update(task, completed=done, rate=f"{done / el:,.0f}/s")
                yield report
            return
        t0 = time.monotonic()
        last = [t0]

        def report_plain(done: int) -> None:
            now = time.monotonic()
            if now - last[0] >= 5 or done >= total:
                last[0] = now
                self.note(f"{what} {done:,}/{total:,} ({done / max(now - t0, 1e-6):,.0f}/s)")
        yield report_plain

    # -- moves ------------------------------------------------------------------------
    @contextmanager
    def moves(self, overall: str) -> Iterator["MovesView"]:
        """Live rows of the running moves; ``overall`` names the bar of the whole
        rebalance (e.g. "partitions settled")."""
        if not self.live:
            view = MovesView(self, None, overall)
            yield view
            view.close()
            return
        prog = Progress(SpinnerColumn(finished_text=self.ok_mark),
                        TextColumn("{task.description}", style="bold", table_column=Column(min_width=20)),
                        TextColumn("{task.fields[stage]}", style="magenta", table_column=Column(min_width=15)),
                        BarColumn(bar_width=28), TextColumn("{task.fields[size]}"),
                        TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[eta]}"),
                        console=self.err, transient=False)
        with prog:
            view = MovesView(self, prog, overall)
            yield view
            view.close()

    # -- a step without figures of its own (Spark) --------------------------------------
    @contextmanager
    def tasks(self, what: str) -> Iterator[Callable[[int, int, str], None]]:
        """``report(done, total, detail)``: a spinner, a bar and the elapsed time on a
        terminal; else a line for each step before the tasks, then one every 5 s."""
        if self.live:
            with Progress(SpinnerColumn(), TextColumn("  {task.description}"),
                          BarColumn(bar_width=30), MofNCompleteColumn(),
                          TextColumn("{task.fields[detail]}", style="dim"), TimeElapsedColumn(),
                          console=self.err, transient=False) as prog:
                task = prog.add_task(what, total=None, detail="")

                def report(done: int, total: int, detail: str) -> None:
                    prog.update(task, completed=done, total=total or None, detail=detail)
                yield report
                t = prog.tasks[0]
                prog.update(task, completed=t.total or 1, total=t.total or 1, detail="")
            return
        t0 = time.monotonic()
        last = [t0 - 5.0]
        seen = [0, 0]

        def report_plain(done: int, total: int, detail: str) -> None:
            now = time.monotonic()
            if not total:                           # a step before any task: say each one
                self.note(f"{what}: {detail}")
                return
            seen[:] = [done, total]
            if now - last[0] >= 5:                  # tasks: a line every 5 s at most
                last[0] = now
                self.note(f"{what}: {done}/{total} tasks, {now - t0:.0f} s ({detail or 'running'})")
        yield report_plain
        if seen[1]:
            self.note(f"{what}: {seen[1]}/{seen[1]} tasks, {time.monotonic() - t0:.0f} s")


class MovesView:
    """Rows of running moves, updated from each poll; a move that is no longer
    running reached OWNING."""

    def __init__(self, ui: DemoUI, prog: Progress | None, overall: str) -> None:
        self.ui, self.prog = ui, prog
        self.rows: dict[str, TaskID | None] = {}
        self.labels: dict[str, str] = {}
        self.stages: dict[str, str] = {}
        self.done: set[str] = set()
        self.overall_name = overall
        self.overall: TaskID | None = None
        self._settled: tuple[int, int] | None = None

    def update(self, rows: list[MoveRow], settled: tuple[int, int] | None = None) -> None:
        """``rows``: the moves running now; ``settled``: (done, total) for the bar
        of the whole rebalance."""
        running = {r.key for r in rows}
        for r in rows:
            self._show(r)
        for key in list(self.rows):
            if key not in running and key not in self.done:
                self._owning(key)
        if settled is not None:
            self._overall(*settled)

    def _show(self, r: MoveRow) -> None:
        self.done.discard(r.key)                 # a move that restarted runs again
        self.labels[r.key] = label = r.label or r.key
        if self.prog is None:
            if self.stages.get(r.key) != r.stage:
                size = f"  {mb(r.bytes)} of {mb(r.bytes_total)}" if r.bytes_total else ""
                self.ui.note(f"move {label}: {r.stage}{size}")
            self.rows.setdefault(r.key, None)
            self.stages[r.key] = r.stage
            return
        fields: dict[str, Any] = {"stage": r.stage,
                                  "size": f"{mb(r.bytes)}/{mb(r.bytes_total)}" if r.bytes_total else "",
                                  "rate": f"{r.rate_bps / 1e6:.1f} MB/s" if r.rate_bps else "",
                                  "eta": f"eta {r.eta_s:.1f}s" if r.eta_s is not None else ""}
        total = r.bytes_total or None
        task = self.rows.get(r.key)
        if task is None:
            self.rows[r.key] = self.prog.add_task(label, total=total, completed=r.bytes, **fields)
        else:
            self.prog.update(task, description=label, total=total, completed=r.bytes,
                             **fields)
        self.stages[r.key] = r.stage

    def _owning(self, key: str) -> None:
        self.done.add(key)
        self.stages[key] = "OWNING"
        if self.prog is None:
            self.ui.note(f"move {self.labels.get(key, key)}: OWNING")
            return
        task = self.rows[key]
        assert task is not None                  # with a Progress, _show added every row's task
        t = self.prog.tasks[[x.id for x in self.prog.tasks].index(task)]
        total = t.total or 1
        # OWNING: the whole file arrived, whatever the last poll saw of it
        size = f"{mb(t.total)}/{mb(t.total)}" if t.total else t.fields.get("size", "")
        self.prog.update(task, total=total, completed=total, stage="OWNING", size=size, rate="", eta="")

    def _overall(self, done: int, total: int) -> None:
        if self._settled == (done, total):
            return
        self._settled = (done, total)
        if self.prog is None:
            self.ui.note(f"{self.overall_name}: {done}/{total}")
            return
        fields: dict[str, Any] = {"stage": "", "size": f"{done}/{total}", "rate": "", "eta": ""}
        if self.overall is None:
            self.overall = self.prog.add_task(self.overall_name, total=total, completed=done, **fields)
        else:
            self.prog.update(self.overall, total=total, completed=done, **fields)

    def close(self) -> None:
        for key in list(self.rows):
            if key not in self.done:
                self._owning(key)


# -- the summary --------------------------------------------------------------------------
# how the checklist names the invariants of both demos (others: underscores as spaces)
INVARIANTS = {
    "acknowledged_writes_on_every_owner": "every acknowledged write on every owner",
    "owners_hold_identical_entries": "the owners of a partition hold identical entries",
    "indexes_agree_with_data": "indexes agree with the data",
    "no_temp_wal_delta_or_temp_file_left": "no temp WAL, delta or temp file left",
    "writer_had_no_error": "the writer had no error",
    "b_plus_1_owning_copies": "B+1 OWNING copies of every partition",
    "every_owner_in_sync": "every owner in the partition's in-sync set",
    "moved_partitions_equal_supplier": "moved partitions equal the supplier's, entry by entry",
    "no_temp_wal_left": "no temp WAL left",
    "no_delta_or_temp_file_left": "no delta or temp file left",
}
# a multi-line header keeps the table within 120 columns
HEADERS = {"index rebuild": "index\nrebuild", "checkpoint wait": "checkpoint\nwait"}


def print_summary(ui: DemoUI, s: dict[str, Any]) -> None:
    """The demo's outcome: figures, one row per move with a column per stage, the
    invariants as a checklist, the validation, the verdict. Not on a terminal: the
    same text without colour and without trailing blanks."""
    out = ui.out
    if out.is_terminal:
        _summary(ui, s)
        return
    with out.capture() as cap:
        _summary(ui, s)
    out.file.write("\n".join(line.rstrip() for line in cap.get().splitlines()) + "\n")
    out.file.flush()


def _summary(ui: DemoUI, s: dict[str, Any]) -> None:
    out = ui.out
    out.print()
    out.print(f"[bold]Ferry demo[/]: {escape(s['flow'])}")
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    if "control_plane" in s:
        cp = s["control_plane"]
        facts.add_row("control plane", f"etcd {escape(str(cp['etcd']))}, controller {cp['controller']}, "
                                       f"lease TTL {cp['lease_ttl_s']} s")
    if "node_links" in s:
        facts.add_row("node links", escape(str(s["node_links"])))
    if "load_put_seconds" in s:
        load = f"{s['entries']:,} entries in {s['load_put_seconds']} s ({s['load_entries_per_s']:,}/s"
        if "data_bytes" in s:
            load += f", {mb(s['data_bytes'])} of values, {s['load_mb_per_s']} MB/s"
        facts.add_row("load", load + ")")
    for name, text in rate_lines(s):
        facts.add_row(name, text)
    writes = f"{s['writes_during_move']:,} during the moves"
    if "updates_replayed" in s:
        writes += (f" ({s['updates_buffered_in_temp_wal']:,} buffered in temp WALs, "
                   f"{s['updates_replayed']:,} replayed)")
    if "writes_total" in s:
        writes += f", {s['writes_total']:,} in all"
    facts.add_row("writes", writes)
    out.print(facts)
    if s.get("moves"):
        out.print(moves_table(ui, s["moves"], s["stages"]))
    out.print("[bold]Invariants[/]")
    for name, ok in s["invariants"].items():
        mark = f"[green]{ui.ok_mark}[/]" if ok else f"[bold red]{ui.bad_mark}[/]"
        out.print(f"  {mark} {INVARIANTS.get(name, name.replace('_', ' '))}")
    if "live_validation" in s:
        _live(ui, s["live_validation"])
    v = s["validation"]
    if v.get("passed") is None:
        out.print("[bold]Spark validation[/]  skipped (--no-validate)")
    else:
        out.print(f"[bold]Spark validation[/]  {_mark(ui, v['passed'])}: {v['partitions_checked']} "
                  f"partitions, {v['entries']:,} entries against the model of acknowledged writes, "
                  f"{v['seconds']} s")
    ok = passed(s)
    verdict = "[bold green]all invariants hold[/]" if ok else "[bold red]FAILED[/]"
    out.print(f"[bold]total[/] {s['seconds']} s: {verdict}")


def rate_lines(s: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary's rates, as (name, text) rows: the whole rebalance over its wall
    time, each move over its transfer stage, and the raw rate of this machine measured
    in the same run with what each is of it."""
    lines = []
    rebalance = (f"{s['partitions_moved']} partitions, {mb(s['bytes_moved'])} moved in "
                 f"{s['rebalance_seconds']:.2f} s wall (first move's start to last OWNING): "
                 f"{_rate(s['rebalance_mb_per_s'])}")
    if s.get("seconds_join_to_settled") is not None:
        rebalance += f"; all settled {s['seconds_join_to_settled']} s after the join"
    lines.append(("rebalance", rebalance))
    t = s.get("transfer_mb_per_s")
    if t:
        at_once = ("one move at a time" if s["moves_at_once"] <= 1
                   else f"up to {s['moves_at_once']} moves at once")
        lines.append(("per move", f"{_rate(t['min'])} to {_rate(t['max'])}, median {_rate(t['median'])}: "
                                  f"each move's bytes over its transfer stage; {at_once}"))
    raw = s.get("raw")
    if raw:
        line = (f"{_rate(raw['mb_per_s'])}: {raw['method']}, {mb(raw['bytes'])} in {raw['seconds']:.2f} s, "
                f"this run")
        ratios = [f"{what} {_share(value, raw['mb_per_s'])}" for what, value in
                  (("the median move at", (t or {}).get("median")),
                   ("the whole rebalance at", s.get("rebalance_mb_per_s")))
                  if value and raw["mb_per_s"]]
        if ratios:
            line += "; " + ", ".join(ratios) + " of it"
        lines.append(("raw", line))
    pacing = s.get("pacing")
    if pacing:
        lines.append(("pacing", pacing_line(pacing)))
    return lines


def pacing_line(p: dict[str, Any]) -> str:
    """What foreground protection let the joining node do (cluster_demo.Pacing)."""
    if not p["protect"]:
        return f"foreground protection off on {p['node']}: moves not paced"
    lo, hi = p["move_limit"]
    text = (f"foreground protection on (a writer was writing): {p['node']} allowed "
            f"{lo if lo == hi else f'{lo}-{hi}'} {'move' if hi == 1 else 'moves'} at once "
            f"(at most {p['max_moves']})")
    limit = p.get("receive_limit_mb_per_s")
    if limit:
        text += f", receive limit {_rate(limit[0]) if limit[0] == limit[1] else f'{limit[0]:,.1f}-{_rate(limit[1])}'}"
        if p["polls_unlimited"]:
            text += f" (none at {p['polls_unlimited']} of {p['polls']} polls)"
    else:
        text += ", no receive limit"
    return text


def _share(part: float, whole: float) -> str:
    pct = 100 * part / whole
    return f"{pct:.1f}%" if pct < 10 else f"{pct:.0f}%"


def _rate(mb_per_s: float | None) -> str:
    return f"{mb_per_s:,.1f} MB/s" if mb_per_s is not None else "- MB/s"


def rebalance_rates(moves: list[dict[str, Any]], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The rates of finished moves: ``moves`` as ``moves_done`` reports them
    (``finished``: wall-clock time, ``seconds_to_owning``), ``rows`` the same moves as
    :func:`move_row` made them. ``rebalance_seconds``: the first move's start to the
    last one's OWNING; ``rebalance_mb_per_s``: the bytes over that;
    ``transfer_mb_per_s``: min, median and max of the moves' own rates (bytes over
    the transfer stage); ``moves_at_once``: the most moves running at one time."""
    nbytes = sum(int(r["bytes"]) for r in rows)
    spans = [(float(m["finished"]) - float(m["seconds_to_owning"]), float(m["finished"])) for m in moves]
    wall = max(e for _, e in spans) - min(b for b, _ in spans) if spans else 0.0
    rates = sorted(r["mb_per_s"] for r in rows if r.get("mb_per_s"))
    running = most = 0
    for _, delta in sorted([(b, 1) for b, _ in spans] + [(e, -1) for _, e in spans]):
        running += delta
        most = max(most, running)
    return {"bytes_moved": nbytes, "rebalance_seconds": round(wall, 3),
            "rebalance_mb_per_s": round(nbytes / wall / 1e6, 1) if wall > 0 else None,
            "transfer_mb_per_s": ({"min": rates[0], "median": round(statistics.median(rates), 1),
                                   "max": rates[-1]} if rates else None),
            "moves_at_once": most}


def passed(s: dict[str, Any]) -> bool:
    """The demo's verdict (its exit status): every invariant holds and no validation
    that ran failed (the live one of the running cluster, the one of the files)."""
    return bool(s["invariants_ok"]) and all(
        s[k].get("passed") is not False for k in ("live_validation", "validation") if k in s)


def _mark(ui: DemoUI, ok: bool) -> str:
    return f"[green]{ui.ok_mark} passed[/]" if ok else f"[bold red]{ui.bad_mark} FAILED[/]"


LIVE_COLUMNS = 4            # (partition, counter) pairs per row of the counters table
LIVE_PROBLEMS = 5           # lines of each kind of problem shown (all of them: --json)


def _live(ui: DemoUI, v: dict[str, Any]) -> None:
    """The live validation: verdict, the counter each partition was compared at, and
    what failed (divergent keys, corrupt pages, copies not checked)."""
    out = ui.out
    if v.get("passed") is None:
        out.print(f"[bold]Live validation[/]  skipped ({escape(str(v.get('skipped') or '--no-validate'))})")
        return
    if "error" in v:
        out.print(f"[bold]Live validation[/]  {_mark(ui, False)}: {escape(v['error'])}")
        return
    via = f" ({escape(str(v['auth']))})" if v.get("auth") else ""
    out.print(f"[bold]Live validation[/]  {_mark(ui, v['passed'])}: {v['partitions_checked']} "
              f"partitions of the running cluster, {v['entries']:,} entries, {v['seconds']} s, "
              f"{v['writes_during']:,} writes meanwhile{via}")
    out.print("  each partition's copies compared at one counter (fenced, then snapshotted):")
    grid = Table.grid(padding=(0, 1))
    for _ in range(LIVE_COLUMNS):
        grid.add_column(justify="left")
        grid.add_column(justify="right", style="dim")
        grid.add_column()                               # a gap between the pairs
    items = list(v["counters"].items())
    for i in range(0, len(items), LIVE_COLUMNS):
        row: list[str] = []
        for part, counter in items[i:i + LIVE_COLUMNS]:
            row += [f"  {part}" if not row else part, f"@ {counter if counter is not None else '-'}", ""]
        grid.add_row(*row)
    out.print(grid)
    for d in v["divergent"][:LIVE_PROBLEMS]:
        keys = ", ".join(repr(k["key"]) for k in d["keys"][:3])
        out.print(f"  [red]divergent[/] {d['cache']}/{d['partition']}: {d['keys_total']} keys ({escape(keys)})")
    for p in v["corrupt_pages"][:LIVE_PROBLEMS]:
        out.print(f"  [red]corrupt page[/] {p['page']} of {p['node']} {p['cache']}/{p['partition']}: "
                  f"{escape(str(p['reason']))}")
    for u in v["unchecked"][:LIVE_PROBLEMS]:
        out.print(f"  [red]not checked[/] {u['cache']}/{u['partition']} on {u['node']}: "
                  f"{escape(str(u['reason']))}")
    for m in v["counter_mismatch"][:LIVE_PROBLEMS]:
        out.print(f"  [red]counter mismatch[/] {m['cache']}/{m['partition']}: {m['node']} at "
                  f"{m['snapshot']}, fenced at {m['counter']}")


def move_row(partition: str, frm: str, to: str, nbytes: int, stage_seconds: dict[str, float],
             seconds_to_owning: float, buffered: int | None, replayed: int | None) -> dict[str, Any]:
    """One finished move, as the summary's ``moves`` holds it (``--json``) and
    :func:`moves_table` shows it; its MB/s is over the transfer stage."""
    transfer = stage_seconds.get("transfer") or 0
    return {"partition": partition, "from": frm, "to": to, "bytes": nbytes,
            "stage_seconds": stage_seconds, "seconds_to_owning": seconds_to_owning,
            "mb_per_s": round(nbytes / transfer / 1e6, 1) if transfer > 0 else None,
            "buffered": buffered, "replayed": replayed}


def moves_table(ui: DemoUI, moves: list[dict[str, Any]], stages: list[str]) -> Table:
    t = Table(title="Moves: seconds per stage", title_justify="left", title_style="bold",
              box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    t.add_column("partition", no_wrap=True)
    t.add_column(f"from {ui.arrow} to", no_wrap=True)
    for st in stages:
        t.add_column(HEADERS.get(st, st), justify="right")
    t.add_column("MB", justify="right")
    t.add_column("MB/s", justify="right")
    t.add_column("replayed", justify="right")
    t.add_column("OWNING\nafter s", justify="right", style="bold")
    for m in moves:
        secs = m.get("stage_seconds", {})
        t.add_row(str(m["partition"]), f"{m['from'] or 'unknown'} {ui.arrow} {m['to']}",
                  *[f"{secs[st]:.2f}" if st in secs else "" for st in stages],
                  f"{m['bytes'] / 1e6:.1f}",
                  f"{m['mb_per_s']:.1f}" if m.get("mb_per_s") else "",
                  f"{m['replayed']:,}" if m.get("replayed") is not None else "",
                  f"{m['seconds_to_owning']:.2f}")
    return t
