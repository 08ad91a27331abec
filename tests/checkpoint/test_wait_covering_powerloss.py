"""``PartitionStore.wait_checkpoint_covering`` returns only once the covering
checkpoint is durable, marker included: updates applied with ``logged=False`` (the
temp-WAL replay of a move) are in no WAL record, so until the checkpoint's marker is
durable a power cut rolls the files back to the previous checkpoint and loses them.
Checked on the power-loss file layer (faults.powerloss): nothing is synced after the
wait returns, then the power goes."""
from __future__ import annotations

from checkpoint import PartitionStore
from faults import fileio
from faults.powerloss import PowerLossLayer


class _Frozen(PowerLossLayer):
    """Once ``frozen``, nothing more becomes durable (the close after the wait)."""

    frozen = False

    def fsync(self, fd: int) -> None:
        if not self.frozen:
            super().fsync(fd)

    fdatasync = fsync

    def fsync_dir(self, path: str) -> None:
        if not self.frozen:
            super().fsync_dir(path)


def test_updates_applied_unlogged_survive_a_power_cut_after_the_wait(tmp_path) -> None:
    layer = _Frozen()
    path = str(tmp_path / "s")
    with fileio.use(layer):
        s = PartitionStore.open(path, wal_sync="group", checkpoint_interval=None)
        s.create_partition(0)
        for i in range(50):
            s.put(0, b"k%03d" % i, b"v0-%d" % i)
        s.checkpoint()
        s.apply_many(0, [(b"k%03d" % i, b"v1-%d" % i, 51 + i) for i in range(50)], logged=False)
        assert s.wait_checkpoint_covering(0, 100, timeout=30)
        layer.frozen = True
        s.close(checkpoint=False)
    layer.cut()
    s = PartitionStore.open(path, wal_sync="group", checkpoint_interval=None)
    try:
        assert s.counter(0) == 100
        assert dict(s.scan(0)) == {b"k%03d" % i: b"v1-%d" % i for i in range(50)}
    finally:
        s.close()
