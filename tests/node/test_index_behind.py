"""An index commit refused after its data change was logged (the index directory on a
full file system: a real tmpfs of its own): the write is refused, the partition's
index is noted behind its data, the partition's next change rebuilds it first (refused
too while the disk is full), and once space is freed the index answers what the data
holds again, without a restart."""
from __future__ import annotations

import errno
import json
import os

import pytest

from faults.latch import Cause, cause_of
from node.config import CacheConfig, IndexConfig, NodeConfig
from node.storage import CacheData
from tests.tmpfs import mounted


@pytest.fixture
def index_fs(tmp_path):
    with mounted(tmp_path / "indexes" / "c", 16) as mnt:
        yield mnt


def _doc(i: int) -> bytes:
    return json.dumps({"n": i, "pad": "x" * 200}).encode()


def test_index_behind_its_data_catches_up(tmp_path, index_fs) -> None:
    cache = CacheConfig("c", 2, 0, (IndexConfig("by_n", "n"),))
    d = CacheData(NodeConfig(id="n1", data=str(tmp_path), caches=(cache,), wal_sync="none"), cache)
    try:
        d.create(0)
        d.create(1)
        for i in range(20):
            d.put(0, b"k%03d" % i, _doc(i))
        filler = index_fs / "filler"
        with open(filler, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError as e:
                assert e.errno == errno.ENOSPC
        refused = None
        for i in range(20, 2000):             # until an index commit finds no room
            try:
                d.put(0, b"k%03d" % i, _doc(i))
            except Exception as e:            # noqa: BLE001 - whichever layer refused
                refused = (i, e)
                break
        assert refused is not None and cause_of(refused[1]) is Cause.DISK_FULL
        i = refused[0]
        assert d.get(0, b"k%03d" % i) == _doc(i)            # the data took it ...
        assert d.lookup("by_n", i) == []                     # ... its index did not
        with pytest.raises(Exception) as e:                  # the next change: refused
            d.put(0, b"next", _doc(10_000))
        assert cause_of(e.value) is Cause.DISK_FULL
        os.unlink(filler)
        d.put(0, b"next", _doc(10_000))                      # rebuilds p's index first
        assert d.lookup("by_n", i) == [b"k%03d" % i]
        assert d.lookup("by_n", 10_000) == [b"next"]
        assert len(d.range("by_n", None, None, None)) == i + 2
    finally:
        d.close()
