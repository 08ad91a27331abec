from __future__ import annotations

import os

import pytest

from checkpoint import PartitionStore


@pytest.fixture
def open_store(tmp_path):
    """Open stores in tmp_path/store; all are closed at the end of the test."""
    opened: list[PartitionStore] = []

    def _open(**kw) -> PartitionStore:
        kw.setdefault("checkpoint_interval", None)
        kw.setdefault("wal_sync", "none")
        s = PartitionStore.open(str(tmp_path / "store"), **kw)
        opened.append(s)
        return s

    yield _open
    for s in opened:
        if not s._closed:
            s.close(checkpoint=False)


def part_file(tmp_path, p: int) -> str:
    return os.path.join(str(tmp_path / "store"), f"part-{p}.bin")
