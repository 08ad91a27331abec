"""The decoder zip that cluster executors get (no Spark needed)."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import crc32c

from validation.ship import build_zip
from validation_pages import entries, write_partition


def test_zip_holds_decoder_and_source_with_stub_inits(tmp_path) -> None:
    out = str(tmp_path / "ferry_decoder.zip")
    names = build_zip(out)
    assert "checkpoint/pagefile.py" in names and "validation/source.py" in names
    with zipfile.ZipFile(out) as z:
        # package __init__s are stubs, so an executor imports the decoder alone
        assert z.read("checkpoint/__init__.py") == b""
        assert z.read("validation/__init__.py") == b""
        assert not any(n.startswith(("checkpoint/store", "wal/")) for n in z.namelist())


def test_zip_alone_decodes_a_partition_file(tmp_path) -> None:
    out = str(tmp_path / "ferry_decoder.zip")
    build_zip(out)
    part = str(tmp_path / "part-3.bin")
    write_partition(part, 3, entries(3, 500))
    # -S -E: no site-packages, no PYTHONPATH, no editable-install hook: only the zip and
    # the folder holding crc32c (a C extension, installed on executors) are on the path.
    crc_dir = os.path.dirname(os.path.dirname(os.path.abspath(crc32c.__file__)))
    code = ("import sys; sys.path[:0] = [%r, %r]\n"
            "import checkpoint.pagefile as pf\n"
            "assert pf.__file__.startswith(%r), pf.__file__\n"
            "print(sum(1 for _ in pf.iter_entries(%r)))\n") % (out, crc_dir, out, part)
    r = subprocess.run([sys.executable, "-S", "-E", "-c", code], capture_output=True,
                       text=True, timeout=60, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "500"
