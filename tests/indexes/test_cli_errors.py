"""``ferry index`` with wrong paths and bad arguments: a clear one-line
error and no side effects, never a traceback or an index created where none was."""
from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from indexes.cli import index
from pagegen import write_partition_file

from idx_helpers import doc


@pytest.fixture
def made(tmp_path):
    """A data dir of two partition files and an index built from them."""
    data = tmp_path / "data"
    data.mkdir()
    for p in (0, 1):
        write_partition_file(str(data / f"part-{p}.bin"), p,
                             [(b"k%d" % i, doc(age=i % 10)) for i in range(100)])
    idx = tmp_path / "idx"
    r = CliRunner().invoke(index, ["rebuild", "--data", str(data), "--index", str(idx),
                                   "--def", "age=age"])
    assert r.exit_code == 0, r.output
    return str(data), str(idx)


def invoke(*args: str):  # type: ignore[no-untyped-def]
    r = CliRunner().invoke(index, list(args))
    # a clean exit (SystemExit) is fine; any other exception is a traceback for a user
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r


@pytest.mark.parametrize("where, needle", [
    ("{tmp}/idxx", "does not exist"),                   # a typo
    ("{tmp}/empty", "is not an index (no data.mdb"),    # a directory, but no index in it
    ("{data}/part-0.bin", "is not a directory"),        # a file
])
def test_verify_refuses_a_path_that_is_not_an_index(made, tmp_path, where, needle):
    data, _ = made
    (tmp_path / "empty").mkdir()
    path = where.format(tmp=tmp_path, data=data)
    before = sorted(os.listdir(tmp_path))
    r = invoke("verify", "--data", data, "--index", path)
    assert r.exit_code == 2 and needle in r.output, r.output
    assert sorted(os.listdir(tmp_path)) == before                  # nothing created
    assert not os.path.exists(os.path.join(tmp_path, "empty", "data.mdb"))
    r = invoke("verify", "--data", data, "--index", path, "--json")
    assert r.exit_code == 2 and json.loads(r.output)["ok"] is False


def test_the_corrupt_index_advice_works_as_written(made):
    """IndexCorruptError says `--index .../data.mdb`: that path is taken as its dir."""
    data, idx = made
    with open(os.path.join(idx, "data.mdb"), "r+b") as f:
        f.write(b"\xde\xad" * 8192)
    r = invoke("rebuild", "--data", data, "--index", os.path.join(idx, "data.mdb"),
               "--def", "age=age", "--reset-corrupt")
    assert r.exit_code == 0, r.output
    assert invoke("verify", "--data", data, "--index", idx).exit_code == 0


@pytest.mark.parametrize("content, needle", [
    (b'{"indexes": 5}', "expected a JSON list of definitions"),
    (b"[1, 2]", "expected a JSON list of definitions"),
    (b"{nope", "not valid JSON"),
    (b"\xff\xfe[]", "not UTF-8 text"),
    (b"[" * 100_000, "not valid JSON"),
], ids=["indexes-not-a-list", "entries-not-objects", "not-json", "not-utf8", "deep"])
def test_bad_defs_files_name_the_file(made, tmp_path, content, needle):
    data, idx = made
    defs = tmp_path / "defs.json"
    defs.write_bytes(content)
    for cmd in ("rebuild", "verify"):
        r = invoke(cmd, "--data", data, "--index", idx, "--defs", str(defs))
        assert r.exit_code == 1 and f"--defs {defs}: {needle}" in r.output, r.output


def test_verify_of_a_corrupt_partition_file_is_an_error_not_a_traceback(made, tmp_path):
    data, idx = made
    with open(os.path.join(data, "part-1.bin"), "r+b") as f:
        f.write(b"garbage" * 100)
    r = invoke("verify", "--data", data, "--index", idx)
    assert r.exit_code == 1 and "corrupt partition file" in r.output, r.output


@pytest.mark.parametrize("args", [
    ["rebuild", "--memory", "-5", "--def", "age=age"],
    ["rebuild", "--memory", "0", "--def", "age=age"],
    ["verify", "--max-details", "-1"],
])
def test_negative_sizes_are_usage_errors(made, args):
    data, idx = made
    r = invoke(*args[:1], "--data", data, "--index", idx, *args[1:])
    assert r.exit_code == 2 and "Invalid value" in r.output, r.output


def test_rebuild_at_an_unusable_index_path_names_it(made):
    data, _ = made
    r = invoke("rebuild", "--data", data, "--index", "/proc/ferry-index", "--def", "age=age")
    assert r.exit_code == 1 and "--index /proc/ferry-index: cannot create or open it" in r.output
