"""Batch frames (format version 3): ``append_many`` writes one frame holding all of its
records. Round trips from any LSN, all-or-none after a crash (a torn batch is cut
whole), corruption inside a batch named by file and offset, a batch that does not fit
the segment, and a follower in another process that never sees part of a batch."""
from __future__ import annotations

import os
import random
import struct
import subprocess
import textwrap
from pathlib import Path

import pytest
from crc32c import crc32c

from wal import CorruptRecordError, Wal, verify
from wal.blocks import BlockState, Stop
from wal.decoder import decode_block
from wal.format import (BATCH_HEAD, CHECK, FLAG_BATCH, HEADER_SIZE, SegmentHeader,
                        encode_batch, encode_frame, mix, parse_segment_name)


def payload(lsn: int, size: int = 0) -> bytes:
    return (f"<{lsn}>".encode() * (50 + size // 3))[:size or 5 + lsn % 37]


def seg_names(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.endswith(".wal"))


def test_batches_round_trip_from_every_lsn(tmp_path) -> None:
    d = tmp_path / "log"
    w = Wal.open(d, sync="none", segment_size=4096)
    want = []
    lsn = 1
    for n, typ in [(1, 3), (5, 4), (17, 5), (2, 6), (40, 7)]:
        ps = [payload(lsn + i) for i in range(n)]
        assert w.append_many(ps, typ) == lsn + n - 1
        want += [(lsn + i, typ, p) for i, p in enumerate(ps)]
        lsn += n
        assert w.append(b"single", 9) == lsn
        want.append((lsn, 9, b"single"))
        lsn += 1
    assert w.append_many([b"", b"", b"x"]) == lsn + 2      # empty payloads too
    want += [(lsn, 0, b""), (lsn + 1, 0, b""), (lsn + 2, 0, b"x")]
    for start in range(1, len(want) + 1):
        assert [tuple(r) for r in w.read_from(start)] == want[start - 1:]
        assert [r for b in w.read_batches(start) for r in b] == want[start - 1:]
    w.close()
    for start in (1, 3, 9, 20, len(want)):
        assert [tuple(r) for r in Wal.reader(d).read_from(start)] == want[start - 1:]
    rep = verify(str(d))
    assert rep.ok and rep.records == len(want)
    w = Wal.open(d)
    assert w.last_lsn == len(want)
    w.close()


def test_torn_batch_frame_at_the_tail_is_cut_whole(tmp_path) -> None:
    d = tmp_path / "log"
    w = Wal.open(d, sync="none")
    w.append_many([payload(i) for i in range(1, 11)])
    before = w._seg.size
    w.append_many([payload(i, 200) for i in range(11, 31)])
    end = w._seg.size
    w.close()
    path = d / seg_names(d)[-1]
    for cut in (before + 3, before + 30, (before + end) // 2, end - 1):
        data = path.read_bytes()[:end]
        path.write_bytes(data[:cut])
        w = Wal.open(d)
        assert w.last_lsn == 10                       # none of the torn batch
        assert os.path.getsize(path) == before
        assert [r.lsn for r in w.read_from()] == list(range(1, 11))
        w.close()
        path.write_bytes(data)                        # put it back for the next cut
    # A batch whose tail was never written (zeros) is torn as well.
    path.write_bytes(data[:end - 100] + bytes(100))
    w = Wal.open(d)
    assert w.last_lsn == 10
    w.close()


def test_corruption_inside_a_batch_frame_names_file_and_offset(tmp_path) -> None:
    d = tmp_path / "log"
    w = Wal.open(d, sync="none")
    w.append_many([payload(i) for i in range(1, 6)])
    at = w._seg.size
    w.append_many([payload(i, 100) for i in range(6, 56)])
    w.append(b"after")                      # so the damage is not a torn tail
    w.close()
    path = d / seg_names(d)[-1]
    data = bytearray(path.read_bytes())
    data[at + 24 + 4 * 50 + 777] ^= 0x20    # inside the 8th record's payload
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError) as ei:
        Wal.open(d)
    assert (ei.value.path, ei.value.offset) == (str(path), at)
    got = []
    with pytest.raises(CorruptRecordError) as ei:
        for rec in Wal.reader(d).read_from():
            got.append(rec.lsn)
    assert got == [1, 2, 3, 4, 5]          # nothing of the damaged batch
    assert (ei.value.path, ei.value.offset) == (str(path), at)
    rep = verify(str(d))
    assert rep.corruption[:2] == (str(path), at)


def _segment_with(frames: list[bytes], prev: int = 0, version: int = 3) -> bytes:
    return SegmentHeader(0, 1, prev, version=version).encode() + b"".join(frames)


def _checked(head: bytes, body: bytes, chain: int) -> bytes:
    v = crc32c(body, crc32c(head, chain))
    return head + body + CHECK.pack(mix(v))


def test_batch_frame_with_a_valid_check_but_bad_lengths_is_corruption(tmp_path) -> None:
    """Written that way (a writer bug, not a torn write): never taken as a torn tail."""
    lens = struct.pack("<2I", 3, 5)                   # adds up to 8, the body has 7
    body = struct.pack("<I", 2) + lens + b"abcdefg"
    frame = _checked(BATCH_HEAD.pack(len(body), 1, 0, FLAG_BATCH, 2)[:16], body, 0)
    state = BlockState()
    assert decode_block(frame, 0, 0, 1, state) == []
    assert state.stop is Stop.BAD_BODY
    d = tmp_path / "log"
    d.mkdir()
    (d / "0000000000000000-0000000000000001.wal").write_bytes(_segment_with([frame]))
    with pytest.raises(CorruptRecordError, match="do not add up"):
        Wal.open(d)


def test_flags_in_a_version2_segment_are_corruption() -> None:
    parts, _, _ = encode_batch([b"a", b"b"], 1, 0, 0)
    frame = b"".join(parts)
    state = BlockState()
    assert decode_block(frame, 0, 0, 1, state, version=2) == []
    assert state.stop is Stop.BAD_BODY
    assert decode_block(frame, 0, 0, 1, state, version=3) == [(1, 0, b"a"), (2, 0, b"b")]


def test_damaged_length_of_a_short_batch_frame_is_corruption_not_torn(tmp_path) -> None:
    """A batch frame whose length field was damaged (it now runs past the end) while
    valid frames follow: the chain after it proves the frames real."""
    d = tmp_path / "log"
    w = Wal.open(d, sync="none")
    w.append(b"first")
    at = w._seg.size
    w.append_many([payload(i) for i in range(2, 12)])
    w.append(b"after one")
    w.append(b"after two")
    w.close()
    path = d / seg_names(d)[-1]
    data = bytearray(path.read_bytes())
    data[at + 2] = 0x7F                     # length now far past the end of the file
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match="damaged length") as ei:
        Wal.open(d)
    assert ei.value.offset == at


def test_batch_larger_than_the_segment_room_goes_whole_to_the_next(tmp_path) -> None:
    d = tmp_path / "log"
    w = Wal.open(d, sync="none", segment_size=4096)
    w.append(payload(1, 3000))
    last = w.append_many([payload(i, 50) for i in range(2, 22)])   # ~1.3 KiB: no room
    names = seg_names(d)
    assert [parse_segment_name(n)[1] for n in names] == [1, 2]
    # Bigger than a whole segment: a segment of its own; the next record starts one.
    big = w.append_many([payload(i, 300) for i in range(last + 1, last + 41)])
    after = w.append(b"after")
    names = seg_names(d)
    assert [parse_segment_name(n)[1] for n in names] == [1, 2, last + 1, after]
    assert os.path.getsize(d / names[2]) > 4096
    w.close()
    recs = list(Wal.reader(d).read_from())
    assert [r.lsn for r in recs] == list(range(1, after + 1))
    assert recs[big - 1].payload == payload(big, 300)
    assert verify(str(d)).ok


def test_one_record_batch_is_a_plain_frame(tmp_path) -> None:
    w = Wal.open(tmp_path, sync="none")
    w.append_many([b"only"])
    assert w._seg.size == HEADER_SIZE + 20 + 4
    buf, chain = encode_frame(b"only", 1, 0, 0)
    assert (tmp_path / seg_names(tmp_path)[0]).read_bytes()[HEADER_SIZE:] == buf
    w.close()


FOLLOWER = textwrap.dedent("""
    import struct, sys
    from wal import follow_dir
    total = int(sys.argv[2])
    expect, lists = 1, 0
    for recs in follow_dir(sys.argv[1], 1, timeout=60).batches():
        for lsn, typ, p in recs:
            got, batch_end = struct.unpack_from("<QQ", p)
            if lsn != expect or got != lsn:
                print("BAD order", lsn, expect, flush=True); sys.exit(3)
            expect += 1
        # A batch frame is decoded whole or not at all: every list ends at a batch end.
        if struct.unpack_from("<QQ", recs[-1][2])[1] != recs[-1][0]:
            print("PARTIAL batch", recs[-1][0], flush=True); sys.exit(4)
        lists += 1
        if expect > total:
            break
    print("DONE", expect - 1, lists, flush=True)
""")


def test_follower_in_another_process_never_sees_part_of_a_batch(tmp_path, py_env,
                                                                python) -> None:
    d = tmp_path / "log"
    w = Wal.open(d, sync="none", segment_size=1 << 20)
    sizes = [1, 3000, 7, 1200, 1, 2500, 64] * 3      # 3000 x ~100 B > a 128 KiB read
    total = sum(sizes)
    p = subprocess.Popen([python, "-c", FOLLOWER, str(d), str(total)], env=py_env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lsn = 1
    for n in sizes:
        end = lsn + n - 1
        w.append_many([struct.pack("<QQ", lsn + i, end) + bytes(84) for i in range(n)])
        lsn = end + 1
    out, err = p.communicate(timeout=90)
    w.close()
    assert p.returncode == 0, out + err
    assert out.split()[:2] == ["DONE", str(total)]


@pytest.mark.parametrize("sync", ["none", "group"])
def test_batch_of_wider_item_views_is_refused_and_writes_nothing(tmp_path, sync) -> None:
    """len() of a memoryview over array('i') counts items, not bytes: the batch frame's
    lengths would lie. The batch is refused before anything is written."""
    from array import array
    w = Wal.open(tmp_path / "w", sync=sync)
    try:
        w.append_many([b"before-1", b"before-2"])
        wide = memoryview(array("i", [1, 2, 3]))
        with pytest.raises(ValueError, match="1-byte items"):
            w.append_many([b"ok", wide, b"also"])
        last = w.append_many([b"after", wide.cast("B")])
    finally:
        w.close()
    w = Wal.open(tmp_path / "w", sync=sync)
    try:
        got = [r.payload for r in w.read_from(1)]
    finally:
        w.close()
    assert got == [b"before-1", b"before-2", b"after", array("i", [1, 2, 3]).tobytes()]
    assert last == 4


@pytest.mark.parametrize("batch", [False, True])
def test_a_frame_over_the_write_slice_goes_out_in_slices(tmp_path, batch) -> None:
    """A frame bigger than faults.fileio.WRITE_SLICE (one 3.5 MiB record, or a batch of
    2,000 x 2 KiB) is written by several writev of at most WRITE_SLICE bytes (a write of
    2 MiB or more costs several times the CPU), and reads back whole."""
    from faults.fileio import IOV_MAX, WRITE_SLICE
    w = Wal.open(tmp_path / "log", segment_size=16 << 20, sync="none")
    seen: list[int] = []
    real = w._writev

    def writev(fd, parts):
        assert len(parts) <= IOV_MAX
        seen.append(sum(len(memoryview(p).cast("B")) for p in parts))
        return real(fd, parts)

    w._writev = writev
    rng = random.Random(7)
    payloads = ([rng.randbytes(2048) for _ in range(2000)] if batch
                else [rng.randbytes(7 << 19)])
    if batch:
        w.append_many(payloads)
    else:
        w.append(payloads[0])
    assert len(seen) >= 4 and max(seen) <= WRITE_SLICE, seen
    w.close()
    assert [r.payload for r in Wal.reader(tmp_path / "log").read_from()] == payloads


def test_a_sliced_frame_refused_by_a_full_disk_is_taken_back(small_fs) -> None:
    """Frames of 1.5 MiB on a 2 MiB file system: the second fails part-way through its
    slices; it is cut off again and the log holds exactly the acknowledged record."""
    from wal import OutOfDiskError
    d = small_fs / "log"
    w = Wal.open(d, segment_size=8 << 20, sync="always")
    first = os.urandom(3 << 19)
    w.append(first)
    with pytest.raises(OutOfDiskError):
        w.append(os.urandom(3 << 19))
    assert [r.payload for r in w.read_from()] == [first]
    w.close()
    assert [r.payload for r in Wal.reader(d).read_from()] == [first]
