"""``ferry cluster status`` without --json: node/status.py render() as tables, plain
(no colour, no trailing blanks) unless stdout is a terminal."""
from __future__ import annotations

import re

from node.status import render

DOC = {
    "topology_version": 12, "epoch": 3, "controller": "n1", "coordinator": "n1",
    "nodes": [{"id": "n1", "address": "127.0.0.1:7001", "alive": True, "leaving": False},
              {"id": "n2", "address": "127.0.0.1:7002", "alive": True, "leaving": False},
              {"id": "n3", "address": "127.0.0.1:7003", "alive": False, "leaving": False}],
    "partitions": [
        {"cache": "default", "partition": 0, "states": {"n1": "OWNING", "n2": "OWNING"},
         "primary": "n1", "in_sync": ["n1", "n2"], "epoch": 4, "primary_epoch": 2, "owners": ["n1", "n2"]},
        {"cache": "default", "partition": 1, "states": {"n1": "OWNING", "n2": "MOVING"},
         "primary": "n1", "in_sync": ["n1"], "epoch": 5, "primary_epoch": 2, "owners": ["n1", "n2"]},
    ],
    "moves": [{"cache": "default", "partition": 1, "from": "n1", "to": "n2", "mode": "files",
               "stage": "transfer", "bytes": 1_200_000, "bytes_total": 3_400_000, "rate_bps": 2.5e6,
               "backlog": 17, "eta_s": 0.9, "replayed": 0, "replay_rate": 0, "ingest_rate": 35.2}],
    "lost": [],
}


def row(text: str, first: str) -> list[str] | None:
    return next((line.split() for line in text.splitlines() if line.split()[:1] == [first]), None)


def test_status_tables_nodes_partitions_and_moves() -> None:
    text = render(DOC, color=False, width=120)
    assert "\x1b[" not in text and all(line == line.rstrip() for line in text.splitlines())
    assert text.splitlines()[0] == "topology version 12 (epoch 3), controller n1"
    # nodes: partitions by state, primaries, the controller
    assert row(text, "n1") == ["n1", "127.0.0.1:7001", "alive,", "controller", "2", "2"]
    assert row(text, "n2") == ["n2", "127.0.0.1:7002", "alive", "1", "1", "0"]
    assert row(text, "n3")[:3] == ["n3", "127.0.0.1:7003", "DEAD"]
    # partitions: primary, owners, in-sync copies (the one missing named), epochs, copies
    assert row(text, "default/0") == ["default/0", "n1", "n1,n2", "n1,n2", "4", "2",
                                      "n1:OWNING", "n2:OWNING"]
    assert row(text, "default/1") == ["default/1", "n1", "n1,n2", "n1", "(not", "n2)", "5", "2",
                                      "n1:OWNING", "n2:MOVING"]
    # moves: stage (with the mode), MB done/total, rate, backlog, replay figures, ETA
    assert "Moves in progress: 1" in text
    move = next(line for line in text.splitlines() if "[files] transfer" in line)
    assert re.search(r"n1 -> n2\s+\[files\] transfer\s+1\.2/3\.4\s+2\.5\s+17\s+0 \(0/s, ingest 35\.2/s\)\s+0\.9s$",
                     move), move


def test_lost_partitions_and_no_moves() -> None:
    doc = dict(DOC, moves=[], lost=["default/3"])
    text = render(doc, color=False, width=120)
    assert "Moves in progress: 0" in text
    assert text.splitlines()[-1] == "LOST partitions (no live OWNING copy): default/3"


def test_colour_only_when_asked_or_on_a_terminal() -> None:
    assert "\x1b[" in render(DOC, color=True)
    assert "\x1b[" not in render(DOC, color=False)


def test_past_64_partitions_only_the_unsettled_ones_get_a_row_and_nodes_count_in_one_pass() -> None:
    import time
    from node.status import select
    nodes = [{"id": f"n{i}", "address": f"h:{i}", "alive": True, "leaving": False} for i in range(1000)]
    parts = []
    for p in range(100_000):
        a, b = f"n{p % 1000}", f"n{(p + 1) % 1000}"
        parts.append({"cache": "c", "partition": p, "states": {a: "OWNING", b: "OWNING"}, "primary": a,
                      "in_sync": [a, b], "epoch": 1, "primary_epoch": 1, "owners": [a, b]})
    parts[77]["states"]["n77"] = "MOVING"
    doc = {"topology_version": 1, "epoch": 2, "controller": "n0", "nodes": nodes, "partitions": parts,
           "moves": [], "admission": [], "lost": []}
    t0 = time.process_time()
    text = render(doc, color=False, width=200)
    assert time.process_time() - t0 < 20          # was 1,000 x 100,000 passes over the partitions
    assert "Partitions: 100000, 1 not settled; --partitions lists every one" in text
    assert row(text, "c/77")[:3] == ["c/77", "n77", "n77,n78"]
    assert row(text, "c/78") is None
    assert row(text, "n5")[-2:] == ["200", "100"]
    one = select(doc, "c/12")
    assert [x["partition"] for x in one["partitions"]] == [12]
