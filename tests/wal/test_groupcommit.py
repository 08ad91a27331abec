"""The sync thread of group commit (wal/groupcommit.py) and batched replay."""
from __future__ import annotations

import errno
import threading

import pytest

from faults import fileio
from faults.fileio import FileLayer
from wal import Record, Wal, WalError


class FailingFsync(FileLayer):
    """Real I/O whose fdatasync fails with EIO once ``armed`` is set."""

    def __init__(self) -> None:
        self.armed = threading.Event()
        self.fsyncs = 0

    def fdatasync(self, fd: int) -> None:
        self.fsyncs += 1
        if self.armed.is_set():
            raise OSError(errno.EIO, "injected I/O error")
        super().fdatasync(fd)


def _sync_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("wal-sync")]


def test_concurrent_appenders_share_fsyncs_and_every_ack_is_durable(tmp_path) -> None:
    layer = FailingFsync()
    with fileio.use(layer):
        w = Wal.open(tmp_path, sync="group")
        before = layer.fsyncs
        errors: list[str] = []

        def run(t: int) -> None:
            for i in range(40):
                lsn = w.append(f"{t}:{i}".encode())
                if w.durable_lsn < lsn:        # acknowledged means durable
                    errors.append(f"lsn {lsn} acked at durable {w.durable_lsn}")

        threads = [threading.Thread(target=run, args=(t,)) for t in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        fsyncs = layer.fsyncs - before
        assert errors == []
        assert w.durable_lsn == w.last_lsn == 640
        # Sharing happened: fewer fsyncs than acknowledged appends (with 16 threads it is
        # far fewer; the bound is loose because the machine may be slow).
        assert fsyncs < 640
        w.close()
    assert not any(t.is_alive() for t in _sync_threads()
                   if str(tmp_path.name) in t.name)


def test_unwaited_appends_then_wait_durable_from_other_threads(tmp_path) -> None:
    w = Wal.open(tmp_path, sync="group")
    lsns = [w.append(b"x" * i, wait=False) for i in range(100)]
    done: list[int] = []

    def waiter(lsn: int) -> None:
        w.wait_durable(lsn)
        done.append(lsn)

    ts = [threading.Thread(target=waiter, args=(lsn,)) for lsn in lsns[::10]]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    assert sorted(done) == lsns[::10]
    assert w.durable_lsn >= lsns[-10]
    w.close()


def test_fsync_failure_fails_every_waiter_and_is_latched(tmp_path) -> None:
    layer = FailingFsync()
    with fileio.use(layer):
        w = Wal.open(tmp_path, sync="group")
        assert w.append(b"before") == 1
        layer.armed.set()
        results: list[str] = []

        def run() -> None:
            try:
                w.append(b"during")
                results.append("acked")
            except WalError as e:
                results.append("failed" if "fsync" in str(e) else f"other: {e}")

        ts = [threading.Thread(target=run) for _ in range(6)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(10)
        assert results == ["failed"] * 6
        assert w.durable_lsn == 1
        with pytest.raises(WalError, match="failed earlier"):
            w.append(b"after")
        with pytest.raises(WalError):
            w.sync()
        w.close()     # a failed log closes without fsyncing
    w = Wal.open(tmp_path)
    assert [r.payload for r in w.read_from()][0] == b"before"
    w.close()


def test_close_ends_the_sync_thread_and_releases_waiters(tmp_path) -> None:
    w = Wal.open(tmp_path, sync="group")
    w.append(b"a")

    def ours(t: threading.Thread) -> bool:
        return t.name.startswith("wal-sync") and t.name.endswith(f" {tmp_path.name}")

    assert any(ours(t) for t in threading.enumerate())
    lsn = w.append(b"b", wait=False)
    w.close()
    assert w.durable_lsn == lsn
    assert not any(ours(t) and t.is_alive() for t in threading.enumerate())
    w.wait_durable(lsn)      # durable already: returns even though closed


def test_none_and_always_modes_start_no_sync_thread_until_asked(tmp_path) -> None:
    for mode in ("none", "always"):
        d = tmp_path / mode
        w = Wal.open(d, sync=mode)
        w.append_many([b"r"] * 10)
        w.append(b"s")
        assert not any(t.name.startswith("wal-sync") and t.name.endswith(f" {mode}")
                       for t in threading.enumerate())
        w.sync()
        assert w.durable_lsn == w.last_lsn == 11
        w.close()


def test_read_batches_equal_read_from_across_segments_and_from_any_lsn(tmp_path) -> None:
    w = Wal.open(tmp_path, sync="none", segment_size=4096)
    for i in range(700):
        w.append(bytes([i % 251]) * (i % 90), type=i % 3)
    for start in (1, 2, 333, 700):
        recs = list(w.read_from(start))
        batches = list(w.read_batches(start))
        flat = [r for b in batches for r in b]
        assert all(b for b in batches)
        assert flat == recs and [r.lsn for r in recs] == list(range(start, 701))
        assert isinstance(recs[0], Record) and recs[0].type == (start - 1) % 3
    other = [r for b in Wal.reader(tmp_path).read_from(5).batches() for r in b]
    assert other == list(w.read_from(5))
    assert list(w.read_batches(701)) == []
    w.close()


class BrokenWrite(FileLayer):
    """A write that fails with something no one expects (not an OSError)."""

    def __init__(self) -> None:
        self.armed = False

    def write(self, fd: int, data) -> int:
        if self.armed:
            raise RuntimeError("injected bug in the file layer")
        return super().write(fd, data)


def test_unexpected_error_in_the_sync_thread_fails_waiters_instead_of_hanging(tmp_path) -> None:
    layer = BrokenWrite()
    with fileio.use(layer):
        w = Wal.open(tmp_path, sync="group")
        assert w.append(b"ok") == 1
        layer.armed = True
        # The queued record is written by the sync thread, which hits the bug.
        with pytest.raises(WalError, match="sync thread"):
            w.append(b"queued")
        with pytest.raises(WalError):
            w.append(b"later")
        w.close()
    w = Wal.open(tmp_path)
    assert [r.payload for r in w.read_from()] == [b"ok"]
    w.close()


def test_a_waiter_interrupted_by_a_signal_does_not_stall_the_others() -> None:
    """Waiters of one fsync are woken one after the other (a baton); one that gives up
    (a signal in the main thread) must still hand the baton on."""
    import signal

    from wal import tickets

    def ticket() -> list:
        gate = threading.Lock()
        gate.acquire()
        return [None, 0, gate, 0, None, False]

    t1, t2, t3 = ticket(), ticket(), ticket()
    done: list[int] = []
    others = [threading.Thread(target=lambda t=t: done.append(tickets.wait(t)))
              for t in (t1, t3)]
    for th in others:
        th.start()

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):
            tickets.wait(t2)         # main thread, interrupted before its turn
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert t2[5] is True
    tickets.finish([t1, t2, t3], True)
    for th in others:
        th.join(10)
    assert not any(th.is_alive() for th in others) and done == [0, 0]


@pytest.mark.parametrize("sync_threads", [1, 2])
def test_concurrent_group_appends_each_get_a_unique_durable_lsn(tmp_path, monkeypatch,
                                                                sync_threads: int) -> None:
    from wal import groupcommit

    monkeypatch.setattr(groupcommit.GroupCommitter.__init__, "__defaults__", (sync_threads,))
    w = Wal.open(tmp_path, sync="group", segment_size=4096)
    got: dict[int, bytes] = {}

    def run(i: int) -> None:
        for k in range(60):
            p = f"t{i}-{k}".encode()
            lsn = w.append(p)
            assert lsn <= w.durable_lsn
            got[lsn] = p

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert sorted(got) == list(range(1, 481))
    w.close()
    w = Wal.open(tmp_path, segment_size=4096)
    assert {r.lsn: r.payload for r in w.read_from()} == got
    w.close()


class SlowDirFsync(FileLayer):
    """Real I/O whose directory fsync blocks until ``release`` is set once ``armed``."""

    def __init__(self) -> None:
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def fsync_dir(self, path: str) -> None:
        if self.armed:
            self.entered.set()
            assert self.release.wait(30)
        super().fsync_dir(path)


@pytest.mark.parametrize("mode", ["none", "group", "always"])
def test_appends_do_not_wait_for_segment_reclaim(tmp_path, mode) -> None:
    # truncate_before's unlink + directory fsync is a journal commit (30-40 ms on the
    # dev disk); it used to run under the writer's lock and stall every append.
    layer = SlowDirFsync()
    with fileio.use(layer):
        w = Wal.open(tmp_path, sync=mode, segment_size=4096)
        for i in range(200):
            w.append(b"r%03d" % i + b"x" * 200)
        assert len(list(tmp_path.glob("*.wal"))) > 3
        layer.armed = True
        result: list[int] = []
        t = threading.Thread(target=lambda: result.append(w.truncate_before(150)))
        t.start()
        assert layer.entered.wait(10)          # the reclaim is inside its dir fsync
        done = threading.Event()

        def appender() -> None:
            for i in range(20):
                w.append(b"during %d" % i)
            done.set()
        a = threading.Thread(target=appender)
        a.start()
        try:
            assert done.wait(10), "appends stalled behind truncate_before"
        finally:
            layer.release.set()
            layer.armed = False
            t.join(10)
            a.join(10)
        assert result and result[0] >= 1
        assert w.first_lsn <= 150
        got = [r.payload for r in w.read_from(w.first_lsn)]
        assert got[-20:] == [b"during %d" % i for i in range(20)]
        w.close()
    w2 = Wal.open(tmp_path, sync="none")
    assert w2.first_lsn <= 150 and w2.last_lsn == 220
    w2.close()
