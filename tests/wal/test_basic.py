from __future__ import annotations

import os
import threading

import pytest

from wal import Record, Wal, WalClosedError, WalError
from wal.format import parse_segment_name, segment_name


def payload(i: int, size: int = 40) -> bytes:
    return (f"record-{i}-".encode() * (size // 8 + 1))[:size]


def test_append_read_reopen(tmp_path) -> None:
    w = Wal.open(tmp_path / "log", sync="none")
    assert (w.first_lsn, w.last_lsn) == (1, 0)
    lsns = [w.append(payload(i), type=i % 5) for i in range(100)]
    assert lsns == list(range(1, 101))
    assert w.append_many([payload(i) for i in range(100, 150)], type=7) == 150
    w.close()
    w = Wal.open(tmp_path / "log")
    recs = list(w.read_from(1))
    assert [r.lsn for r in recs] == list(range(1, 151))
    assert recs[3] == Record(4, 3, payload(3)) and recs[120].type == 7
    assert [r.payload for r in w.read_from(140)] == [payload(i) for i in range(139, 150)]
    assert w.append(b"") == 151 and list(w.read_from(151)) == [(151, 0, b"")]
    w.close()


def test_segment_names_parse_back_exactly() -> None:
    for seq, lsn in [(0, 1), (7, 123456), (2**64 - 1, 2**63)]:
        assert parse_segment_name(segment_name(seq, lsn)) == (seq, lsn)
    for bad in ["0-1.wal", "0000000000000000-0000000000000001.wal.tmp", "LOCK",
                "000000000000000A-0000000000000001.wal", " 0000000000000000-0000000000000001.wal"]:
        assert parse_segment_name(bad) is None


def test_segments_roll_and_oversized_record_gets_its_own(tmp_path) -> None:
    w = Wal.open(tmp_path, segment_size=4096, sync="none")
    for i in range(200):      # (an append_many batch would stay whole: test_batch.py)
        w.append(payload(i, 100))
    big = os.urandom(3 * 4096)
    big_lsn = w.append(big)
    after = w.append(b"after")
    names = sorted(n for n in os.listdir(tmp_path) if n.endswith(".wal"))
    assert len(names) > 5
    parsed = [parse_segment_name(n) for n in names]
    assert [p[0] for p in parsed] == list(range(len(names)))
    # The big record sits alone in an oversized segment; the next record starts a new one.
    big_seg = [n for n, p in zip(names, parsed) if p[1] == big_lsn]
    assert len(big_seg) == 1 and os.path.getsize(tmp_path / big_seg[0]) > 4096
    assert parsed[-1][1] == after
    w.close()
    w = Wal.open(tmp_path, segment_size=4096)
    recs = list(w.read_from())
    assert [r.lsn for r in recs] == list(range(1, after + 1))
    assert recs[big_lsn - 1].payload == big
    w.close()


def test_sixteen_mib_payload(tmp_path) -> None:
    w = Wal.open(tmp_path, sync="none", segment_size=1 << 20)
    big = os.urandom(16 << 20)
    w.append(b"a")
    lsn = w.append(big)
    w.append_many([b"b", big, b"c"])
    w.close()
    recs = list(Wal.reader(tmp_path).read_from(lsn))
    assert [len(r.payload) for r in recs] == [16 << 20, 1, 16 << 20, 1]
    assert recs[0].payload == big and recs[2].payload == big


def test_first_lsn_of_a_new_log_and_lsn_continuity(tmp_path) -> None:
    w = Wal.open(tmp_path, first_lsn=1000, segment_size=1024, sync="none")
    assert (w.first_lsn, w.last_lsn, w.durable_lsn) == (1000, 999, 999)
    assert list(w.read_from()) == []
    assert w.append(b"x") == 1000
    w.append_many([payload(i) for i in range(100)])
    w.close()
    w = Wal.open(tmp_path, first_lsn=5)          # ignored: the log exists
    assert (w.first_lsn, w.last_lsn) == (1000, 1100)
    w.close()


def test_truncate_before_drops_whole_segments_only(tmp_path) -> None:
    w = Wal.open(tmp_path, segment_size=2048, sync="none")
    for i in range(300):
        w.append(payload(i, 100))
    nseg = len([n for n in os.listdir(tmp_path) if n.endswith(".wal")])
    removed = w.truncate_before(150)
    assert removed > 0
    assert w.first_lsn <= 150 < w.first_lsn + 20
    assert [r.lsn for r in w.read_from(150)][0] == 150
    with pytest.raises(WalError, match="truncated"):
        list(w.read_from(1))
    assert w.truncate_before(10**9) == nseg - removed - 1    # never the current segment
    w.append(b"more")
    w.close()
    w = Wal.open(tmp_path, segment_size=2048)
    assert w.last_lsn == 301 and [r.lsn for r in w.read_from()][-1] == 301
    w.destroy()
    assert not tmp_path.exists()


def test_wait_false_then_wait_durable(tmp_path) -> None:
    w = Wal.open(tmp_path, sync="group")
    lsn = w.append(b"a", wait=False)
    assert w.last_lsn == lsn
    w.wait_durable(lsn)
    assert w.durable_lsn >= lsn
    with pytest.raises(ValueError):
        w.wait_durable(lsn + 5)
    w.close()


@pytest.mark.parametrize("mode", ["always", "group", "none"])
def test_modes_durable_lsn(tmp_path, mode: str) -> None:
    w = Wal.open(tmp_path, sync=mode)
    lsn = w.append(b"x")
    if mode != "none":
        assert w.durable_lsn == lsn
    w.append_many([b"y"] * 10)
    w.sync()
    assert w.durable_lsn == w.last_lsn == 11
    w.close()


def test_group_commit_many_threads(tmp_path) -> None:
    w = Wal.open(tmp_path, sync="group", segment_size=8192)
    acked: list[int] = []
    lock = threading.Lock()

    def run(t: int) -> None:
        for i in range(50):
            lsn = w.append(f"{t}:{i}".encode())
            assert w.durable_lsn >= lsn
            with lock:
                acked.append(lsn)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(acked) == list(range(1, 401))
    got = {r.payload.decode() for r in w.read_from()}
    assert got == {f"{t}:{i}" for t in range(8) for i in range(50)}
    w.close()


def test_closed_log_refuses(tmp_path) -> None:
    w = Wal.open(tmp_path)
    w.close()
    with pytest.raises(WalClosedError):
        w.append(b"x")
    with pytest.raises(ValueError):
        Wal.open(tmp_path, sync="sometimes")
    w = Wal.open(tmp_path)
    with pytest.raises(ValueError):
        w.append(b"x", type=70000)
    w.close()


def test_same_process_follow_sees_appends_across_segments(tmp_path) -> None:
    w = Wal.open(tmp_path, sync="none", segment_size=4096)
    got: list[int] = []

    def consume() -> None:
        for rec in w.follow(1, timeout=5):
            got.append(rec.lsn)
            if rec.lsn == 500:
                return

    t = threading.Thread(target=consume)
    t.start()
    for i in range(500):
        w.append(payload(i, 64))
    t.join(10)
    assert got == list(range(1, 501))
    w.close()


def test_follow_ends_when_closed(tmp_path) -> None:
    w = Wal.open(tmp_path, sync="none")
    w.append(b"a")
    f = w.follow(1)
    assert next(f).lsn == 1
    threading.Timer(0.2, w.close).start()
    assert list(f) == []


@pytest.mark.parametrize("mode", ["group", "always"])
def test_empty_append_many_acknowledges_earlier_unwaited_appends(tmp_path, mode) -> None:
    # Found by the stateful model: append(wait=False) then append_many([]) returned
    # LSN 1, which promises "durable up to 1", while nothing was fsynced yet.
    w = Wal.open(str(tmp_path / "w"), sync=mode)
    assert w.append(b"", wait=False) == 1
    assert w.append_many([]) == 1
    assert w.durable_lsn >= 1
    w.close()


def test_record_types_may_be_int_enums(tmp_path) -> None:
    # Found by the checkpoint tests: append_many took an IntEnum type for a list of types.
    import enum

    class Kind(enum.IntEnum):
        A = 3
        B = 7

    for mode in ("none", "group", "always"):
        w = Wal.open(tmp_path / mode, sync=mode)
        w.append(b"a", Kind.A)
        w.append_many([b"b", b"c"], Kind.B)
        assert [(r.lsn, r.type) for r in w.read_from()] == [(1, 3), (2, 7), (3, 7)]
        w.close()
