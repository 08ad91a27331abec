"""The same validations on a real Spark standalone cluster (a master and a worker
started with spark-class on 127.0.0.1) as on local Spark: identical JSON answers,
through ``ferry validate --master spark://...``, ``spark-submit validation/job.py``
and live mode."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from validation import validate
from validation.live import LiveSettings
from validation_pages import entries, write_node

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _folders(tmp_path) -> tuple[list[str], str]:
    """Two nodes: one changed value, one corrupt page; and an expected file with a wrong row."""
    dirs = []
    for node in ("a", "b"):
        parts = {p: entries(p, 300) for p in range(4)}
        if node == "b":
            parts[2][17] = (parts[2][17][0], b"CHANGED", parts[2][17][2])
        dirs.append(write_node(str(tmp_path / node), "users", parts, node_id=f"node-{node}"))
    path = os.path.join(dirs[1], "caches", "users", "part-1.bin")
    with open(path, "r+b") as f:
        f.seek(4096 + 100)
        f.write(b"\xff\xff")
    exp = tmp_path / "exp.jsonl"
    rows = [{"partition": 0, "key": k.decode(), "value": v.decode()} for k, v, _ in entries(0, 300)]
    rows[5]["value"] = "wrong"
    exp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dirs, str(exp)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[list[str], str]:
    return _folders(tmp_path_factory.mktemp("folders"))


@pytest.fixture(scope="module")
def local_answer(spark, folders) -> dict:
    """Local Spark's answer for ``folders``, computed once for the two remote runs
    that validate them (read-only: nothing writes to the folders)."""
    dirs, exp = folders
    return validate(dirs, spark=spark, expected=exp)


def _same(a: dict, b: dict) -> None:
    a, b = dict(a), dict(b)
    a.pop("seconds"), b.pop("seconds")
    assert a == b


def _run(args: list[str], env_extra: dict[str, str] | None = None) -> dict:
    from sparkcluster import spark_env
    env = spark_env(os.environ.get("TMPDIR", "/tmp"))
    env.update(env_extra or {})
    r = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_folder_mode_same_answers_as_local(local_answer, folders, standalone) -> None:
    dirs, exp = folders
    local = local_answer
    assert not local["passed"] and local["divergent"] and local["corrupt_pages"]
    remote = _run([sys.executable, "-m", "ferry", "validate", *dirs, "--expected", exp, "--json",
                   "--master", standalone.master_url])
    _same(local, remote)


def test_spark_submit_job_same_answers_as_local(local_answer, folders, standalone) -> None:
    from sparkcluster import spark_home
    dirs, exp = folders
    local = local_answer
    remote = _run([os.path.join(spark_home(), "bin", "spark-submit"), "--master",
                   standalone.master_url, os.path.join(REPO, "validation", "job.py"), *dirs,
                   "--expected", exp, "--json"])
    _same(local, remote)


def test_live_mode_same_answers_as_local(spark, standalone, tmp_path) -> None:
    from ferry.localcluster import LocalCluster
    with LocalCluster(str(tmp_path / "cluster"), partitions=4, backups=1, wal_sync="none") as c:
        c.start(2)
        c.load(400, threads=2)
        local = validate([], spark=spark, live=LiveSettings(seeds=c.seeds[:1],
                                                            secret_file=c.secret_file))
        remote = _run([sys.executable, "-m", "ferry", "validate", "--cluster", c.seeds[0],
                       "--secret-file", c.secret_file, "--json", "--master", standalone.master_url])
    assert local["passed"] and remote["passed"], (local, remote)
    _same(local, remote)
