"""``ferry cluster status``: one JSON document (schema in docs/node.md) or a table."""
from __future__ import annotations

from typing import Any

from .cluster_map import ClusterMap
from .errors import NodeError
from .wire import Pool


def collect(pool: Pool, seed: str) -> dict[str, Any]:
    m = ClusterMap.from_wire(pool.call(seed, "get_map", timeout=5.0))
    # the controller's map is as new as any; ask it when the seed is someone else
    coord_addr = m.address(m.controller)
    if coord_addr and coord_addr != seed:
        try:
            m = ClusterMap.from_wire(pool.call(coord_addr, "get_map", timeout=5.0))
        except NodeError:
            pass
    moves: list[dict[str, Any]] = []
    for mem in m.members.values():
        if mem.alive:
            try:
                moves += pool.call(mem.address, "moves", timeout=5.0)
            except NodeError:
                pass
    partitions = []
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
        "lost": [f"{x['cache']}/{x['partition']}" for x in partitions
                 if "OWNING" not in x["states"].values() or m.parts[x["cache"]][x["partition"]].lost],
    }


def render(doc: dict[str, Any]) -> str:
    lines = [f"topology version {doc['topology_version']} (epoch {doc['epoch']}), "
             f"controller {doc['controller']}", "", "nodes:"]
    for n in doc["nodes"]:
        flag = "alive" if n["alive"] else "DEAD"
        lines.append(f"  {n['id']:<12} {n['address']:<22} {flag}{' leaving' if n['leaving'] else ''}")
        counts: dict[str, int] = {}
        for part in doc["partitions"]:
            s = part["states"].get(n["id"])
            if s:
                counts[s] = counts.get(s, 0) + 1
        if counts:
            lines.append("  " + " " * 13 + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    lines.append("")
    lines.append(f"moves in progress: {len(doc['moves'])}")
    for mv in doc["moves"]:
        eta = f"{mv['eta_s']}s" if mv.get("eta_s") is not None else "?"
        line = (f"  {mv['cache']}/{mv['partition']} {mv['from']} -> {mv['to']} "
                f"[{mv.get('mode', 'messages')}] {mv['stage']:<15} {mv['bytes']}/{mv['bytes_total']} B "
                f"{mv.get('rate_bps', 0) / 1e6:.1f} MB/s backlog {mv.get('backlog', 0)}")
        if mv.get("mode") == "files":
            line += (f" replayed {mv.get('replayed', 0)} ({mv.get('replay_rate', 0)}/s,"
                     f" ingest {mv.get('ingest_rate', 0)}/s)")
        lines.append(line + f" eta {eta}")
    if doc["lost"]:
        lines.append(f"LOST partitions (no live OWNING copy): {', '.join(doc['lost'])}")
    return "\n".join(lines)
