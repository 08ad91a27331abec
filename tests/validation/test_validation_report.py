"""Outcome rendering: the exact --json keys, the summary, the HTML report."""
from __future__ import annotations

import json

import pytest

from validation import ValidationError
from validation.compare import PartitionState, Replica, render_key
from validation.report import JSON_KEYS, Outcome, render_html, summary, write_html


def outcome(expected: dict | None = None) -> Outcome:
    ok = PartitionState("users", 0, {"a": Replica("a", 10, "d1", 0), "b": Replica("b", 10, "d1", 0)})
    bad = PartitionState("<x>", 1, {"a": Replica("a", 10, "d1", 0), "b": Replica("b", 9, "d2", 1)})
    div = [{"cache": "<x>", "partition": 1, "keys_total": 1,
            "keys": [{"key": "k<1>", "key_hex": "6b3c313e", "kind": "missing",
                      "nodes": {"a": {"value_hash": 1, "counter": 2, "tombstone": False}, "b": None}}],
            "owners": {"a": {"entries": 10, "digest": "d1"}, "b": {"entries": 9, "digest": "d2"}}}]
    corrupt = [{"node": "b", "cache": "<x>", "partition": 1, "page": 3, "offset": 12288,
                "reason": "CRC mismatch"}]
    return Outcome([ok, bad], div, corrupt, expected, 1.5, files=4, nodes=["a", "b"])


def test_json_has_exactly_the_documented_keys() -> None:
    res = outcome().to_json()
    assert tuple(res) == tuple(k for k in JSON_KEYS if k != "expected")
    assert (res["passed"], res["partitions_checked"], res["entries"]) == (False, 2, 39)
    exp = {"missing": 0, "extra": 0, "wrong": 0, "rows": 5, "examples": []}
    res = outcome(exp).to_json()
    assert tuple(res) == JSON_KEYS and res["expected"] == exp
    json.dumps(res)   # serialisable as is


def test_passed_only_when_nothing_is_wrong() -> None:
    clean = Outcome(outcome().states[:1], [], [], None, 1.0)
    assert clean.passed
    clean.expected = {"missing": 0, "extra": 1, "wrong": 0, "rows": 1, "examples": []}
    assert not clean.passed


def test_summary_and_html_name_the_problem() -> None:
    o = outcome()
    text = summary(o)
    assert text.startswith("FAILED: 2 partitions of 2 caches on 2 nodes")
    assert "divergent <x>/1" in text and "'k<1>'" in text and "corrupt page 3" in text
    page = render_html(o)
    assert page.count("<table>") == 3            # two caches + corrupt pages
    assert "<h2>cache &lt;x&gt;</h2>" in page and "<x>" not in page   # names are escaped
    assert "k&lt;1&gt;" in page and "DIVERGENT" in page


def test_report_into_missing_folder_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(ValidationError, match="cannot write report"):
        write_html(str(tmp_path / "no" / "r.html"), outcome())
    write_html(str(tmp_path / "r.html"), outcome())
    assert (tmp_path / "r.html").read_text().startswith("<!doctype html>")


def test_render_key() -> None:
    assert render_key(b"user:1") == "user:1"
    assert render_key(b"\x00\xff") == "0x00ff"
    assert render_key(b"tab\there") == "0x" + b"tab\there".hex()
