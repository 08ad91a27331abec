from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest

from wal import Wal, WalError


def ferry(py_env, python, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "ferry", "wal", *args], env=py_env,
                          capture_output=True, text=True, timeout=60)


def make_log(d: Path) -> None:
    w = Wal.open(d, segment_size=4096, sync="none")
    for i in range(100):
        w.append(f"payload {i}".encode() * 5, type=i % 3)
    w.close()


def test_dump_json_and_from(tmp_path, py_env, python) -> None:
    make_log(tmp_path)
    r = ferry(py_env, python, "dump", str(tmp_path), "--json", "--from", "95")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["lsn"] for row in rows] == [95, 96, 97, 98, 99, 100]
    assert rows[0] == {"lsn": 95, "type": 94 % 3, "length": len(b"payload 94" * 5),
                       "payload": base64.b64encode(b"payload 94" * 5).decode()}
    r = ferry(py_env, python, "dump", str(tmp_path))
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 100


def test_verify_clean_then_corrupt_then_repair(tmp_path, py_env, python) -> None:
    d = tmp_path / "log"
    make_log(d)
    r = ferry(py_env, python, "verify", str(d), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["records"] == 100
    seg = sorted(p for p in d.iterdir() if p.suffix == ".wal")[1]
    data = bytearray(seg.read_bytes())
    data[300] ^= 0xFF
    seg.write_bytes(bytes(data))
    r = ferry(py_env, python, "verify", str(d), "--json")
    assert r.returncode == 1
    bad = json.loads(r.stdout)["corruption"]
    assert bad["file"] == str(seg) and bad["offset"] <= 300
    r = ferry(py_env, python, "verify", str(d))
    assert r.returncode == 1 and f"{seg} at offset {bad['offset']}" in r.stderr
    r = ferry(py_env, python, "dump", str(d))
    assert r.returncode == 1 and "corrupt" in r.stderr
    # repair needs --backup
    r = ferry(py_env, python, "repair", str(d))
    assert r.returncode == 2 and "--backup" in r.stderr
    r = ferry(py_env, python, "repair", str(d), "--backup", str(tmp_path / "copy"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "copy" / seg.name).read_bytes() == bytes(data)
    r = ferry(py_env, python, "verify", str(d), "--json")
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and 0 < rep["records"] < 100


# -- things that are not segment files ------------------------------------------------
# One line on stderr that says what is wrong, where and what to do; exit status 2 (not
# corruption of the log's bytes: a person has to move something); never a traceback.

def _one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


@pytest.mark.parametrize("which", [0, -1])
def test_a_directory_in_place_of_a_segment(tmp_path, py_env, python, which: int) -> None:
    d = tmp_path / "log"
    make_log(d)
    seg = sorted(p for p in d.iterdir() if p.suffix == ".wal")[which]
    seg.unlink()
    seg.mkdir()
    (seg / "stray").write_bytes(b"x")
    for args in (["verify", str(d)], ["verify", str(d), "--json"], ["dump", str(d)],
                 ["repair", str(d), "--backup", str(tmp_path / "copy")]):
        r = ferry(py_env, python, *args)
        _one_line_error(r, str(seg), "is a directory", "move it out")
    assert seg.is_dir() and (seg / "stray").exists()      # nothing was changed
    with pytest.raises(WalError, match="is a directory"):
        Wal.open(d)
    with pytest.raises(WalError, match="is a directory"):
        list(Wal.reader(d).read_from())


def test_a_directory_with_a_bad_segment_name(tmp_path, py_env, python) -> None:
    d = tmp_path / "log"
    make_log(d)
    (d / "junk.wal").mkdir()
    for args in (["verify", str(d)], ["dump", str(d)],
                 ["repair", str(d), "--backup", str(tmp_path / "copy")]):
        _one_line_error(ferry(py_env, python, *args), str(d / "junk.wal"), "is a directory")
    assert (d / "junk.wal").is_dir()


def test_a_renamed_segment_is_reported_not_a_traceback(tmp_path, py_env, python) -> None:
    d = tmp_path / "log"
    make_log(d)
    seg = sorted(p for p in d.iterdir() if p.suffix == ".wal")[1]
    renamed = d / ("x" + seg.name)
    seg.rename(renamed)
    r = ferry(py_env, python, "verify", str(d))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"CORRUPT: {renamed} at offset 0" in r.stderr and "rename" in r.stderr
    r = ferry(py_env, python, "dump", str(d))
    assert r.returncode == 1 and "Traceback" not in r.stderr and str(renamed) in r.stderr
    r = ferry(py_env, python, "repair", str(d), "--backup", str(tmp_path / "copy"))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert (tmp_path / "copy" / renamed.name).exists()    # the backup keeps it
    r = ferry(py_env, python, "verify", str(d))
    assert r.returncode == 0, r.stderr
