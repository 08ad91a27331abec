"""A table of damage to a log on disk, each with its expected outcome, through one
helper that damages, opens (which repairs only torn tails), reads, appends, re-reads.

The rule under test (docs/formats.md, "Torn tail vs corruption"): damage may be called
a torn tail only when it is in the last segment AND no valid frame follows it; a frame
that checks out after the damage was written after it, and may have been acknowledged.
The second half of the table is a value of 2000 zero bytes with one byte flipped: it
looks like "a sector the disk never wrote", but the 49 acknowledged records after it
make it corruption, never a torn tail to cut."""
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


@dataclass(frozen=True)
class Log:
    """What a case's log holds before the damage: these payloads, appended in order."""
    payloads: tuple[bytes, ...]
    segment_size: int = SEG

    def offset(self, k: int) -> int:
        """File offset of the frame of record ``k`` (0-based), all in one segment."""
        return HEADER_SIZE + sum(FRAME_HEADER_SIZE + len(p) for p in self.payloads[:k])


PLAIN = Log(tuple(payload(i) for i in range(1, N + 1)))


def build(d: Path, log: Log = PLAIN) -> list[Path]:
    w = Wal.open(d, segment_size=log.segment_size, sync="none")
    for p in log.payloads:
        w.append(p)
    w.close()
    return sorted(p for p in d.iterdir() if p.suffix == ".wal")


def frame_at(k: int) -> int:
    return HEADER_SIZE + k * FRAME


def flip(path: Path, offset: int, mask: int = 0x40) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ mask]))


def zero(path: Path, offset: int, nbytes: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes(nbytes))


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
    log: Log = PLAIN


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
    # A zeroed frame head, or a zeroed sector, with valid frames after it: not a write
    # that never reached the disk (those frames were written later, and fsynced with it).
    Case("zeroed_frame_head_mid_last_segment", lambda d, s: zero(s[-1], frame_at(5), 16),
         "corrupt_open", bad_seg=-1, bad_offset=frame_at(5)),
    Case("zeroed_sector_mid_last_segment", lambda d, s: zero(s[-1], 1024, 512),
         "corrupt_open", bad_seg=-1, bad_offset=frame_at((1024 - HEADER_SIZE) // FRAME)),
]


# -- zero runs ---------------------------------------------------------------------------
# ack-0, a value of 2000 zero bytes, then ack-1 .. ack-<after>, all in one segment.
def zero_log(after: int, zeros: bytes = bytes(2000), segment_size: int = 1 << 20) -> Log:
    return Log((b"ack-0", zeros) + tuple(b"ack-%d" % i for i in range(1, after + 1)),
               segment_size)


Z49, Z1, Z0 = zero_log(49), zero_log(1), zero_log(0)
ZF = Z49.offset(1)                   # the zeros frame
ZP = ZF + FRAME_HEADER_SIZE - 4      # its payload (the head is 16 bytes)
ZC = ZP + 2000                       # its check
assert ZP < 512 and ZC > 2048        # the run holds whole sectors 512..2048


def sector_run(start: int, length: int) -> Log:
    """A log whose second record's payload has zeros exactly at file offsets
    [start, start + length) and ones around them, then 20 records."""
    p = ZF + FRAME_HEADER_SIZE - 4
    value = b"\x01" * (start - p) + bytes(length) + b"\x01" * 100
    return zero_log(20, value)


EDGE = sector_run(1024, 512)         # exactly one aligned sector of zeros
EDGE_SHORT = sector_run(1025, 511)   # one byte short of a sector
EDGE_LAST = Log(EDGE.payloads[:2], EDGE.segment_size)   # the same record as the last one

ZERO_CASES = [
    Case("zero_run_flip_mid", lambda d, s: flip(s[0], ZP + 1000, 0x01), "corrupt_open",
         bad_seg=0, bad_offset=ZF, log=Z49),
    Case("zero_run_flip_first_byte", lambda d, s: flip(s[0], ZP), "corrupt_open",
         bad_seg=0, bad_offset=ZF, log=Z49),
    Case("zero_run_flip_last_byte", lambda d, s: flip(s[0], ZP + 1999), "corrupt_open",
         bad_seg=0, bad_offset=ZF, log=Z49),
    Case("zero_run_flip_sector_start", lambda d, s: flip(s[0], 1024), "corrupt_open",
         bad_seg=0, bad_offset=ZF, log=Z49),
    Case("zero_run_flip_sector_end", lambda d, s: flip(s[0], 1023), "corrupt_open",
         bad_seg=0, bad_offset=ZF, log=Z49),
    Case("zero_run_flip_check", lambda d, s: flip(s[0], ZC + 1), "corrupt_open",
         bad_seg=0, bad_offset=ZF, log=Z49),
    # length 2000 -> 1936: the frame "ends" inside the zero run (bad CRC, whole zero
    # sectors); the real frames follow at the old end.
    Case("zero_run_length_shorter", lambda d, s: flip(s[0], ZF), "corrupt_open",
         bad_seg=0, bad_offset=ZF, log=Z49),
    Case("zero_run_length_longer", lambda d, s: flip(s[0], ZF + 1), "corrupt_open",
         bad_seg=0, bad_offset=ZF, log=Z49),
    Case("zero_run_frame_head_zeroed", lambda d, s: zero(s[0], ZF, 16), "corrupt_open",
         bad_seg=0, bad_offset=ZF, log=Z49),
    # Followed by ONE valid frame: still corrupt, whatever part of the frame was hit.
    Case("zero_run_flip_one_frame_after", lambda d, s: flip(s[0], ZP + 1000), "corrupt_open",
         bad_seg=0, bad_offset=ZF, log=Z1),
    Case("zero_run_flip_check_one_frame_after", lambda d, s: flip(s[0], ZC + 2),
         "corrupt_open", bad_seg=0, bad_offset=ZF, log=Z1),
    Case("zero_run_length_shorter_one_frame_after", lambda d, s: flip(s[0], ZF),
         "corrupt_open", bad_seg=0, bad_offset=ZF, log=Z1),
    Case("zero_run_flip_lsn_one_frame_after", lambda d, s: flip(s[0], ZF + 4, 0x02),
         "corrupt_open", bad_seg=0, bad_offset=ZF, log=Z1),
    # The flip is in the last frame: nothing can lie beyond it, so it is a torn tail
    # (indistinguishable from an append the crash interrupted).
    Case("zero_run_flip_last_frame", lambda d, s: flip(s[0], ZP + 1000), "torn", kept=1,
         log=Z0),
    Case("zero_run_check_last_frame", lambda d, s: flip(s[0], ZC), "torn", kept=1, log=Z0),
    # Zero runs at sector edges: a whole aligned sector inside the frame, a flip
    # outside it (the old rule's "sector the disk never wrote"), frames after.
    Case("sector_edge_run_flip_before", lambda d, s: flip(s[0], 1000), "corrupt_open",
         bad_seg=0, bad_offset=ZF, log=EDGE),
    Case("sector_edge_run_flip_after", lambda d, s: flip(s[0], 1536), "corrupt_open",
         bad_seg=0, bad_offset=ZF, log=EDGE),
    Case("sector_edge_run_flip_inside", lambda d, s: flip(s[0], 1535), "corrupt_open",
         bad_seg=0, bad_offset=ZF, log=EDGE),
    Case("sector_edge_short_run_flip", lambda d, s: flip(s[0], 1000), "corrupt_open",
         bad_seg=0, bad_offset=ZF, log=EDGE_SHORT),
    Case("sector_edge_run_flip_last_frame", lambda d, s: flip(s[0], 1000), "torn", kept=1,
         log=EDGE_LAST),
]


def check(d: Path, case: Case) -> None:
    log = case.log
    seg_size = log.segment_size
    expected = list(log.payloads)
    segs = build(d, log)
    case.damage(d, segs)
    shutil.copytree(d, d.parent / "orig")      # the damaged state, to compare the backup with
    rep = verify(str(d))
    if case.outcome == "torn":
        assert rep.ok, rep.as_dict()
        # A reader in another process stops at the torn tail ("not written yet").
        assert [r.payload for r in Wal.reader(d).read_from()] == expected[:case.kept]
        w = Wal.open(d, segment_size=seg_size)
        assert w.last_lsn == case.kept
        assert [r.payload for r in w.read_from()] == expected[:case.kept]
        w.append(b"after repair")
        w.close()
        w = Wal.open(d, segment_size=seg_size)
        assert [r.lsn for r in w.read_from()] == list(range(1, case.kept + 2))
        w.close()
        assert verify(str(d)).torn is None
        return
    assert not rep.ok
    if case.name == "garbage_segment_name":
        expected_path = str(d / "garbage.wal")
    elif case.name == "renamed_segment":
        expected_path = str(d / ("x" + segs[1].name))
    else:
        expected_path = str(segs[case.bad_seg])
    with pytest.raises(CorruptRecordError):
        list(Wal.reader(d).read_from())       # a reader in another process: never a silent end
    if case.outcome == "corrupt_open":
        with pytest.raises(CorruptRecordError) as ei:
            Wal.open(d, segment_size=seg_size)
    else:
        w = Wal.open(d, segment_size=seg_size)   # only the last segment is scanned at open
        with pytest.raises(CorruptRecordError) as ei:
            list(w.read_from())
        w.close()
        with pytest.raises(CorruptRecordError):
            list(Wal.reader(d).read_from())
    err = ei.value
    assert err.path == expected_path and expected_path in str(err)
    assert err.offset == case.bad_offset
    assert f"offset {case.bad_offset}" in str(err) and "ferry wal repair" in str(err)
    assert (rep.corruption[0], rep.corruption[1]) == (expected_path, case.bad_offset)
    # Repair only with a backup; afterwards the log is a clean prefix and takes appends.
    backup = d.parent / (d.name + "-backup")
    repair(str(d), str(backup))
    assert sorted(os.listdir(backup)) == sorted(n for n in os.listdir(d.parent / "orig")
                                                if n != "LOCK")
    w = Wal.open(d, segment_size=seg_size)
    recs = list(w.read_from())
    assert [r.payload for r in recs] == [expected[r.lsn - 1] for r in recs]
    assert [r.lsn for r in recs] == list(range(1, len(recs) + 1))
    w.append(b"after repair")
    w.close()
    assert verify(str(d)).ok


@pytest.mark.parametrize("case", CASES + ZERO_CASES, ids=[c.name for c in CASES + ZERO_CASES])
def test_corruption_table(tmp_path, case: Case) -> None:
    check(tmp_path / "log", case)
