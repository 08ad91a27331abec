"""ferry/demo_ui.py off a terminal (a test capturing output, a pipe): plain lines, the
summary's move table with a column per stage, the invariants as a checklist."""
from __future__ import annotations

import io
import re

from rich.console import Console

from ferry.demo_ui import DemoUI, MoveRow, move_row, pacing_line, passed, print_summary, rebalance_rates

ANSI = re.compile(r"\x1b\[")
STAGES = ["prepare", "demand", "transfer", "install", "index rebuild", "replay", "checkpoint wait"]


def plain_ui() -> tuple[DemoUI, io.StringIO, io.StringIO]:
    ui = DemoUI()
    out, err = io.StringIO(), io.StringIO()
    ui.out = Console(file=out, width=120, highlight=False)
    ui.err = Console(file=err, width=120, highlight=False)
    ui.live = False
    return ui, out, err


def summary(ok: bool = True) -> dict:
    moves = [{"partition": f"default/{p}", "from": f"n{p % 3 + 1}", "to": "n4", "bytes": 3_300_000,
              "stage_seconds": {st: 0.01 * (i + 1) for i, st in enumerate(STAGES)},
              "seconds_to_owning": 0.42, "mb_per_s": 41.2, "buffered": 12, "replayed": 12}
             for p in (2, 5)]
    return {
        "flow": "3-node cluster on loopback; node n4 joins; file-based moves",
        "control_plane": {"etcd": "http://127.0.0.1:2379", "controller": "n1", "lease_ttl_s": 3},
        "entries": 200_000, "load_put_seconds": 20.5, "load_entries_per_s": 9756,
        "partitions_moved": 2, "bytes_moved": 6_600_000, "rebalance_seconds": 1.3,
        "rebalance_mb_per_s": 5.1, "seconds_join_to_settled": 2.4,
        "transfer_mb_per_s": {"min": 30.0, "median": 41.2, "max": 52.4}, "moves_at_once": 2,
        "raw": {"method": "raw sendfile over loopback into a file (no fsync)", "bytes": 256_000_000,
                "seconds": 0.25, "mb_per_s": 1024.0},
        "writes_during_move": 321, "writes_total": 999,
        "updates_buffered_in_temp_wal": 24, "updates_replayed": 24,
        "stages": STAGES, "moves": moves,
        "invariants": {"acknowledged_writes_on_every_owner": True, "indexes_agree_with_data": ok,
                       "b_plus_1_owning_copies": True},
        "invariants_ok": ok,
        "validation": {"passed": True, "partitions_checked": 16, "entries": 200_000, "seconds": 25.0},
        "seconds": 95.2,
    }


def test_summary_is_plain_text_with_a_row_per_move_and_a_column_per_stage() -> None:
    ui, out, _ = plain_ui()
    print_summary(ui, summary())
    text = out.getvalue()
    assert not ANSI.search(text), text
    assert all(line == line.rstrip() for line in text.splitlines())
    assert "etcd http://127.0.0.1:2379, controller n1, lease TTL 3 s" in text
    assert "200,000 entries in 20.5 s (9,756/s)" in text
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("partition"))
    header = lines[at - 1] + "\n" + lines[at]          # two-line headers: "index / rebuild"
    for word in ("prepare", "demand", "transfer", "install", "index", "rebuild", "replay",
                 "checkpoint", "wait", "MB/s", "replayed"):
        assert word in header, (word, header)
    rows = [line for line in lines if line.lstrip().startswith("default/")]
    assert len(rows) == 2
    # seven stage figures then MB, MB/s, replayed, OWNING after
    assert rows[0].split()[4:] == ["0.01", "0.02", "0.03", "0.04", "0.05", "0.06", "0.07",
                                   "3.3", "41.2", "12", "0.42"], rows[0]
    assert "  ✓ every acknowledged write on every owner" in text
    assert "  ✓ B+1 OWNING copies of every partition" in text
    assert "passed: 16 partitions, 200,000 entries" in text
    assert text.rstrip().endswith("total 95.2 s: all invariants hold")


def test_a_failed_invariant_is_marked_and_the_verdict_says_so() -> None:
    ui, out, _ = plain_ui()
    print_summary(ui, summary(ok=False))
    text = out.getvalue()
    assert "  ✗ indexes agree with the data" in text
    assert "FAILED" in text.splitlines()[-1]


def live(ok: bool = True) -> dict:
    """A ``live_validation`` object as cluster_demo.live_summary builds it."""
    v = {"passed": ok, "partitions_checked": 8, "entries": 40_000, "divergent": [],
         "corrupt_pages": [], "epoch": 9,
         "counters": {f"default/{p}": 1000 + p for p in range(8)},
         "unchecked": [], "counter_mismatch": [], "writes_during": 4321, "seconds": 7.5,
         "spark_start_seconds": 5.0}
    if not ok:
        v["divergent"] = [{"cache": "default", "partition": 3, "keys_total": 1,
                           "keys": [{"key": "key-000000042", "kind": "value"}]}]
        v["unchecked"] = [{"cache": "default", "partition": 5, "node": "n2",
                           "reason": "fetch from n2 failed: refused"}]
    return v


def test_live_validation_names_the_counter_each_partition_was_compared_at() -> None:
    ui, out, _ = plain_ui()
    s = summary() | {"live_validation": live()}
    print_summary(ui, s)
    text = out.getvalue()
    assert ("Live validation  ✓ passed: 8 partitions of the running cluster, 40,000 entries, "
            "7.5 s, 4,321 writes meanwhile\n  each partition's copies compared at one counter") in text
    pairs = re.findall(r"(default/\d+) +@ (\d+)", text)
    assert pairs == [(f"default/{p}", str(1000 + p)) for p in range(8)], text
    # the live check comes first (it ran first), then the check of the stopped nodes' files
    assert text.index("Live validation") < text.index("Spark validation")
    assert passed(s) and text.rstrip().endswith("all invariants hold")


def test_a_failed_live_validation_says_what_and_fails_the_demo() -> None:
    ui, out, _ = plain_ui()
    s = summary() | {"live_validation": live(ok=False)}
    print_summary(ui, s)
    text = out.getvalue()
    assert "Live validation  ✗ FAILED: 8 partitions" in text
    assert "  divergent default/3: 1 keys ('key-000000042')" in text
    assert "  not checked default/5 on n2: fetch from n2 failed: refused" in text
    assert not passed(s) and "FAILED" in text.splitlines()[-1]
    # a cluster the validator could not reach at all
    ui, out, _ = plain_ui()
    s = summary() | {"live_validation": {"passed": False, "error": "no node of the cluster answers"}}
    print_summary(ui, s)
    assert "Live validation  ✗ FAILED: no node of the cluster answers" in out.getvalue()
    assert not passed(s)
    # skipped (--no-validate) fails nothing
    s = summary() | {"live_validation": {"passed": None, "skipped": "--no-validate"}}
    assert passed(s)
    # skipped for another reason (mutual TLS): said, and fails nothing either
    ui, out, _ = plain_ui()
    s = summary() | {"node_links": "mutual TLS",
                     "live_validation": {"passed": None, "skipped": "it needs the secret"}}
    print_summary(ui, s)
    assert "Live validation  skipped (it needs the secret)" in out.getvalue()
    assert "node links" in out.getvalue() and "mutual TLS" in out.getvalue()
    assert passed(s)


def test_moves_off_a_terminal_print_one_line_per_stage_entered() -> None:
    ui, _, err = plain_ui()
    with ui.moves("partitions settled") as view:
        view.update([MoveRow("default/2 n1 -> n4", "transfer", 100, 1_000_000)], (7, 8))
        view.update([MoveRow("default/2 n1 -> n4", "transfer", 500_000, 1_000_000)], (7, 8))
        view.update([MoveRow("default/2 n1 -> n4", "replay", 1_000_000, 1_000_000)], (7, 8))
        view.update([], (8, 8))
    assert err.getvalue().splitlines() == [
        "  move default/2 n1 -> n4: transfer  0.0 MB of 1.0 MB",
        "  partitions settled: 7/8",
        "  move default/2 n1 -> n4: replay  1.0 MB of 1.0 MB",
        "  move default/2 n1 -> n4: OWNING",
        "  partitions settled: 8/8",
    ]


def test_a_live_display_tracks_each_move_to_owning() -> None:
    ui, _, err = plain_ui()
    ui.err = Console(file=err, width=120, force_terminal=True)
    ui.live = True
    with ui.moves("partitions settled") as view:
        # the source of a move is known once its transfer begins: one row all along,
        # "locating" before (cluster_demo.source_label)
        view.update([MoveRow("default/2 -> n4", "transfer", 500_000, 1_000_000, 2e6, 0.25,
                             label="default/2 n1 -> n4"),
                     MoveRow("default/3 -> n4", "prepare",
                             label="default/3 locating (primary n2) -> n4")], (6, 8))
        assert "default/3 locating (primary n2) -> n4" in [t.description for t in view.prog.tasks]
        view.update([MoveRow("default/3 -> n4", "index rebuild", 1_000_000, 1_000_000,
                             label="default/3 n2 -> n4")], (7, 8))
        prog = view.prog
        by_name = {t.description: t for t in prog.tasks}
        assert sorted(by_name) == ["default/2 n1 -> n4", "default/3 n2 -> n4", "partitions settled"]
        assert by_name["default/2 n1 -> n4"].fields["stage"] == "OWNING"
        assert by_name["default/2 n1 -> n4"].finished
        # the last poll saw half the file; OWNING means all of it arrived
        assert by_name["default/2 n1 -> n4"].fields["size"] == "1.0 MB/1.0 MB"
        assert by_name["default/3 n2 -> n4"].fields["stage"] == "index rebuild"
        assert by_name["partitions settled"].completed == 7
    assert all(t.finished for t in prog.tasks if t.description != "partitions settled")
    assert "default/3 n2 -> n4" in err.getvalue() and "\x1b[" in err.getvalue()


def test_the_summary_sets_the_rates_beside_the_raw_rate_of_the_machine() -> None:
    ui, out, _ = plain_ui()
    print_summary(ui, summary())
    text = " ".join(out.getvalue().split())          # the facts wrap at 120 columns
    assert ("rebalance 2 partitions, 6.6 MB moved in 1.30 s wall (first move's start to last OWNING): "
            "5.1 MB/s; all settled 2.4 s after the join") in text
    assert ("per move 30.0 MB/s to 52.4 MB/s, median 41.2 MB/s: each move's bytes over its transfer "
            "stage; up to 2 moves at once") in text
    assert ("raw 1,024.0 MB/s: raw sendfile over loopback into a file (no fsync), 256.0 MB in 0.25 s, "
            "this run; the median move at 4.0%, the whole rebalance at 0.5% of it") in text
    ui, out, _ = plain_ui()
    print_summary(ui, summary() | {"moves_at_once": 1})
    assert "transfer stage; one move at a time" in " ".join(out.getvalue().split())
    # without a raw measurement (--raw-mb 0) the line is not there
    ui, out, _ = plain_ui()
    print_summary(ui, summary() | {"raw": None})
    assert "raw " not in out.getvalue() and "per move" in out.getvalue()


def test_rebalance_rates_are_over_the_moves_wall_time_and_each_transfer_stage() -> None:
    # three moves: 0-2 s, 1-3 s and 4-5 s (finished, seconds_to_owning), wall clock
    moves = [{"finished": 1000.0 + end, "seconds_to_owning": end - start}
             for start, end in ((0.0, 2.0), (1.0, 3.0), (4.0, 5.0))]
    rows = [move_row(f"default/{i}", "n1", "n4", 40_000_000, {"prepare": 0.1, "transfer": t},
                     1.0, 0, 0) for i, t in enumerate((0.5, 1.0, 2.0))]
    assert [r["mb_per_s"] for r in rows] == [80.0, 40.0, 20.0]
    r = rebalance_rates(moves, rows)
    assert r == {"bytes_moved": 120_000_000, "rebalance_seconds": 5.0, "rebalance_mb_per_s": 24.0,
                 "transfer_mb_per_s": {"min": 20.0, "median": 40.0, "max": 80.0}, "moves_at_once": 2}
    # no move: no rate, not a division by zero
    assert rebalance_rates([], []) == {"bytes_moved": 0, "rebalance_seconds": 0.0,
                                       "rebalance_mb_per_s": None, "transfer_mb_per_s": None,
                                       "moves_at_once": 0}


def test_the_pacing_line_says_what_foreground_protection_allowed() -> None:
    p = {"node": "n4", "polls": 40, "protect": True, "move_limit": [1, 2], "max_moves": 8,
         "transfers": [1, 2], "receive_limit_mb_per_s": [31.3, 250.0], "polls_unlimited": 3}
    assert pacing_line(p) == ("foreground protection on (a writer was writing): n4 allowed 1-2 moves "
                              "at once (at most 8), receive limit 31.3-250.0 MB/s (none at 3 of 40 polls)")
    assert pacing_line(p | {"move_limit": [8, 8], "receive_limit_mb_per_s": None}) == (
        "foreground protection on (a writer was writing): n4 allowed 8 moves at once (at most 8), "
        "no receive limit")
    assert "n4 allowed 1 move at once (at most 8)" in pacing_line(p | {"move_limit": [1, 1]})
    assert pacing_line(p | {"protect": False}) == "foreground protection off on n4: moves not paced"
    ui, out, _ = plain_ui()
    print_summary(ui, summary() | {"pacing": p})
    assert "pacing         foreground protection on" in out.getvalue()
