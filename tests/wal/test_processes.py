"""Real processes: SIGKILL of a group-commit writer, crash points at the fsync, and a
follower in another process reading while the writer appends."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from wal import Wal, WalLockedError

sys.path.insert(0, os.path.dirname(__file__))
from wal_child import follow_payload, payload  # noqa: E402

CHILD = os.path.join(os.path.dirname(__file__), "wal_child.py")


def start_appender(py_env, python, d: Path, env_extra: dict[str, str] | None = None,
                   threads: int = 4) -> subprocess.Popen:
    env = dict(py_env, **(env_extra or {}))
    p = subprocess.Popen([python, CHILD, "append", str(d), str(threads), "8192"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "READY", p.stderr.read() if p.stderr else ""
    return p


def acked_of(out: str) -> dict[int, bytes]:
    acked = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "ACK":
            acked[int(parts[1])] = payload(int(parts[2]), int(parts[3]))
    return acked


def check_after_crash(d: Path, acked: dict[int, bytes]) -> int:
    w = Wal.open(d, segment_size=8192)
    recs = list(w.read_from())
    w.close()
    assert [r.lsn for r in recs] == list(range(1, len(recs) + 1))     # in order, no hole
    by_lsn = {r.lsn: r.payload for r in recs}
    missing = [lsn for lsn in acked if lsn not in by_lsn]
    assert not missing, f"acknowledged records lost: {missing[:10]}"
    assert all(by_lsn[lsn] == p for lsn, p in acked.items())          # byte-exact
    return len(recs)


@pytest.mark.parametrize("seed", [1, 2])
def test_sigkill_group_commit_writer_keeps_every_ack(tmp_path, py_env, python, seed) -> None:
    d = tmp_path / "log"
    p = start_appender(py_env, python, d)
    time.sleep(random.Random(seed).uniform(0.3, 1.2))
    p.send_signal(signal.SIGKILL)
    out, _ = p.communicate(timeout=30)
    acked = acked_of(out)
    assert len(acked) > 10
    total = check_after_crash(d, acked)
    assert total >= max(acked)


@pytest.mark.parametrize("point", ["wal.before_sync:25", "wal.after_sync:25"])
def test_crash_points_at_the_fsync(tmp_path, py_env, python, point) -> None:
    d = tmp_path / "log"
    p = start_appender(py_env, python, d, {"FERRY_CRASH": point}, threads=3)
    out, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL, err
    acked = acked_of(out)
    check_after_crash(d, acked)


def test_second_writer_in_another_process_is_refused(tmp_path, py_env, python) -> None:
    d = tmp_path / "log"
    p = start_appender(py_env, python, d, threads=1)
    assert p.stdout is not None and p.stdout.readline().startswith("ACK 1 ")
    try:
        with pytest.raises(WalLockedError, match="already open for writing.*pid"):
            Wal.open(d)
        assert next(iter(Wal.reader(d).read_from())).lsn == 1     # readers are welcome
    finally:
        p.kill()
        p.communicate(timeout=30)
    Wal.open(d).close()          # the lock died with the process


def _follow(tmp_path, py_env, python, count: int) -> None:
    d = tmp_path / "log"
    w = Wal.open(d, sync="none", segment_size=4 << 20)
    child = subprocess.Popen([python, CHILD, "follow", str(d), str(count)], env=py_env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lsn, digest, rng = 1, 0, random.Random(7)
    while lsn <= count:
        n = min(count - lsn + 1, rng.choice([1, 1, 10, 500, 2000]))
        batch = [follow_payload(x) for x in range(lsn, lsn + n)]
        if n == 1:
            w.append(batch[0])
        else:
            w.append_many(batch)
        for b in batch:
            digest = zlib.crc32(b, digest)
        lsn += n
    out, err = child.communicate(timeout=600)
    w.close()
    assert child.returncode == 0, out + err
    assert out.split() == ["DONE", str(count), str(digest)]


def test_follower_in_another_process_100k(tmp_path, py_env, python) -> None:
    _follow(tmp_path, py_env, python, 100_000)


@pytest.mark.slow
def test_follower_in_another_process_1m(tmp_path, py_env, python) -> None:
    _follow(tmp_path, py_env, python, 1_000_000)
