"""What one bad file can cost a validation run: a crafted meta page over a sparse file
(every page a corrupt page) yields MAX_LISTED problem rows and one row counting the
rest; a file name whose partition number does not fit, or that is not the partition's
own name, is a finding of the run instead of a crashed Spark job."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from checkpoint.layout import encode_meta, seal  # noqa: E402
from validation import list_folders  # noqa: E402
from validation.compare import corrupt_count  # noqa: E402
from validation.report import Outcome, render_html, summary  # noqa: E402
from validation.source import MAX_LISTED, decode_task  # noqa: E402
from validation_pages import entries, write_node  # noqa: E402

PS = 4096


def _crafted(path: str, pages: int) -> None:
    """A valid meta page that claims ``pages`` pages over a sparse file of zeros."""
    meta = encode_meta(7, PS, pages, 1)
    seal(meta)
    with open(path, "wb") as f:
        f.write(meta)
        f.truncate(pages * PS)


def _problems(path: str) -> list[dict]:
    rows = []
    for b in decode_task({"node": "n", "cache": "c", "partition": 7, "path": path}):
        rows += [p for p in b.column("problem").to_pylist() if p is not None]
    return rows


def test_crafted_meta_page_costs_a_bounded_report(tmp_path) -> None:
    path = str(tmp_path / "part-7.bin")
    _crafted(path, 20_000)                      # 80 MB sparse: 19,999 zero pages
    rows = _problems(path)
    assert len(rows) == MAX_LISTED + 1
    assert [r["count"] for r in rows[:MAX_LISTED]] == [1] * MAX_LISTED
    assert [r["page"] for r in rows[:MAX_LISTED]] == list(range(1, MAX_LISTED + 1))
    last = rows[-1]
    assert last["count"] == 19_999 - MAX_LISTED and last["page"] == MAX_LISTED + 1
    assert f"{19_999 - MAX_LISTED} more corrupt pages not listed (pages {MAX_LISTED + 1}..19999)" \
        in last["reason"]


def test_one_page_past_the_limit_is_listed_as_itself(tmp_path) -> None:
    path = str(tmp_path / "part-7.bin")
    _crafted(path, MAX_LISTED + 2)
    rows = _problems(path)
    assert len(rows) == MAX_LISTED + 1 and all(r["count"] == 1 for r in rows)


def test_report_counts_the_unlisted_pages() -> None:
    listed = [{"node": "n", "cache": "c", "partition": 7, "page": i, "offset": i * PS,
               "reason": "bad CRC"} for i in range(1, 4)]
    rest = {"node": "n", "cache": "c", "partition": 7, "page": 4, "offset": 4 * PS,
            "reason": "996 more corrupt pages not listed (pages 4..999); the first: bad CRC",
            "count": 996}
    o = Outcome([], [], listed + [rest])
    assert corrupt_count(o.corrupt_pages) == 999 and not o.passed
    text = summary(o, max_lines=2)
    assert "... 997 more corrupt pages" in text
    assert "999 corrupt pages" in render_html(o)
    assert "996 more corrupt pages of n c/7" in summary(o, max_lines=10)


def test_bad_file_names_are_findings(tmp_path) -> None:
    d = write_node(str(tmp_path / "a"), "users", {0: entries(0, 3)}, node_id="node-a")
    folder = os.path.join(d, "caches", "users")
    for name in ("part-99999999999.bin", "part-007.bin"):
        with open(os.path.join(folder, name), "wb") as f:
            f.write(b"\0" * 100)
    files = {f.partition: f for f in list_folders([d])}
    assert files[0].problem is None
    assert "partition number 99999999999 is above 2147483647" in files[99999999999].problem
    assert "part-007.bin is not the name of partition 7's file (part-7.bin)" in files[7].problem
