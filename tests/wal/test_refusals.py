"""Refusals the log outlives: a read-only file system and no file descriptors left
refuse an append (nothing acknowledged, nothing left behind) without failing the log,
so appends succeed again once the cause is gone. A failed fsync still fails it."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap

import pytest

from faults import fileio
from faults.latch import Cause, cause_of
from wal import Wal, WalError
from wal.errors import WriteRefusedError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _ReadOnly(fileio.FileLayer):
    """Writes and creations fail with EROFS while ``ro`` is set (a remount read-only)."""

    def __init__(self) -> None:
        self.ro = False

    def _check(self, path=None) -> None:
        if self.ro:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)

    def open(self, path, flags, mode=0o644):
        if flags & os.O_CREAT:
            self._check(path)
        return super().open(path, flags, mode)

    def write(self, fd, data):
        self._check()
        return super().write(fd, data)

    def ftruncate(self, fd, size):
        self._check()
        return super().ftruncate(fd, size)


@pytest.mark.parametrize("sync", ["group", "always", "none"])
@pytest.mark.parametrize("batch", [1, 5])
def test_read_only_refuses_without_failing(tmp_path, sync: str, batch: int) -> None:
    layer = _ReadOnly()
    with fileio.use(layer):
        w = Wal.open(tmp_path / "log", segment_size=4096, sync=sync)
        acked = []

        def append(i: int) -> None:
            recs = [b"%d-%d" % (i, k) * 40 for k in range(batch)]
            if batch == 1:
                w.append(recs[0])
            else:
                w.append_many(recs)
            acked.extend(recs)

        for i in range(30):
            append(i)
        layer.ro = True
        for i in range(30, 60):                # in a segment, and at its cut
            with pytest.raises(WriteRefusedError, match="filesystem read-only") as ei:
                append(i)
            assert cause_of(ei.value) is Cause.READ_ONLY
        assert w.failure is None and w.last_lsn == len(acked)
        layer.ro = False
        for i in range(60, 90):
            append(i)
        assert [r.payload for r in w.read_from()] == acked
        w.close()
    with Wal.open(tmp_path / "log", segment_size=4096) as w:
        assert [r.payload for r in w.read_from()] == acked


def test_failed_fsync_still_fails_the_log(tmp_path) -> None:
    class FailingSync(fileio.FileLayer):
        def fdatasync(self, fd):
            raise OSError(errno.EIO, os.strerror(errno.EIO))

    w = Wal.open(tmp_path / "log", sync="always")
    w.append(b"before")
    w._io = FailingSync()
    with pytest.raises(WalError, match="fsync"):
        w.append(b"lost?")
    with pytest.raises(WalError, match="failed earlier"):
        w.append(b"after")
    assert w.failure is not None
    w.close()


CHILD = textwrap.dedent("""
    import json, os, resource, sys
    sys.path.insert(0, sys.argv[2])
    from wal import Wal
    from wal.errors import WriteRefusedError
    from faults.latch import cause_of
    resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))
    w = Wal.open(sys.argv[1], segment_size=4096, sync="group")
    acked, refused = [], []
    def append(i):
        try:
            w.append(b"%06d" % i * 50)
        except WriteRefusedError as e:
            refused.append(str(cause_of(e)))
            return False
        acked.append(i)
        return True
    for i in range(20):
        append(i)
    hog = []
    while True:
        try:
            hog.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            break
    for i in range(20, 60):                 # every ~13 records a segment cut opens files
        append(i)
    for fd in hog:
        os.close(fd)
    for i in range(60, 100):
        append(i)
    print(json.dumps({"acked": acked, "refused": refused, "failure": repr(w.failure)}))
    w.close()
""")


def test_out_of_descriptors_refuses_a_cut_without_failing(tmp_path) -> None:
    d = str(tmp_path / "log")
    r = subprocess.run([sys.executable, "-c", CHILD, d, ROOT], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["refused"] and set(out["refused"]) == {"Cause.OUT_OF_FDS"}
    assert out["failure"] == "None" and out["acked"][-1] == 99
    with Wal.open(d, segment_size=4096) as w:
        assert [int(r.payload[:6]) for r in w.read_from()] == out["acked"]


def test_refusal_warning_names_the_log(tmp_path, caplog, monkeypatch) -> None:
    from faults import latch
    monkeypatch.setattr(latch, "WARNINGS", latch._Warnings())
    layer = _ReadOnly()
    with fileio.use(layer):
        w = Wal.open(tmp_path / "log")
        layer.ro = True
        with pytest.raises(WriteRefusedError) as ei:
            w.append(b"x")
        assert latch.report_refusal(ei.value)
        layer.ro = False
        w.close()
    (line,) = [r.getMessage() for r in caplog.records if r.name == "ferry.storage"]
    assert f"filesystem read-only at {tmp_path / 'log'}" in line
