"""Write-behind: every ``WRITE_BEHIND`` bytes the sync thread fsyncs the segment in the
background (nobody waits), so a cut never has a whole segment left to fsync."""
from __future__ import annotations

import threading
import time

import pytest

from wal import Wal
from wal import writer


@pytest.fixture
def small_write_behind(monkeypatch):
    monkeypatch.setattr(writer, "WRITE_BEHIND", 2048)


def test_mode_none_gets_fsynced_in_the_background(tmp_path, small_write_behind) -> None:
    w = Wal.open(tmp_path, sync="none", segment_size=1 << 20)
    for i in range(200):
        w.append(bytes(100))
    w.append_many([bytes(50)] * 100)
    deadline = time.monotonic() + 10
    while w.durable_lsn < 100 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert w.durable_lsn >= 100          # nobody called sync()
    assert w.durable_lsn <= w.last_lsn
    w.close()


def test_background_fsyncs_do_not_stall_group_commit_waiters(tmp_path,
                                                             small_write_behind) -> None:
    """Tickets nobody waits for sit in the same baton chains as real waiters."""
    w = Wal.open(tmp_path, sync="group", segment_size=16384)
    done = []

    def run(t: int) -> None:
        for i in range(150):
            if i % 10 == 0:
                w.append_many([b"%d-%d" % (t, i)] * 5)
            else:
                w.append(b"x" * 300, wait=(i % 3 != 0))
        done.append(t)

    ts = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for th in ts:
        th.start()
    for th in ts:
        th.join(60)
    assert sorted(done) == [0, 1, 2, 3]
    w.sync()
    assert w.durable_lsn == w.last_lsn == 4 * (135 + 15 * 5)
    w.close()
    assert len(list(Wal.reader(tmp_path).read_from())) == 4 * (135 + 15 * 5)
