"""A table of damage to a log on disk, each with its expected outcome, through one
helper that damages, opens (which repairs only torn tails), reads, appends, re-reads."""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from wal import CorruptRecordError, Wal, repair, verify
from wal.format import FRAME_HEADER_SIZE, HEADER_SIZE

SEG = 4096
SIZE = 100
FRAME = FRAME_HEADER_SIZE + SIZE
PER_SEG = (SEG - HEADER_SIZE) // FRAME          # 33 records per segment
N = 120                                          # 4 segments: 33, 33, 33, 21


def payload(i: int) -> bytes:
    return (f"<{i}>".encode() * SIZE)[:SIZE]


def build(d: Path) -> list[Path]:
    w = Wal.open(d, segment_size=SEG, sync="none")
    for i in range(1, N + 1):
        w.append(payload(i))
    w.close()
    return sorted(p for p in d.iterdir() if p.suffix == ".wal")


def frame_at(k: int) -> int:
    return HEADER_SIZE + k * FRAME


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def zero_tail(path: Path, nbytes: int) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(size - nbytes)
        f.write(bytes(nbytes))


def cut(path: Path, size: int) -> None:
    os.truncate(path, size)


@dataclass
class Case:
    name: str
    damage: Callable[[Path, list[Path]], None]
    outcome: str                 # "torn": open cuts it; "corrupt_open"; "corrupt_read"
    kept: int = N                # records left after a torn-tail cut
    bad_seg: int = -1            # which segment the error names (index into the list)
    bad_offset: int | None = None


LAST_FULL = PER_SEG * 3          # LSN of the last record before the last segment

CASES = [
    Case("clean", lambda d, s: None, "torn", kept=N),
    Case("short_frame_at_end", lambda d, s: cut(s[-1], s[-1].stat().st_size - 7), "torn", N - 1),
    Case("half_header_at_end", lambda d, s: cut(s[-1], frame_at(20) + 9), "torn", LAST_FULL + 20),
    Case("zeroed_tail", lambda d, s: zero_tail(s[-1], 300), "torn", N - 3),
    Case("zeros_appended", lambda d, s: open(s[-1], "ab").write(bytes(5000)), "torn", N),
    Case("bad_crc_at_very_end", lambda d, s: flip(s[-1], s[-1].stat().st_size - 3), "torn", N - 1),
    Case("stale_tmp_segment", lambda d, s: (d / (s[-1].name + ".tmp")).write_bytes(b"junk"),
         "torn", N),
    Case("foreign_file_ignored", lambda d, s: (d / "notes.txt").write_text("hi"), "torn", N),
    Case("flipped_byte_mid_last_segment", lambda d, s: flip(s[-1], frame_at(5) + 50),
         "corrupt_open", bad_seg=-1, bad_offset=frame_at(5)),
    Case("flipped_length_mid_last_segment", lambda d, s: flip(s[-1], frame_at(5) + 2),
         "corrupt_open", bad_seg=-1, bad_offset=frame_at(5)),
    Case("truncated_header", lambda d, s: cut(s[-1], 10), "corrupt_open", bad_seg=-1,
         bad_offset=0),
    Case("flipped_header_byte", lambda d, s: flip(s[1], 12), "corrupt_open", bad_seg=1,
         bad_offset=0),
    Case("garbage_segment_name", lambda d, s: (d / "garbage.wal").write_bytes(b"x" * 64),
         "corrupt_open", bad_offset=0),
    Case("renamed_segment", lambda d, s: s[1].rename(d / ("x" + s[1].name)),
         "corrupt_open", bad_offset=0),
    Case("missing_middle_segment", lambda d, s: s[1].unlink(), "corrupt_open", bad_seg=2,
         bad_offset=0),
    Case("flipped_byte_mid_segment", lambda d, s: flip(s[1], frame_at(10) + 40),
         "corrupt_read", bad_seg=1, bad_offset=frame_at(10)),
    Case("zeroed_tail_of_middle_segment", lambda d, s: zero_tail(s[0], 150),
         "corrupt_read", bad_seg=0, bad_offset=frame_at(PER_SEG - 2)),
]


def check(d: Path, case: Case) -> None:
    segs = build(d)
    case.damage(d, segs)
    shutil.copytree(d, d.parent / "orig")      # the damaged state, to compare the backup with
    rep = verify(str(d))
    if case.outcome == "torn":
        assert rep.ok, rep.as_dict()
        w = Wal.open(d, segment_size=SEG)
        assert w.last_lsn == case.kept
        assert [r.payload for r in w.read_from()] == [payload(i) for i in range(1, case.kept + 1)]
        w.append(b"after repair")
        w.close()
        w = Wal.open(d, segment_size=SEG)
        assert [r.lsn for r in w.read_from()] == list(range(1, case.kept + 2))
        w.close()
        assert verify(str(d)).torn is None
        return
    assert not rep.ok
    expected_path = {"garbage_segment_name": str(d / "garbage.wal"),
                     "renamed_segment": str(d / ("x" + segs[1].name))}.get(
        case.name, str(segs[case.bad_seg]))
    if case.outcome == "corrupt_open":
        with pytest.raises(CorruptRecordError) as ei:
            Wal.open(d, segment_size=SEG)
    else:
        w = Wal.open(d, segment_size=SEG)      # only the last segment is scanned at open
        with pytest.raises(CorruptRecordError) as ei:
            list(w.read_from())
        w.close()
        with pytest.raises(CorruptRecordError):
            list(Wal.reader(d).read_from())
    err = ei.value
    assert err.path == expected_path and expected_path in str(err)
    assert err.offset == case.bad_offset
    assert (rep.corruption[0], rep.corruption[1]) == (expected_path, case.bad_offset)
    # Repair only with a backup; afterwards the log is a clean prefix and takes appends.
    backup = d.parent / (d.name + "-backup")
    repair(str(d), str(backup))
    assert sorted(os.listdir(backup)) == sorted(n for n in os.listdir(d.parent / "orig")
                                                if n != "LOCK")
    w = Wal.open(d, segment_size=SEG)
    recs = list(w.read_from())
    assert [r.payload for r in recs] == [payload(r.lsn) for r in recs]
    assert [r.lsn for r in recs] == list(range(1, len(recs) + 1))
    w.append(b"after repair")
    w.close()
    assert verify(str(d)).ok


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_corruption_table(tmp_path, case: Case) -> None:
    check(tmp_path / "log", case)
