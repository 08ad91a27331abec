"""Reports of a matrix run (markdown + HTML: cells, durations, seeds, replay commands)
and a timeline PNG per run: partition states per node over time, bytes moved (transfer
throughput), temp-WAL backlog, acknowledged writes, with crashes and events marked."""
from __future__ import annotations

import html
import json
import os
import subprocess
from typing import Any

from .runner import RunResult

# timeline marks a fault cell's row in report.json keeps (what the fault did)
NOTE_KINDS = ("resolved", "lease expired", "flap end", "converged", "writes", "over budget")
# timeline marks drawn as events (grey lines, labelled)
EVENT_KINDS = ("join", "leave", "kill", "restart", "cut", "heal", "cut-control", "isolate", "flap",
               "flap end", "kill-etcd", "restart-etcd")


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def timeline_png(res: RunResult, path: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = res.timeline
    ts = [s.t for s in tl.samples]
    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    ax = axes[0]
    nodes = sorted({n for s in tl.samples for n in s.states})
    for node in nodes:
        for state, style in (("OWNING", "-"), ("MOVING", "--"), ("RENTING", ":")):
            ys = [s.states.get(node, {}).get(state, 0) for s in tl.samples]
            if any(ys):
                ax.step(ts, ys, style, where="post", label=f"{node} {state}")
    ax.set_ylabel("partitions")
    ax.legend(fontsize=7, ncol=3, loc="upper left")
    ax = axes[1]
    moved = [s.bytes_moved for s in tl.samples]
    rate = [0.0][:len(ts)] + [max(0.0, (moved[i] - moved[i - 1]) / max(1e-3, ts[i] - ts[i - 1])) / 1e3
                    for i in range(1, len(ts))]
    ax.plot(ts, rate, label="transfer kB/s")
    ax.plot(ts, [s.backlog / (1e3 if tl.samples and res.scenario.startswith("file") else 1)
                 for s in tl.samples], label="temp-WAL backlog (kB or updates)")
    ax.legend(fontsize=7, loc="upper left")
    ax = axes[2]
    ax.plot(ts, [s.acked for s in tl.samples], label="acknowledged writes")
    ax.set_xlabel("seconds")
    ax.legend(fontsize=7, loc="upper left")
    for a in axes:
        for m in tl.marks:
            if m.kind == "crash":
                a.axvline(m.t, color="red", lw=1.5)
            elif m.kind in EVENT_KINDS + ("settled", "converged"):
                a.axvline(m.t, color="grey", lw=0.8, ls="--")
    for m in tl.marks:
        if m.kind in ("crash",) + EVENT_KINDS:
            axes[0].annotate(f"{m.kind} {m.node}", (m.t, 0), rotation=90, fontsize=6,
                             color="red" if m.kind == "crash" else "grey", va="bottom")
    fig.suptitle(f"{res.scenario} seed={res.seed} crash={res.crash or '-'} side={res.side or '-'} "
                 f"{'PASSED' if res.passed else 'FAILED'}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _rows(result: Any) -> list[dict[str, Any]]:
    rows = []
    for i, c in enumerate(result.cells):
        bad = {k: v[:3] for k, v in c.result.problems.items() if v} if c.result else {}
        notes = [f"{m.kind} {m.node}: {m.detail}".rstrip(": ") for m in c.result.timeline.marks
                 if m.kind in NOTE_KINDS] if c.result else []
        rows.append(c.to_json() | {"scenario": c.scenario, "nth": c.nth, "png": f"cell-{i:03d}.png",
                                   "problems": bad, "notes": notes})
    return rows


def write_report(result: Any, out_dir: str) -> str:
    """report.md, report.html, report.json and one PNG per cell into ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    rows = _rows(result)
    for i, c in enumerate(result.cells):
        if c.result is not None:
            timeline_png(c.result, os.path.join(out_dir, rows[i]["png"]))
    commit = _commit()
    head = (f"# Ferry crash matrix\n\ncommit `{commit}`: {len(rows)} cells, "
            f"{result.passed} passed, {result.failed} failed, seeds "
            f"{sorted({r['seed'] for r in rows})}\n\n")
    md = [head, "| point | side | scenario | seed | N | result | seconds | timeline |",
          "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['point']} | {r['side']} | {r['scenario']} | {r['seed']} | {r['nth']} | "
                  f"{'pass' if r['passed'] else '**FAIL**'} | {r['seconds']} | [png]({r['png']}) |")
    fails = [r for r in rows if not r["passed"]]
    if fails:
        md.append("\n## Failed cells\n")
        for r in fails:
            md.append(f"- `{r['replay']}`: {json.dumps(r['problems'])[:600]}")
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    esc = html.escape
    trs = "".join(
        f"<tr class={'ok' if r['passed'] else 'bad'}><td>{esc(r['point'])}</td><td>{r['side']}</td>"
        f"<td>{esc(r['scenario'])}</td><td>{r['seed']}</td><td>{r['nth']}</td>"
        f"<td>{'pass' if r['passed'] else 'FAIL'}</td><td>{r['seconds']}</td>"
        f"<td><a href='{r['png']}'>png</a></td><td><code>{esc(r['replay'])}</code></td></tr>"
        for r in rows)
    page = (f"<!doctype html><meta charset=utf-8><title>Ferry crash matrix</title>"
            f"<style>body{{font:14px sans-serif}}td,th{{padding:2px 8px}}.bad{{background:#fdd}}"
            f".ok{{background:#efe}}</style><h1>Ferry crash matrix</h1>"
            f"<p>commit <code>{esc(commit)}</code>: {len(rows)} cells, {result.passed} passed, "
            f"{result.failed} failed</p><table><tr><th>point<th>side<th>scenario<th>seed<th>N"
            f"<th>result<th>seconds<th>timeline<th>replay</tr>{trs}</table>")
    with open(os.path.join(out_dir, "report.html"), "w") as f:
        f.write(page)
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(result.to_json() | {"commit": commit, "rows": rows}, f, indent=1)
    return os.path.join(out_dir, "report.md")
