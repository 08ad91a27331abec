"""The config file's keys are declared once (node/config.py ``Setting``, on the
NodeConfig fields): docs/node.md's key table names every one and marks exactly the
live ones "Live."; every declared range and choice is enforced, in the file and in
``ferry cluster settings set``."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from node.config import KEYS, LIVE_KEYS, NodeConfig, Setting, _KEYS, validate, with_overrides
from node.errors import ConfigError
from node.membership import SETTINGS
from node.settings import parse
from node.watch import LIVE

DOC = Path(__file__).resolve().parents[2] / "docs" / "node.md"
CFG = NodeConfig(id="n1", data="/tmp/x")


def doc_rows() -> list[tuple[list[str], str]]:
    """(the keys a row of "Configuration keys" names, its meaning) for each row;
    ``[checkpoint] page_size` / `memory_budget`` names checkpoint.page_size and
    checkpoint.memory_budget. The [[caches]] rows are not keys of NodeConfig."""
    text = DOC.read_text()
    table = text[text.index("### Configuration keys"):]
    table = table[:table.index("\n\n", table.index("| TOML |"))]
    rows = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if not line.startswith("| `") or cells[0].startswith("`[["):
            continue
        names = re.findall(r"`([^`]*)`", cells[0])
        table_name, _, first = names[0].rpartition(" ")
        section = table_name.strip("[]")
        keys = [f"{section}.{n}" if section else n for n in [first, *names[1:]]]
        rows.append((keys, cells[3]))
    return rows


def test_the_doc_table_names_every_declared_key_and_no_other() -> None:
    documented = [k for keys, _ in doc_rows() for k in keys]
    declared = [s.key for s in KEYS]
    assert sorted(set(declared) - set(documented)) == [], "declared in node/config.py, not in docs/node.md"
    assert sorted(set(documented) - set(declared)) == [], "in docs/node.md, not declared in node/config.py"
    assert len(documented) == len(set(documented)), "a key in two rows of docs/node.md"


def test_the_doc_table_marks_exactly_the_live_keys() -> None:
    for keys, meaning in doc_rows():
        live = {k in LIVE_KEYS for k in keys}
        assert len(live) == 1, f"{keys}: one row mixes live keys and keys that need a restart"
        assert ("Live." in meaning) == live.pop(), f"{keys}: 'Live.' in docs/node.md must match live=True"


def test_the_derived_tables_agree() -> None:
    assert SETTINGS == LIVE_KEYS and LIVE == frozenset(LIVE_KEYS.values())
    assert _KEYS == {tuple(s.key.split(".")): s.field for s in KEYS}
    assert all(s.field in NodeConfig.__dataclass_fields__ for s in KEYS)
    assert all(s.help and "\n" not in s.help for s in KEYS)
    assert all(s.kind in ("whole", "number", "bool", "choice") for s in KEYS if s.live), \
        "ferry cluster settings set reads numbers, booleans and choices"
    validate(CFG)                         # every default is valid


def bad_values(s: Setting) -> list[object]:
    """Values the declaration of ``s`` refuses."""
    if s.kind in ("whole", "number"):
        lo, hi, _ = s.bounds(CFG)
        out: list[object] = ["1", True, float("nan")]
        if lo is not None:
            out.append(lo - (1 if s.kind == "whole" else 0.001))
        if hi is not None:
            out.append(hi + (1 if s.kind == "whole" else 0.001))
        if s.kind == "whole":
            out.append(1.5)
        return out
    if s.kind == "bool":
        return [1, "yes", None]
    if s.kind == "choice":
        return ["no-such-choice", 1, None]
    return []


CASES = [(s, v) for s in KEYS for v in bad_values(s)]


@pytest.mark.parametrize("s, value", CASES, ids=[f"{s.key}={v!r}" for s, v in CASES])
def test_every_declared_range_is_enforced(s: Setting, value: object) -> None:
    with pytest.raises(ConfigError, match=re.escape(s.key)):
        with_overrides(CFG, **{s.field: value})


def bad_words(s: Setting) -> list[str]:
    """What ``ferry cluster settings set`` refuses for ``s``, as typed."""
    if s.kind == "bool":
        return ["maybe", "2"]
    if s.kind == "choice":
        return ["no-such-choice"]
    return [str(v) for v in bad_values(s) if isinstance(v, (int, float)) and not isinstance(v, bool)]


LIVE_CASES = [(s, raw) for s in KEYS if s.live for raw in bad_words(s)]


@pytest.mark.parametrize("s, raw", LIVE_CASES, ids=[f"{s.key}={r}" for s, r in LIVE_CASES])
def test_ferry_cluster_settings_set_refuses_the_same(s: Setting, raw: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(s.key)):
        parse(s.key, raw)
