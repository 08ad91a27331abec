"""Scale: more data than the driver's configured memory, more partition files than
executor cores; the job must stream the files through the executors."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from validation import list_folders
from validation_pages import write_partition

DRIVER_MEMORY_MB = 600          # Spark refuses to start below ~450 MiB
PAGE = 65536                    # 64 KiB pages hold 12 KiB values inline
VALUE = 12 * 1024


@pytest.mark.slow
@pytest.mark.spark
def test_data_larger_than_driver_memory(py_env, python, tmp_path) -> None:
    parts, per = 10, 3500                     # 10 files x ~43 MiB per node
    a = tmp_path / "a" / "caches" / "big"
    b = tmp_path / "b" / "caches" / "big"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    for p in range(parts):
        rows = ((b"k%d-%d" % (p, i), (b"%08d" % i) * (VALUE // 8), i + 1) for i in range(per))
        write_partition(str(a / f"part-{p}.bin"), p, rows, page_size=PAGE)
        os.link(a / f"part-{p}.bin", b / f"part-{p}.bin")   # identical replica
    total = sum(f.size for f in list_folders([str(tmp_path / "a"), str(tmp_path / "b")]))
    assert total > 1.3 * (DRIVER_MEMORY_MB << 20)
    r = subprocess.run([python, "-m", "ferry", "validate", str(tmp_path / "a"), str(tmp_path / "b"),
                        "--master", "local[2]", "--json",
                        "--conf", f"spark.driver.memory={DRIVER_MEMORY_MB}m"],
                       env=py_env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert res["passed"] is True
    assert res["entries"] == 2 * parts * per
    assert res["partitions_checked"] == parts
