"""Write-behind of checkpoint pages (checkpoint/writeback.py): ``sync_file_range``
starts the kernel's writeback of pages already written while later ones are sealed
and written.  It is a hint only: these tests check that it is issued on the real
path, that it changes no byte, that a failing or missing call is harmless, that no
in-place page is written - or handed to writeback - before the WAL is durable up to
the checkpoint's ``images_from`` (the ordering the undo images rely on), and that a
crash in the middle of a checkpoint that started writeback recovers to the model."""
from __future__ import annotations

import ctypes
import os
import random
import signal
import sys

import pytest

from checkpoint import PartitionStore, writeback
from checkpoint.writeback import WriteBehind, start_writeback

sys.path.insert(0, os.path.dirname(__file__))
from test_crash import _acked, _check, _pending, _start  # noqa: E402

needs_sfr = pytest.mark.skipif(not writeback.available(),
                               reason="sync_file_range is Linux-only")


class _Recorder:
    """Stands in for libc's sync_file_range: records every call, returns ``rc``."""

    def __init__(self, rc: int = 0, errno: int = 0) -> None:
        self.calls: list[tuple[int, int, int, int]] = []
        self.rc, self.errno = rc, errno

    def __call__(self, fd: int, offset: int, nbytes: int, flags: int) -> int:
        self.calls.append((fd, offset, nbytes, flags))
        if self.errno:
            ctypes.set_errno(self.errno)
        return self.rc


@needs_sfr
def test_start_writeback_on_a_real_file_keeps_its_bytes(tmp_path) -> None:
    path = str(tmp_path / "f")
    data = random.Random(1).randbytes(3 << 20)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        assert start_writeback(fd, 0, len(data))
        assert start_writeback(fd, 1 << 20, 4096)        # a sub-range, already clean or not
        os.fsync(fd)
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        assert f.read() == data


def test_a_refused_call_is_only_a_hint(tmp_path) -> None:
    """A bad fd (EBADF) returns False and raises nothing: errors surface at fsync."""
    fd = os.open(str(tmp_path / "f"), os.O_RDWR | os.O_CREAT, 0o644)
    os.close(fd)
    assert start_writeback(fd, 0, 4096) is False
    assert start_writeback(-1, 0, 0) is False


def test_unsupported_kernel_disables_it(monkeypatch) -> None:
    """ENOSYS once: no further calls are made."""
    fake = _Recorder(rc=-1, errno=38)
    monkeypatch.setattr(writeback, "_sync_file_range", fake)
    assert start_writeback(5, 0, 4096) is False
    assert writeback._sync_file_range is None
    assert start_writeback(5, 0, 4096) is False
    assert len(fake.calls) == 1


def test_write_behind_starts_one_range_per_threshold(monkeypatch) -> None:
    fake = _Recorder()
    monkeypatch.setattr(writeback, "_sync_file_range", fake)
    wb = WriteBehind(7, threshold=8192)
    wb.wrote(0, 4096)
    assert fake.calls == []
    wb.wrote(16384, 4096)                      # not contiguous: the range spans both
    assert fake.calls == [(7, 0, 20480, writeback.SYNC_FILE_RANGE_WRITE)]
    wb.flush()                                 # nothing pending: no call
    wb.wrote(40960, 1024)
    wb.flush()
    assert fake.calls[-1] == (7, 40960, 1024, writeback.SYNC_FILE_RANGE_WRITE)
    assert wb.started == 2


def _fill(s: PartitionStore, n: int, seed: int) -> None:
    rnd = random.Random(seed)
    s.apply_many(0, [(b"key-%08d" % i, rnd.randbytes(rnd.choice([50, 300, 5000])), i + 1)
                     for i in range(n)])


@needs_sfr
def test_checkpoint_uses_write_behind_and_writes_the_same_bytes(tmp_path, monkeypatch) -> None:
    files = []
    for name, enabled in (("on", True), ("off", False)):
        if not enabled:
            monkeypatch.setattr(writeback, "_sync_file_range", None)
        s = PartitionStore.open(str(tmp_path / name), checkpoint_interval=None,
                                wal_sync="none", memory_budget=64 << 20)
        _fill(s, 3000, 1)
        st = s.checkpoint()
        assert (st.writeback_ranges > 0) == enabled
        assert st.bytes_written > writeback.WRITE_BEHIND_BYTES
        _fill(s, 1000, 2)                      # overwrites: in-place pages too
        s.checkpoint()
        s.close()
        with open(str(tmp_path / name / "part-0.bin"), "rb") as f:
            files.append(f.read())
    assert files[0] == files[1]


def test_in_place_pages_are_written_only_after_the_wal_fsync(tmp_path, monkeypatch) -> None:
    """Every write (and write-behind start) at an offset below the file's durable page
    count happens with the WAL durable up to the checkpoint's images_from; appended
    pages may go before (they are what overlaps the WAL fsync), and no write-behind
    range spans both kinds."""
    s = PartitionStore.open(str(tmp_path / "s"), page_size=4096, checkpoint_interval=None,
                            wal_sync="none", memory_budget=64 << 20)
    monkeypatch.setattr(writeback, "WRITE_BEHIND_BYTES", 64 << 10)
    _fill(s, 2000, 3)
    s.checkpoint()
    durable_pages = s.parts[0].file_pages
    _fill_more = random.Random(4)
    for i in range(0, 2000, 3):                # overwrites below the durable page count ...
        s.put(0, b"key-%08d" % i, _fill_more.randbytes(40))
    for i in range(2000, 3500):                # ... and new entries that append pages
        s.put(0, b"key-%08d" % i, _fill_more.randbytes(3000))   # overflow pages
    s.wal.sync()
    fd = s.parts[0].write_fd()
    seen: list[tuple[str, int, int, int]] = []
    real_pwritev, real_sfr = os.pwritev, writeback._sync_file_range

    def pwritev(f, bufs, offset):
        if f == fd:
            seen.append(("write", offset, sum(map(len, bufs)), s.wal.durable_lsn))
        return real_pwritev(f, bufs, offset)

    def sfr(f, offset, nbytes, flags):
        if f == fd:
            seen.append(("writeback", offset, nbytes, s.wal.durable_lsn))
        return real_sfr(f, offset, nbytes, flags) if real_sfr is not None else 0
    monkeypatch.setattr(os, "pwritev", pwritev)
    monkeypatch.setattr(writeback, "_sync_file_range", sfr)
    st = s.checkpoint()
    monkeypatch.undo()
    assert st.overwritten > 1 and st.appended > 0
    limit = durable_pages * 4096
    in_place = [x for x in seen if x[1] < limit]
    assert any(x[0] == "write" for x in in_place)
    assert any(x[0] == "write" and x[1] >= limit for x in seen), "appended pages written"
    assert any(x[0] == "writeback" for x in seen)
    for kind, offset, nbytes, durable in in_place:
        assert durable >= st.images_from, (kind, offset, durable, st.images_from)
    for kind, offset, nbytes, _d in seen:      # no range mixes appended and in-place pages
        assert offset + nbytes <= limit or offset >= limit, (kind, offset, nbytes)
    s.close()


@pytest.mark.parametrize("nth", [2, 5])
def test_sigkill_mid_checkpoint_after_write_behind(tmp_path, py_env, nth) -> None:
    """The SIGKILL crash child with a 4 KiB write-behind threshold (every run is handed
    to writeback at once), killed at the middle of its nth checkpoint write."""
    store, ack = str(tmp_path / "store"), str(tmp_path / "ack")
    env = dict(py_env, FERRY_TEST_WRITE_BEHIND="4096")
    proc = _start(env, store, 13, 5000, ack, crash=f"checkpoint.mid_write:{nth}")
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()
    assert _pending(store)
    _check(store, 13, _acked(ack))
