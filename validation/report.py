"""What a validation run found, and its three renderings: the ``--json`` object,
the human summary, and the HTML report (one table per cache)."""
from __future__ import annotations

import html
from dataclasses import dataclass, field

from faults.fileio import atomic_write

from .compare import PartitionState, corrupt_count
from .errors import OutOfDiskError, ValidationError

# The exact keys of the --json object, in order (the harness and `ferry demo` read them).
JSON_KEYS = ("passed", "partitions_checked", "entries", "divergent", "corrupt_pages",
             "expected", "seconds")


@dataclass
class Outcome:
    states: list[PartitionState]
    divergent: list[dict]
    corrupt_pages: list[dict]
    expected: dict | None = None
    seconds: float = 0.0
    files: int = 0
    nodes: list[str] = field(default_factory=list)
    live: dict | None = None       # live mode: validation.live.summary

    @property
    def entries(self) -> int:
        return sum(r.entries for s in self.states for r in s.replicas.values())

    @property
    def expected_mismatches(self) -> int:
        e = self.expected or {}
        return e.get("missing", 0) + e.get("extra", 0) + e.get("wrong", 0)

    @property
    def passed(self) -> bool:
        live = self.live or {}
        return not (self.divergent or self.corrupt_pages or self.expected_mismatches
                    or live.get("unchecked") or live.get("counter_mismatch"))

    def to_json(self) -> dict:
        out = {"passed": self.passed, "partitions_checked": len(self.states),
               "entries": self.entries, "divergent": self.divergent,
               "corrupt_pages": self.corrupt_pages, "expected": self.expected,
               "seconds": round(self.seconds, 3)}
        if self.expected is None:
            del out["expected"]          # only present when --expected was given
        if self.live is not None:        # only present in live mode (--cluster)
            out["mode"] = "live"
            out["live"] = self.live
        return out


def summary(o: Outcome, max_lines: int = 10) -> str:
    lines = [f"{'PASSED' if o.passed else 'FAILED'}: {len(o.states)} partitions of "
             f"{len({s.cache for s in o.states})} caches on {len(o.nodes)} nodes "
             f"({o.files} files, {o.entries} entries) in {o.seconds:.1f} s"]
    for d in o.divergent:
        owners = ", ".join(f"{n}={v['entries']}" for n, v in d["owners"].items())
        lines.append(f"  divergent {d['cache']}/{d['partition']} (entries {owners}): "
                     f"{d['keys_total']} differing keys")
        for k in d["keys"][:max_lines]:
            lines.append(f"    {k['kind']:8} {k['key']!r}")
        if d["keys_total"] > min(max_lines, len(d["keys"])):
            lines.append(f"    ... {d['keys_total'] - min(max_lines, len(d['keys']))} more")
    if o.live is not None:
        ats = [p["counter"] for p in o.live["partitions"] if p["counter"] is not None]
        lines.append(f"  live: {len(o.live['partitions'])} partitions fenced and snapshotted "
                     f"(counters {min(ats) if ats else '-'}..{max(ats) if ats else '-'})")
        for u in o.live["unchecked"][:max_lines]:
            lines.append(f"  NOT CHECKED {u['cache']}/{u['partition']} on {u['node']}: {u['reason']}")
        for m in o.live["counter_mismatch"][:max_lines]:
            lines.append(f"  counter mismatch {m['cache']}/{m['partition']}: {m['node']} at "
                         f"{m['snapshot']}, fenced at {m['counter']}")
    for p in o.corrupt_pages[:max_lines]:
        if "count" in p:
            lines.append(f"  {p['count']} more corrupt pages of {p['node']} "
                         f"{p['cache']}/{p['partition']}: {p['reason']}")
        else:
            lines.append(f"  corrupt page {p['page']} (offset {p['offset']}) of {p['node']} "
                         f"{p['cache']}/{p['partition']}: {p['reason']}")
    rest = corrupt_count(o.corrupt_pages[max_lines:])
    if rest:
        lines.append(f"  ... {rest} more corrupt pages")
    if o.expected is not None:
        e = o.expected
        lines.append(f"  expected ({e['rows']} rows): {e['missing']} missing, "
                     f"{e['extra']} extra, {e['wrong']} wrong")
        for x in e["examples"][:max_lines]:
            lines.append(f"    {x['kind']:8} {x['cache']}/{x['partition']} on "
                         f"{x['node'] or '(no owner)'}: {x['key']!r}")
    return "\n".join(lines)


_STYLE = ("body{font-family:sans-serif}table{border-collapse:collapse;margin-bottom:1em}"
          "td,th{border:1px solid #999;padding:2px 6px;text-align:right}"
          "tr.bad{background:#fdd}td.l,th.l{text-align:left}")


def render_html(o: Outcome) -> str:
    e = html.escape
    nodes = sorted({n for s in o.states for n in s.replicas})
    div = {(d["cache"], d["partition"]): d for d in o.divergent}
    corrupt: dict[tuple[str, int], int] = {}
    for p in o.corrupt_pages:
        at = (p["cache"], p["partition"])
        corrupt[at] = corrupt.get(at, 0) + p.get("count", 1)
    out = [f"<!doctype html><meta charset='utf-8'><title>Ferry validation</title>"
           f"<style>{_STYLE}</style>"
           f"<h1>Ferry validation: {'PASSED' if o.passed else 'FAILED'}</h1>",
           f"<p>{len(o.states)} partitions, {o.entries} entries, {o.files} files, "
           f"{corrupt_count(o.corrupt_pages)} corrupt pages, {o.seconds:.1f} s</p>"]
    for cache in sorted({s.cache for s in o.states}):
        out.append(f"<h2>cache {e(cache)}</h2><table><tr><th>partition</th>"
                   + "".join(f"<th>{e(n)}</th>" for n in nodes)
                   + "<th class=l>state</th><th>differing keys</th><th>corrupt pages</th></tr>")
        for s in (s for s in o.states if s.cache == cache):
            d = div.get((cache, s.partition))
            bad = d is not None or (cache, s.partition) in corrupt
            cells = "".join(
                f"<td title='{s.replicas[n].digest}'>{s.replicas[n].entries}</td>"
                if n in s.replicas else "<td>-</td>" for n in nodes)
            state = "DIVERGENT" if d else ("ok" if len(s.replicas) > 1 else "single owner")
            keys = ""
            if d:
                keys = ", ".join(f"{k['kind']} {e(k['key'])}" for k in d["keys"][:5])
                keys = f"{d['keys_total']}: {keys}"
            out.append(f"<tr{' class=bad' if bad else ''}><td>{s.partition}</td>{cells}"
                       f"<td class=l>{state}</td><td class=l>{keys}</td>"
                       f"<td>{corrupt.get((cache, s.partition), 0)}</td></tr>")
        out.append("</table>")
    if o.corrupt_pages:
        out.append("<h2>corrupt pages</h2><table><tr><th class=l>node</th><th class=l>cache</th>"
                   "<th>partition</th><th>page</th><th>offset</th><th class=l>reason</th></tr>")
        for p in o.corrupt_pages:
            out.append(f"<tr class=bad><td class=l>{e(p['node'])}</td><td class=l>{e(p['cache'])}"
                       f"</td><td>{p['partition']}</td><td>{p['page']}</td><td>{p['offset']}</td>"
                       f"<td class=l>{e(p['reason'])}</td></tr>")
        out.append("</table>")
    if o.expected is not None:
        x = o.expected
        out.append(f"<h2>expected data</h2><p>{x['rows']} rows: {x['missing']} missing, "
                   f"{x['extra']} extra, {x['wrong']} wrong</p>")
    return "\n".join(out) + "\n"


def write_html(path: str, o: Outcome) -> None:
    """Write the HTML report atomically (a reader never sees half a report)."""
    try:
        atomic_write(path, render_html(o).encode("utf-8"), error=OutOfDiskError)
    except OSError as exc:
        raise ValidationError(f"cannot write report {path}: {exc.strerror}; check that "
                              "its folder exists and is writable") from exc
