"""Recovery's first pass over the kept log: the last marker, the INSTALL/DROP barriers
and the partitions whose last INSTALL/DROP is a DROP not followed by an update (their
files are deleted), read from the reader's batches; and the same answers from a
read-only WalReader (``pending_undo``)."""
from __future__ import annotations

import os

from checkpoint import recovery
from checkpoint.records import (RecordType, encode_drop, encode_images, encode_install,
                                encode_marker, encode_update)
from wal import Wal


def _log(path: str) -> dict[str, int]:
    w = Wal.open(path, sync="none", segment_size=4096)      # several segments
    lsn: dict[str, int] = {}

    def put(name: str, payload: bytes, kind: RecordType) -> None:
        lsn[name] = w.append(payload, kind)
    put("u1", encode_update(1, 1, b"k", b"v"), RecordType.UPDATE)
    put("drop2", encode_drop(2), RecordType.DROP)
    put("u2", encode_update(2, 1, b"k", b"v"), RecordType.UPDATE)       # re-created
    put("drop3", encode_drop(3), RecordType.DROP)
    put("install4", encode_install(4, 9), RecordType.INSTALL)
    put("drop4", encode_drop(4), RecordType.DROP)
    for i in range(200):                                                 # bulk
        put(f"bulk{i}", encode_update(1, 2 + i, b"k%d" % i, b"x" * 40), RecordType.UPDATE)
    put("marker1", encode_marker(lsn["bulk10"], 1, lsn["u1"]), RecordType.MARKER)
    put("drop5", encode_drop(5), RecordType.DROP)
    put("install5", encode_install(5, 3), RecordType.INSTALL)            # back again
    put("images", encode_images(1, 4096, [(0, b"\0" * 4096)], []), RecordType.IMAGES)
    put("marker2", encode_marker(lsn["bulk150"], 2, lsn["marker1"]), RecordType.MARKER)
    put("drop6", encode_drop(6), RecordType.DROP)
    put("u7", encode_update(7, 1, b"k", b"v"), RecordType.UPDATE)       # not p6
    w.close()
    return lsn


def test_first_pass_finds_the_last_marker_the_barriers_and_the_dropped(tmp_path) -> None:
    path = str(tmp_path / "wal")
    lsn = _log(path)
    assert len([n for n in os.listdir(path) if n.endswith(".wal")]) > 2
    w = Wal.open(path, sync="none", segment_size=4096)
    try:
        mark, images_from, barrier, dropped = recovery._first_pass(w)
        assert mark == lsn["bulk150"] and images_from == lsn["marker1"]
        assert barrier == {2: lsn["drop2"], 3: lsn["drop3"], 4: lsn["drop4"],
                           5: lsn["install5"], 6: lsn["drop6"]}
        assert dropped == {3, 4, 6}
        assert [at for at, _p in recovery._images_after(w, images_from)] == [lsn["images"]]
    finally:
        w.close()
    assert [at for at, _p in recovery.pending_undo(path)] == [lsn["images"]]
