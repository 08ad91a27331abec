"""Live validation with executors that do not share the driver's files, as on a
multi-host Spark cluster: the standalone worker runs in its own mount namespace with
its own work dir, and the folder holding the cluster (and its secret) is an empty
tmpfs there. The secret reaches the executors only through ``SparkContext.addFile``;
Spark's fetch gives everyone execute permission on that copy (0600 -> 0711), which
the secret check used to refuse ("mode 711") on every executor."""
from __future__ import annotations

import glob
import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def driver_only(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("driver-only"))


@pytest.fixture(scope="module")
def apart(tmp_path_factory, driver_only):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a worker in its own mount namespace needs root and unshare")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from sparkcluster import StandaloneCluster
    cluster = StandaloneCluster(str(tmp_path_factory.mktemp("spark-apart")),
                                hide=[driver_only]).start()
    yield cluster
    cluster.stop()


def test_live_mode_with_executors_on_another_host(apart, driver_only) -> None:
    from ferry.localcluster import LocalCluster
    from sparkcluster import spark_env
    with LocalCluster(os.path.join(driver_only, "cluster"), partitions=4, backups=1,
                      wal_sync="none") as c:
        c.start(2)
        c.load(400, threads=2)
        r = subprocess.run([sys.executable, "-m", "ferry", "validate", "--cluster", c.seeds[0],
                            "--secret-file", c.secret_file, "--json", "--master",
                            apart.master_url], capture_output=True, text=True, timeout=300,
                           cwd=REPO, env=spark_env(apart.root))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["passed"] and not out["live"]["unchecked"], out
    assert len(out["live"]["partitions"]) == 4
    # the executors used the shipped copy, kept private to the executor's user
    copies = glob.glob(os.path.join(apart.work_dir(0), "app-*", "*", "secret"))
    assert copies, os.listdir(apart.work_dir(0))
    assert all(stat.S_IMODE(os.stat(p).st_mode) & 0o077 == 0 for p in copies)
