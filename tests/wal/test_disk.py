"""Disk full on a real small tmpfs, the one-writer lock, and a simulated power cut."""
from __future__ import annotations

import os

import pytest

import faults
from faults import fileio
from faults.powerloss import PowerLossLayer
from wal import OutOfDiskError, Wal, WalError, WalLockedError


@pytest.mark.parametrize("batch", [1, 7])
def test_disk_full_acknowledges_nothing_it_did_not_write(small_fs, batch: int) -> None:
    d = small_fs / "log"
    w = Wal.open(d, segment_size=256 << 10, sync="group")
    acked: list[bytes] = []
    i = 0
    with pytest.raises(OutOfDiskError) as ei:
        while True:
            recs = [f"{i + k}".encode() * 500 for k in range(batch)]
            if batch == 1:
                w.append(recs[0])
            else:
                w.append_many(recs)
            acked.extend(recs)
            i += batch
    err = ei.value
    assert isinstance(err, faults.OutOfDiskError) and isinstance(err, WalError)
    assert err.path.startswith(str(d)) and err.needed and err.needed > 0
    assert "out of disk space" in str(err)
    assert len(acked) > 100
    # The log stays usable: the failed append was cut off again.
    assert w.last_lsn == len(acked)
    assert [r.payload for r in w.read_from()] == acked
    w.close()
    w = Wal.open(d, segment_size=256 << 10)
    assert [r.payload for r in w.read_from()] == acked      # exactly the acknowledged ones
    # Freeing space (dropping old segments) lets appends continue.
    w.truncate_before(w.last_lsn)
    w.append(b"after the disk had room again")
    assert w.last_lsn == len(acked) + 1
    w.close()


def test_second_writer_same_process_is_refused(tmp_path) -> None:
    w = Wal.open(tmp_path)
    with pytest.raises(WalLockedError, match="only one writer"):
        Wal.open(tmp_path)
    w.append(b"x")
    assert [r.lsn for r in Wal.reader(tmp_path).read_from()] == [1]
    w.close()
    Wal.open(tmp_path).close()


@pytest.mark.parametrize("keep", [0.0, 0.5])
def test_power_cut_keeps_every_acknowledged_record(tmp_path, keep: float) -> None:
    d = tmp_path / "log"
    d.mkdir()
    layer = PowerLossLayer(keep_unsynced=keep, seed=3)
    with fileio.use(layer):
        w = Wal.open(d, segment_size=4096, sync="group")
        acked = []
        for i in range(300):
            p = os.urandom(i % 150)
            w.append(p, wait=(i % 3 == 0))
            if i % 3 == 0:
                acked = [r.payload for r in w.read_from()]
        for s in w._segs:                  # die: descriptors go, nothing is fsynced
            if s.fd >= 0:
                layer.close(s.fd)
        w._dirlock.release()
        w._committer.stop(failed=True)   # the sync thread dies with the process too
        w._committer.join_thread()
        layer.cut()
    w = Wal.open(d, segment_size=4096)
    got = [r.payload for r in w.read_from()]
    assert got[:len(acked)] == acked
    w.close()
