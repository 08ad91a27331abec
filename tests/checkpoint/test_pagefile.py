"""The decoder: round trips, the corruption table, check_page, the CLI."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from checkpoint import pagefile
from checkpoint.cli import partition as cli
from checkpoint.pagefile import CorruptPageError, iter_entries, read_meta, verify


def _build(open_store, page_size=4096):
    s = open_store(page_size=page_size)
    model = {}
    for i in range(300):
        k = b"key-%04d" % i
        v = bytes([i % 251]) * (i * 37 % 3000)
        s.put(7, k, v)
        model[k] = v
    big = os.urandom(200_000)                 # overflow chain of ~50 pages
    s.put(7, b"big", big)
    model[b"big"] = big
    for i in range(0, 300, 10):
        s.remove(7, b"key-%04d" % i)
        del model[b"key-%04d" % i]
    s.close()
    return s, model


@pytest.mark.parametrize("page_size", [1024, 4096, 65536])
def test_round_trip_through_decoder(open_store, page_size) -> None:
    s, model = _build(open_store, page_size)
    path = s.partition_path(7)
    meta = read_meta(path)
    assert (meta.partition, meta.page_size, meta.version) == (7, page_size, 1)
    assert meta.counter == 331
    live = {e.key: e.value for e in iter_entries(path, include_tombstones=False)}
    assert live == model
    tomb = [e for e in iter_entries(path) if e.tombstone]
    assert len(tomb) == 30 and all(e.value is None for e in tomb)
    assert verify(path) == []


def test_pagefile_imports_alone() -> None:
    """Spark executors import the decoder with nothing else of Ferry."""
    code = ("import sys, checkpoint.pagefile as p; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('wal', 'transfer', 'node')"
            " or m in ('checkpoint.store', 'checkpoint.memory')]; print(bad)")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _flip(offset_of):
    def corrupt(path: str) -> None:
        with open(path, "r+b") as f:
            off = offset_of(path)
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0xFF]))
    return corrupt


def _truncate(path: str) -> None:
    size = os.path.getsize(path)
    os.truncate(path, size - 4096 - 100)


def _zero_page(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(4096 * 3)
        f.write(bytes(4096))


def _bad_magic(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(16)
        f.write(b"NOTFERRY")


def _misplaced(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(4096 * 2)
        two = f.read(4096)
        f.seek(4096 * 3)
        f.write(two)


CORRUPTIONS = [
    # name, corrupt(path), first bad page, reason fragment
    ("flipped byte in a data page", _flip(lambda p: 4096 * 2 + 2000), 2, "CRC mismatch"),
    ("flipped byte in the meta page", _flip(lambda p: 30), 0, "CRC mismatch"),
    ("bad magic in the meta page", _bad_magic, 0, ""),
    ("page of zeros", _zero_page, 3, "all zeros"),
    ("page copied to the wrong place", _misplaced, 3, "misplaced"),
    ("truncated file", _truncate, None, "truncated"),
]


@pytest.mark.parametrize("name,corrupt,page,reason", CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_corruption_table(open_store, tmp_path, name, corrupt, page, reason) -> None:
    s, _model = _build(open_store)
    path = s.partition_path(7)
    pages = read_meta(path).page_count
    corrupt(path)
    problems = verify(path)
    assert problems, name
    if page is not None:
        assert problems[0].page == page
    assert reason in problems[0].reason
    # strict iteration raises, naming file, page and offset
    with pytest.raises(CorruptPageError) as ei:
        list(iter_entries(path))
    assert path in str(ei.value) and f"page {problems[0].page}" in str(ei.value)
    # lenient iteration reports and skips
    seen = []
    list(iter_entries(path, on_error=seen.append))
    assert seen
    # the CLI exits 1 naming the first bad page
    r = CliRunner().invoke(cli, ["verify", path])
    assert r.exit_code == 1 and f"page {problems[0].page}" in r.output
    if page is not None and page > 0:
        # the store refuses to open it with the same clear error, and loses nothing
        before = open(path, "rb").read()
        with pytest.raises(CorruptPageError, match=f"page {page}"):
            open_store()
        assert open(path, "rb").read() == before
    assert pages >= 1


def test_check_page_direct(open_store) -> None:
    s, _ = _build(open_store)
    path = s.partition_path(7)
    data = open(path, "rb").read()
    for i in range(len(data) // 4096):
        assert pagefile.check_page(data[i * 4096:(i + 1) * 4096], i, 4096) is None
    page = bytearray(data[4096:8192])
    assert "index" in pagefile.check_page(page, 5, 4096)
    assert "short" in pagefile.check_page(page[:100], 1, 4096)
    page[100] ^= 1
    assert "CRC" in pagefile.check_page(page, 1, 4096)


def test_not_a_partition_file(tmp_path) -> None:
    p = tmp_path / "x.bin"
    p.write_bytes(b"hello")
    with pytest.raises(CorruptPageError, match="too short"):
        read_meta(str(p))
    p.write_bytes(os.urandom(8192))
    with pytest.raises(CorruptPageError, match="page 0"):
        read_meta(str(p))


def test_cli_info_dump_verify(open_store) -> None:
    s, model = _build(open_store)
    path = s.partition_path(7)
    r = CliRunner().invoke(cli, ["info", path, "--json"])
    assert r.exit_code == 0
    info = json.loads(r.output)
    assert info["partition"] == 7 and info["counter"] == 331
    r = CliRunner().invoke(cli, ["dump", path, "--json"])
    rows = [json.loads(line) for line in r.output.splitlines()]
    assert {base64.b64decode(o["key"]): base64.b64decode(o["value"]) for o in rows} == model
    assert all(o["tombstone"] is False and o["counter"] > 0 for o in rows)
    r = CliRunner().invoke(cli, ["dump", path, "--json", "--tombstones"])
    assert sum(json.loads(x)["tombstone"] for x in r.output.splitlines()) == 30
    r = CliRunner().invoke(cli, ["verify", path, "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["ok"] is True
    r = CliRunner().invoke(cli, ["verify", path])
    assert r.exit_code == 0 and r.output.startswith("ok:")


def test_ferry_command_runs_group(open_store, py_env) -> None:
    s, _ = _build(open_store)
    r = subprocess.run([sys.executable, "-c", "import sys; from ferry.cli import main; "
                        "sys.argv = ['ferry'] + sys.argv[1:]; main()",
                        "partition", "info", s.partition_path(7)],
                       env=py_env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "page_count" in r.stdout
