"""``ferry cluster status``: one JSON document (schema in docs/node.md) or a table."""
from __future__ import annotations

from typing import TypedDict, cast

from .errors import NodeError
from .jsonvalue import JsonDoc, MoveDoc
from .rpcapi import AdmissionStatus, Moves, fetch_map
from .wire import Pool


class NodeDoc(TypedDict):
    id: str
    address: str
    alive: bool
    leaving: bool


class PartitionDoc(TypedDict):
    cache: str
    partition: int
    states: dict[str, str]          # live node -> its state of p
    primary: str | None
    in_sync: list[str]
    epoch: int
    primary_epoch: int
    owners: list[str]               # the ideal owners, the ideal primary first


class StatusDoc(TypedDict):
    """``ferry cluster status --json`` (docs/node.md)."""
    topology_version: int
    epoch: int
    controller: str | None
    coordinator: str | None         # the old name of ``controller``, kept for scripts
    nodes: list[NodeDoc]
    partitions: list[PartitionDoc]
    moves: list[MoveDoc]
    admission: list[JsonDoc]        # each node's foreground protection (node/admission.py)
    lost: list[str]


def collect(pool: Pool, seed: str) -> dict[str, object]:
    """:func:`status_doc` as a plain document (what ``--json`` prints)."""
    return dict(status_doc(pool, seed))


def status_doc(pool: Pool, seed: str) -> StatusDoc:
    m = fetch_map(pool, seed)
    # the controller's map is as new as any; ask it when the seed is someone else
    coord_addr = m.address(m.controller)
    if coord_addr and coord_addr != seed:
        try:
            m = fetch_map(pool, coord_addr)
        except NodeError:
            pass
    moves: list[MoveDoc] = []
    admission: list[JsonDoc] = []
    for mem in m.members.values():
        if mem.alive:
            try:
                running = pool.request(mem.address, Moves(), timeout=5.0)
                moves += cast("list[MoveDoc]", running)   # as the node reports them
            except NodeError:
                pass
            try:           # foreground protection of that node (node/admission.py)
                admission.append(pool.request(mem.address, AdmissionStatus(), timeout=5.0))
            except NodeError:
                pass       # an older node, or one stopping
    partitions: list[PartitionDoc] = []
    for cache, plist in m.states.items():
        for p, st in enumerate(plist):
            live = {n: s for n, s in st.items() if n in m.members and m.members[n].alive}
            partitions.append({"cache": cache, "partition": p, "states": live,
                               "primary": m.primary(cache, p),
                               "in_sync": list(m.parts[cache][p].isr),
                               "epoch": m.parts[cache][p].epoch,
                               "primary_epoch": m.parts[cache][p].term,
                               "owners": m.ideal(cache, p)})
    return {
        "topology_version": m.version,
        "epoch": m.epoch,
        "controller": m.controller,
        "coordinator": m.controller,      # the old name, kept for scripts
        "nodes": [{"id": x.id, "address": x.address, "alive": x.alive, "leaving": x.leaving}
                  for x in sorted(m.members.values(), key=lambda x: x.order)],
        "partitions": partitions,
        "moves": moves,
        "admission": sorted(admission, key=lambda a: str(a.get("node"))),
        "lost": [f"{x['cache']}/{x['partition']}" for x in partitions
                 if "OWNING" not in x["states"].values() or m.parts[x["cache"]][x["partition"]].lost],
    }


SMALL = 64          # up to this many partitions, every one gets a row
ROWS = 40           # else: at most this many rows, the partitions that are not settled


def settled_part(part: PartitionDoc) -> bool:
    """Its ideal owners hold it OWNING, in sync, nothing else, the ideal primary leads."""
    owners = part["owners"]
    return (sorted(n for n, s in part["states"].items() if s == "OWNING") == sorted(owners)
            and set(part["states"].values()) <= {"OWNING"} and bool(owners)
            and part.get("primary") == owners[0]
            and sorted(part.get("in_sync", owners)) == sorted(owners))


def select(doc: StatusDoc, partition: str) -> StatusDoc:
    """The document with only ``CACHE/P``'s partition (KeyError when there is none)."""
    cache, _, ps = partition.rpartition("/")
    parts = [x for x in doc["partitions"] if x["cache"] == cache and str(x["partition"]) == ps]
    if not parts:
        raise KeyError(partition)
    out = doc.copy()
    out["partitions"] = parts
    out["moves"] = [mv for mv in doc["moves"] if mv.get("cache") == cache and str(mv.get("partition")) == ps]
    return out


def render(doc: StatusDoc, *, width: int | None = None, color: bool | None = None,
           all_partitions: bool = False) -> str:
    """The status document as tables: nodes with their partitions by state, the
    partitions' primary, in-sync copies and epochs, the moves with stage, bytes, rate
    and ETA. Past SMALL partitions, only the ones that are not settled get a row (at
    most ROWS; ``all_partitions`` lists every one). Colour only when stdout is a
    terminal (and ``color`` is not False); the width is the terminal's, else 120
    (``width`` overrides)."""
    import io
    import shutil
    import sys

    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    tty = sys.stdout.isatty()
    color = tty if color is None else color
    width = width or (shutil.get_terminal_size((120, 24)).columns if tty else 120)
    buf = io.StringIO()
    out = Console(file=buf, width=width, force_terminal=color, no_color=not color,
                  color_system="standard" if color else None, highlight=False)

    def table(title: str) -> Table:
        return Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
                     pad_edge=False, collapse_padding=True)

    order = ("OWNING", "MOVING", "RENTING", "EVICTED", "LOST")
    present = {st for part in doc["partitions"] for st in part["states"].values()}
    states = [st for st in order if st in present] + sorted(present - set(order))
    style = {"OWNING": "green", "MOVING": "yellow", "RENTING": "cyan", "EVICTED": "dim", "LOST": "bold red"}
    out.print(f"[bold]topology version[/] {doc['topology_version']} (epoch {doc['epoch']}), "
              f"[bold]controller[/] {escape(str(doc.get('controller')))}")

    nodes = table("Nodes: partitions by state")
    for col in ("node", "address", "status"):
        nodes.add_column(col, no_wrap=True)
    for st in states:
        nodes.add_column(st, justify="right", style=style.get(st, ""))
    nodes.add_column("primary of", justify="right")
    by_node: dict[str, dict[str, int]] = {}
    prims: dict[str, int] = {}
    for part in doc["partitions"]:           # one pass, whatever the number of nodes
        for node_id, st in part["states"].items():
            c = by_node.setdefault(node_id, {})
            c[st] = c.get(st, 0) + 1
        prim_of = part.get("primary")
        if prim_of:
            prims[prim_of] = prims.get(prim_of, 0) + 1
    for n in doc["nodes"]:
        counts = {st: by_node.get(n["id"], {}).get(st, 0) for st in states}
        prim = prims.get(n["id"], 0)
        status = "[green]alive[/]" if n["alive"] else "[bold red]DEAD[/]"
        if n["leaving"]:
            status += " leaving"
        if n["id"] == doc.get("controller"):
            status += ", controller"
        nodes.add_row(escape(n["id"]), escape(n["address"]), status,
                      *[str(counts[st]) if counts[st] else "" for st in states], str(prim))
    out.print(nodes)

    rows = doc["partitions"]
    title = f"Partitions: {len(rows)}"
    if len(rows) > SMALL and not all_partitions:
        unsettled = [x for x in rows if not settled_part(x)]
        title += (f", {len(unsettled)} not settled" + (f" (the first {ROWS} shown)" if len(unsettled) > ROWS else "")
                  + "; --partitions lists every one, --partition CACHE/P one")
        rows = unsettled[:ROWS]
    parts = table(title)
    for col in ("partition", "primary", "owners", "in-sync", "epoch", "primary epoch", "copies"):
        parts.add_column(col, justify="right" if "epoch" in col else "left")
    for part in rows:
        isr = part.get("in_sync", [])
        short = set(part["owners"]) - set(isr)
        copies = " ".join(f"{escape(n)}:[{style.get(st, '')}]{st}[/]" if style.get(st) else f"{escape(n)}:{st}"
                          for n, st in sorted(part["states"].items()))
        parts.add_row(f"{escape(part['cache'])}/{part['partition']}", escape(str(part.get("primary"))),
                      escape(",".join(part["owners"])),
                      escape(",".join(isr)) + (f" [yellow](not {escape(','.join(sorted(short)))})[/]" if short else ""),
                      str(part.get("epoch", "")), str(part.get("primary_epoch", "")), copies)
    out.print(parts)

    moves = table(f"Moves in progress: {len(doc['moves'])}")
    if doc["moves"]:
        for col, right in (("partition", False), ("from -> to", False), ("stage", False), ("MB", True),
                           ("MB/s", True), ("backlog", True), ("replayed", True), ("ETA", True)):
            moves.add_column(col, justify="right" if right else "left", no_wrap=True)
        for mv in doc["moves"]:
            replayed = f"{mv.get('replayed', 0)}"
            if mv.get("mode") == "files":
                replayed += f" ({mv.get('replay_rate', 0)}/s, ingest {mv.get('ingest_rate', 0)}/s)"
            copy = mv.get("copy") or {}
            how = (f" (delta: {copy.get('pages_sent')} of {copy.get('pages')} pages)"
                   if copy.get("mode") == "delta" else "")
            moves.add_row(f"{escape(mv['cache'])}/{mv['partition']}",
                          f"{escape(str(mv['from']))} -> {escape(str(mv['to']))}",
                          escape(f"[{mv.get('mode', 'messages')}] {mv['stage']}{how}"),
                          f"{mv['bytes'] / 1e6:.1f}/{mv['bytes_total'] / 1e6:.1f}",
                          f"{mv.get('rate_bps', 0) / 1e6:.1f}", str(mv.get("backlog", 0)), replayed,
                          f"{mv['eta_s']}s" if mv.get("eta_s") is not None else "?")
        out.print(moves)
    else:
        out.print(f"[bold]{moves.title}[/]")
    prot = table("Foreground protection (moves yield when writes slow down)")
    adm = [a for a in doc.get("admission", []) if isinstance(a, dict)]
    if adm:
        for col, right in (("node", False), ("protect", False), ("move limit", True), ("transfers", True),
                           ("transfer MB/s", True), ("replay /s", True), ("write p99 ms", True),
                           ("target ms", True), ("idle p99 ms", True)):
            prot.add_column(col, justify="right" if right else "left", no_wrap=True)
        for a in adm:
            lat = a.get("latency_ms")
            target = a.get("target_ms")
            over = isinstance(lat, (int, float)) and isinstance(target, (int, float)) and lat > target
            seen = "-" if lat is None else f"{lat} ({escape(str(a.get('latency_node')))})"
            rate = a.get("transfer_rate_limit") or 0
            prot.add_row(escape(str(a.get("node"))), "on" if a.get("protect") else "[yellow]off[/]",
                         f"{a.get('move_limit')}/{a.get('max_moves')}", str(a.get("transfers")),
                         f"{rate / 1e6:.0f}" if isinstance(rate, (int, float)) and rate else "-",
                         str(a.get("replay_rate_limit") or "-"),
                         f"[yellow]{seen}[/]" if over else seen,
                         str(a.get("target_ms") if a.get("target_ms") is not None else "-"),
                         str(a.get("baseline_ms") if a.get("baseline_ms") is not None else "-"))
        out.print(prot)
    if doc["lost"]:
        lost = doc["lost"] if len(doc["lost"]) <= ROWS else doc["lost"][:ROWS] + [f"... ({len(doc['lost'])} in all)"]
        out.print(f"[bold red]LOST partitions (no live OWNING copy): {escape(', '.join(lost))}[/]")
    return "\n".join(line.rstrip() for line in buf.getvalue().rstrip("\n").splitlines())
