"""Recovery enters the node WAL where the last complete checkpoint cut it (``wal.start``,
checkpoint/walstart.py) instead of reading every kept segment from its start; a hint
that is missing, damaged, foreign or ahead of the last marker changes nothing but
the time recovery takes."""
from __future__ import annotations

import os
import shutil

import pytest

from checkpoint import PartitionStore, recovery, walstart
from wal import Position, PositionMismatch, Wal


# -- the reader: entering a segment at a position ----------------------------------------
def _records(w: Wal, lsn: int, at: Position | None = None) -> list[tuple[int, int, bytes]]:
    return [tuple(r) for b in w.read_from(lsn, at=at).batches() for r in b]  # type: ignore[misc]


def test_read_from_a_position_gives_the_records_after_it(tmp_path) -> None:
    w = Wal.open(str(tmp_path / "wal"), sync="none", segment_size=4096)   # several segments
    try:
        for i in range(40):
            w.append(b"a%03d" % i * 20, 1)
        pos = w.position()
        assert pos.lsn == w.last_lsn + 1
        w.append_many([b"b%03d" % i for i in range(5)], 2)                   # a batch frame
        for i in range(60):
            w.append(b"c%03d" % i * 30, 3)
        assert len([n for n in os.listdir(tmp_path / "wal") if n.endswith(".wal")]) > 3
        whole = _records(w, pos.lsn)
        assert _records(w, pos.lsn, at=pos) == whole
        assert whole[0][0] == pos.lsn and whole[-1][0] == w.last_lsn
        assert _records(w, pos.lsn + 7, at=pos) == whole[7:]
        end = w.position()                    # the end of the log: nothing after it yet
        assert _records(w, end.lsn, at=end) == []
        w.append(b"last", 4)
        assert _records(w, end.lsn, at=end) == [(end.lsn, 4, b"last")]
    finally:
        w.close()


def test_a_position_that_does_not_describe_the_log_is_refused(tmp_path) -> None:
    w = Wal.open(str(tmp_path / "wal"), sync="none", segment_size=1 << 20)
    try:
        for i in range(30):
            w.append(b"x%03d" % i * 10, 1)
        pos = w.position()
        for i in range(30):
            w.append(b"y%03d" % i * 10, 1)
        wrong = [pos._replace(prev_crc=pos.prev_crc ^ 1),          # another chain
                 pos._replace(offset=pos.offset + 3),              # inside a frame
                 pos._replace(lsn=pos.lsn + 1),                    # another record's
                 pos._replace(seq=pos.seq + 5),                    # no such segment
                 pos._replace(first_lsn=pos.first_lsn + 1),        # another segment
                 pos._replace(offset=1 << 40)]                     # past the end
        for bad in wrong:
            with pytest.raises(PositionMismatch):
                _records(w, bad.lsn, at=bad)
        with pytest.raises(ValueError):
            _records(w, pos.lsn - 1, at=pos)                       # before the position
    finally:
        w.close()


def test_a_position_at_a_segment_end_of_another_chain_is_refused(tmp_path) -> None:
    w = Wal.open(str(tmp_path / "wal"), sync="none", segment_size=4096)
    try:
        positions = []
        for i in range(60):
            positions.append(w.position())
            w.append(b"z%03d" % i * 25, 1)
        # a position taken when its segment was full: the next frame is in the next one
        ends = [p for p, q in zip(positions, positions[1:]) if q.seq > p.seq]
        assert ends
        end = ends[0]
        assert _records(w, end.lsn, at=end)[0][0] == end.lsn
        with pytest.raises(PositionMismatch):
            _records(w, end.lsn, at=end._replace(prev_crc=end.prev_crc ^ 1))
    finally:
        w.close()


def test_the_hint_file_round_trips_and_refuses_damage(tmp_path) -> None:
    pos = Position(3, 1000, 123456, 0xDEADBEEF, 1777)
    walstart.write(str(tmp_path), pos)
    assert walstart.read(str(tmp_path)) == pos
    data = walstart.encode(pos)
    assert walstart.decode(data) == pos
    for bad in (b"", data[:-1], data + b"\0", data[:5] + bytes([data[5] ^ 1]) + data[6:],
                b"XXXX" + data[4:]):
        assert walstart.decode(bad) is None
    assert walstart.read(str(tmp_path / "nowhere")) is None


# -- the store: recovery with and without the hint ----------------------------------------
def _crashed_store(tmp_path) -> str:
    """A store's directory as a SIGKILL leaves it: checkpoints, then updates only in the
    WAL (copied while the store is open, with every put acknowledged, so durable)."""
    src = str(tmp_path / "live")
    s = PartitionStore.open(src, checkpoint_interval=None, wal_sync="group")
    try:
        for round_ in range(4):
            for i in range(300):
                s.put(i % 5, b"k%04d" % i, b"v%d-%d" % (round_, i) * 20)
            s.remove(round_, b"k%04d" % (round_ + 5))
            s.checkpoint()
        for i in range(200):                  # after the last checkpoint: replayed
            s.put(i % 5, b"k%04d" % i, b"w%d" % i * 25)
        s.wal.sync()
        assert walstart.read(src) is not None   # written once a marker was durable
        crashed = str(tmp_path / "crashed")
        shutil.copytree(src, crashed)
    finally:
        s.close(checkpoint=False)
    return crashed


def _recovered(path: str) -> dict[int, tuple[int, list[tuple[bytes, bytes]]]]:
    s = PartitionStore.open(path, checkpoint_interval=None, wal_sync="none")
    try:
        return {p: (s.counter(p), sorted(s.scan(p))) for p in s.partitions()}
    finally:
        s.close(checkpoint=False)


def _copy(src: str, dst: str, hint: bytes | None) -> str:
    shutil.copytree(src, dst)
    path = os.path.join(dst, walstart.NAME)
    os.unlink(path)
    if hint is not None:
        with open(path, "wb") as f:
            f.write(hint)
    return dst


def _first_passes(monkeypatch) -> list[Position | None]:
    """Where each first pass of recovery entered the log (None: the oldest segment)."""
    used: list[Position | None] = []
    first_pass = recovery._first_pass

    def spy(wal, at=None):
        used.append(at)
        return first_pass(wal, at)
    monkeypatch.setattr(recovery, "_first_pass", spy)
    return used


def test_recovery_from_the_hint_equals_reading_the_whole_log(tmp_path, monkeypatch) -> None:
    crashed = _crashed_store(tmp_path)
    hint = walstart.read(crashed)
    assert hint is not None and hint.lsn > 900      # well into the kept segment
    full = _recovered(_copy(crashed, str(tmp_path / "full"), None))
    assert sum(len(v[1]) for v in full.values()) == 300 - 4 + 4   # removed, put again
    used = _first_passes(monkeypatch)
    assert _recovered(_copy(crashed, str(tmp_path / "hinted"), walstart.encode(hint))) == full
    assert used == [hint]                # entered at the hint, no second full pass


def _positions(crashed: str) -> tuple[Position, Position]:
    """(the hint, the WAL's end): a valid position after the last marker."""
    hint = walstart.read(crashed)
    assert hint is not None
    w = Wal.open(os.path.join(crashed, "wal"), sync="none")
    try:
        end = w.position()
    finally:
        w.close()
    return hint, end


@pytest.mark.parametrize("kind", ["garbage", "torn", "foreign-chain", "mid-frame",
                                  "gone-segment", "past-the-marker"])
def test_a_bad_hint_costs_only_a_full_read(tmp_path, monkeypatch, kind) -> None:
    crashed = _crashed_store(tmp_path)
    full = _recovered(_copy(crashed, str(tmp_path / "full"), None))
    hint, end = _positions(crashed)
    data = {"garbage": os.urandom(44),
            "torn": walstart.encode(hint)[:20],
            "foreign-chain": walstart.encode(hint._replace(prev_crc=hint.prev_crc ^ 0x5A5A)),
            "mid-frame": walstart.encode(hint._replace(offset=hint.offset + 9)),
            "gone-segment": walstart.encode(hint._replace(seq=hint.seq + 7)),
            # intact and describing this log, but after its last marker (no marker of
            # the hinted checkpoint behind it): read from the start instead
            "past-the-marker": walstart.encode(end)}[kind]
    used = _first_passes(monkeypatch)
    assert _recovered(_copy(crashed, str(tmp_path / "bad"), data)) == full
    assert used[-1] is None              # the last pass read the kept log from its start


# -- the writer's own check of the last segment at open ----------------------------------
def _log_with_position(path: str) -> Position:
    w = Wal.open(path, sync="none")
    try:
        for i in range(300):
            w.append(b"a%04d" % i * 30, 1)
        pos = w.position()
        for i in range(50):
            w.append(b"b%04d" % i * 30, 2)
    finally:
        w.close()
    return pos


def test_open_from_a_position_gives_the_same_tail(tmp_path) -> None:
    path = str(tmp_path / "wal")
    pos = _log_with_position(path)
    seg = [os.path.join(path, n) for n in os.listdir(path) if n.endswith(".wal")][0]
    with open(seg, "ab") as f:
        f.write(b"\x07" * 11)                     # a torn append after the last frame
    size = os.path.getsize(seg)
    bad = [None, pos._replace(prev_crc=pos.prev_crc ^ 1), pos._replace(offset=pos.offset + 5),
           pos._replace(seq=pos.seq + 1), pos._replace(offset=size + 100)]
    ends = []
    for start in [pos] + bad:
        shutil.copytree(path, str(tmp_path / "c"))
        w = Wal.open(str(tmp_path / "c"), sync="none", start=start)
        try:
            ends.append((w.last_lsn, w.position()))
            w.append(b"next", 3)                  # the chain continues for a reader
            assert [r[1] for r in _records(w, 1)][-52:] == [1] + [2] * 50 + [3]
        finally:
            w.close()
        shutil.rmtree(str(tmp_path / "c"))
    assert len(set(ends)) == 1 and ends[0][0] == 350   # the torn bytes cut every time


def test_damage_before_the_position_is_not_read_at_open(tmp_path) -> None:
    """The part of the last segment before a good position is not checked at open (as
    older segments are not): damage there surfaces when a read reaches it."""
    from wal import CorruptRecordError
    path = str(tmp_path / "wal")
    pos = _log_with_position(path)
    seg = [os.path.join(path, n) for n in os.listdir(path) if n.endswith(".wal")][0]
    with open(seg, "r+b") as f:
        f.seek(pos.offset // 2)
        f.write(b"\xff" * 8)
    w = Wal.open(path, sync="none", start=pos)
    try:
        assert w.last_lsn == 350
        assert [r[0] for r in _records(w, pos.lsn, at=pos)] == list(range(301, 351))
        with pytest.raises(CorruptRecordError):
            _records(w, 1)
    finally:
        w.close()
    with pytest.raises(CorruptRecordError):
        Wal.open(path, sync="none")                # without it: the whole segment checked


def test_a_hint_that_cannot_be_written_costs_nothing_else(tmp_path, monkeypatch) -> None:
    """A full or read-only disk refuses the hint: the checkpoint completes, the store
    goes on, and no temp file is left (the next recovery reads from the start)."""
    from faults import OutOfDiskError, fileio

    class Full(fileio.FileLayer):
        def write(self, fd, data):
            raise OSError(28, "No space left on device")
    s = PartitionStore.open(str(tmp_path / "s"), checkpoint_interval=None, wal_sync="group")
    try:
        s.put(1, b"a", b"1")
        s.checkpoint()
        s.put(1, b"b", b"2")
        monkeypatch.setattr(fileio, "_layer", Full())
        with pytest.raises(OutOfDiskError):
            walstart.write(str(tmp_path / "s"), Position(0, 1, 64, 0, 1))
        assert s.checkpoint() is not None          # its run tried to write the hint
        assert not os.path.exists(str(tmp_path / "s" / walstart.NAME))
        assert not os.path.exists(str(tmp_path / "s" / (walstart.NAME + ".tmp")))
        monkeypatch.undo()
        s.put(1, b"c", b"3")
        s.checkpoint()                             # the hint is written again
        assert walstart.read(str(tmp_path / "s")) is not None
        assert s.get(1, b"b") == b"2" and s.get(1, b"c") == b"3"
    finally:
        s.close()
