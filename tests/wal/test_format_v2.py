"""Frame format version 2 (one CRC call per run of frames) next to version 1.

Version-1 logs written before the change must still open, read and take appends (the
writer continues them in a fresh version-2 segment); a damaged version-2 frame must be
named by its own offset even though runs are checked with one CRC call; the chain must
still catch a frame that is missing or comes from elsewhere, LSNs notwithstanding.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from wal import CorruptRecordError, Wal, verify
from wal.decoder import BlockState, Stop, decode_block
from wal.format import (CHECK, HEAD, HEADER_SIZE, VERSION, SegmentHeader, encode_frame, encode_frame_v1,
                        mix, parse_segment_name, segment_name)


def payload(i: int, size: int = 60) -> bytes:
    return (f"[{i}]".encode() * size)[:size]


def write_v1_log(d: Path, per_seg: list[int]) -> list[Path]:
    """A log as the version-1 writer left it: segments of ``per_seg`` records each."""
    d.mkdir(parents=True, exist_ok=True)
    lsn, crc, paths = 1, 0, []
    for seq, count in enumerate(per_seg):
        data = bytearray(SegmentHeader(seq, lsn, crc, version=1).encode())
        for _ in range(count):
            frame, crc = encode_frame_v1(payload(lsn), lsn, lsn % 3, crc)
            data += frame
            lsn += 1
        path = d / segment_name(seq, lsn - count)
        path.write_bytes(bytes(data))
        paths.append(path)
    return paths


def versions(d: Path) -> list[int]:
    out = []
    for p in sorted(d.glob("*.wal")):
        hdr = SegmentHeader.decode(p.read_bytes())
        assert isinstance(hdr, SegmentHeader)
        out.append(hdr.version)
    return out


def test_version1_log_opens_reads_and_continues_in_version2(tmp_path) -> None:
    d = tmp_path / "log"
    write_v1_log(d, [30, 25])
    assert verify(str(d)).ok and verify(str(d)).records == 55
    assert [tuple(r) for r in Wal.reader(d).read_from()] == \
        [(i, i % 3, payload(i)) for i in range(1, 56)]
    w = Wal.open(d, sync="group")
    assert (w.first_lsn, w.last_lsn) == (1, 55)
    assert [r.lsn for r in w.read_from(50)] == list(range(50, 56))
    assert w.append(b"v2 one") == 56
    assert w.append_many([b"v2 two", b"v2 three"]) == 58
    w.close()
    assert versions(d) == [1, 1, VERSION]  # the old segments stay as they were
    names = sorted(n for n in os.listdir(d) if n.endswith(".wal"))
    assert parse_segment_name(names[-1]) == (2, 56)
    w = Wal.open(d)
    want = [(i, i % 3, payload(i)) for i in range(1, 56)] + \
        [(56, 0, b"v2 one"), (57, 0, b"v2 two"), (58, 0, b"v2 three")]
    assert [tuple(r) for r in w.read_from()] == want
    assert [r for b in w.read_batches(54) for r in b] == want[53:]
    w.close()
    assert [tuple(r) for r in Wal.reader(d).read_from()] == want
    rep = verify(str(d))
    assert rep.ok and rep.records == 58 and rep.last_lsn == 58


def test_torn_tail_of_a_version1_segment_is_cut_then_continued(tmp_path) -> None:
    d = tmp_path / "log"
    paths = write_v1_log(d, [10])
    with open(paths[0], "ab") as f:
        f.write(encode_frame_v1(b"never acknowledged", 11, 0, 0)[0][:17])
    w = Wal.open(d)
    assert w.last_lsn == 10
    w.append(b"after")
    w.close()
    assert versions(d) == [1, VERSION]
    assert [r.lsn for r in Wal.reader(d).read_from()] == list(range(1, 12))


def test_corruption_in_a_version1_segment_of_a_mixed_log_names_it(tmp_path) -> None:
    d = tmp_path / "log"
    paths = write_v1_log(d, [20])
    w = Wal.open(d, sync="none")
    w.append_many([payload(i) for i in range(21, 41)])
    w.close()
    frame = 20 + len(payload(1))
    bad = HEADER_SIZE + 7 * frame
    with open(paths[0], "r+b") as f:
        f.seek(bad + 30)
        b = f.read(1)
        f.seek(bad + 30)
        f.write(bytes([b[0] ^ 1]))
    w = Wal.open(d)      # only the last (version 2) segment is scanned at open
    with pytest.raises(CorruptRecordError) as ei:
        list(w.read_from())
    w.close()
    assert (ei.value.path, ei.value.offset) == (str(paths[0]), bad)
    assert verify(str(d)).corruption[:2] == (str(paths[0]), bad)


def frames_v2(n: int, seed: int = 7, first: int = 1, size: int = 0) -> tuple[bytearray, list[int]]:
    buf, chain, offsets = bytearray(), seed, []
    for i in range(n):
        offsets.append(len(buf))
        frame, chain = encode_frame(payload(first + i, size or 10 + i % 40), first + i, 1,
                                    chain)
        buf += frame
    return buf, offsets


@pytest.mark.parametrize("k", [0, 1, 17, 48, 49])
@pytest.mark.parametrize("where", ["length", "lsn", "type", "payload", "check"])
def test_one_call_check_names_the_flipped_frame(k: int, where: str) -> None:
    buf, offsets = frames_v2(50)
    length = HEAD.unpack_from(buf, offsets[k])[0]
    at = offsets[k] + {"length": 0, "lsn": 5, "type": 12, "payload": 16 + length // 2,
                       "check": 16 + length + 2}[where]
    if where == "length":
        buf[at] ^= 0x01            # a length one off: the frame ends in the wrong place
    else:
        buf[at] ^= 0x40
    state = BlockState()
    recs = decode_block(bytes(buf), 0, 7, 1, state)
    assert [r[0] for r in recs] == list(range(1, k + 1))
    assert state.off == offsets[k] and state.lsn == k + 1
    assert state.stop in (Stop.BAD_CRC, Stop.SHORT, Stop.BAD_LSN)
    if where in ("payload", "check", "type"):
        assert state.stop is Stop.BAD_CRC


def test_flipped_byte_on_disk_is_reported_at_its_frame(tmp_path) -> None:
    d = tmp_path / "log"
    w = Wal.open(d, segment_size=8192, sync="none")
    for i in range(1, 201):        # plain frames (append_many writes one batch frame)
        w.append(payload(i, 100))
    w.close()
    segs = sorted(d.glob("*.wal"))
    assert len(segs) >= 3 and versions(d) == [VERSION] * len(segs)
    target = segs[1]
    bad = HEADER_SIZE + 41 * 120                   # 100 B payload + 20 B per frame
    with open(target, "r+b") as f:
        f.seek(bad + 70)
        b = f.read(1)
        f.seek(bad + 70)
        f.write(bytes([b[0] ^ 0x10]))
    first = parse_segment_name(target.name)[1]
    w = Wal.open(d, segment_size=8192)
    got = []
    with pytest.raises(CorruptRecordError) as ei:
        for b in w.read_batches():
            got += b
    w.close()
    assert (ei.value.path, ei.value.offset) == (str(target), bad)
    assert [r[0] for r in got] == list(range(1, first + 41))
    with pytest.raises(CorruptRecordError) as ei:
        list(Wal.reader(d).read_from())
    assert (ei.value.path, ei.value.offset) == (str(target), bad)


def test_chain_catches_a_missing_frame_even_with_consistent_lsns() -> None:
    """A frame that is valid on its own, with the expected LSN, but made from a chain
    that went through a record which is not there (the record was lost)."""
    full, offsets = frames_v2(6)
    chain = 7
    for i in range(3):                              # chain after LSNs 1..3
        chain = encode_frame(payload(1 + i, 10 + i % 40), 1 + i, 1, chain)[1]
    impostor, _ = encode_frame(b"after a lost record", 3, 1, chain)
    buf = bytes(full[:offsets[2]]) + impostor      # LSNs 1, 2, 3: in order
    state = BlockState()
    recs = decode_block(buf, 0, 7, 1, state)
    assert [r[0] for r in recs] == [1, 2]
    assert (state.off, state.stop) == (offsets[2], Stop.BAD_CRC)


def test_chain_catches_a_frame_from_another_log() -> None:
    a, offsets = frames_v2(8, seed=7)
    b, _ = frames_v2(8, seed=8)                     # same records, another chain
    buf = bytes(a[:offsets[4]] + b[offsets[4]:offsets[5]] + a[offsets[5]:])
    state = BlockState()
    recs = decode_block(buf, 0, 7, 1, state)
    assert [r[0] for r in recs] == [1, 2, 3, 4] and state.off == offsets[4]
    assert state.stop is Stop.BAD_CRC


def test_check_is_not_the_plain_crc() -> None:
    """Why ``mix``: with the plain CRC stored, the running CRC after every frame would be
    the same constant (CRC residue), and the chain would forget what came before."""
    head = HEAD.pack(3, 1, 0)
    residues = set()
    for seed in (1, 2, 3):
        v = crc32c(b"abc", crc32c(head, seed))
        residues.add(crc32c(CHECK.pack(v), v))
        assert crc32c(CHECK.pack(mix(v)), v) != crc32c(CHECK.pack(mix(v ^ 1)), v ^ 1)
    assert len(residues) == 1


batches = st.lists(st.lists(st.binary(max_size=300), min_size=1, max_size=20),
                   min_size=1, max_size=12)


@settings(max_examples=25, deadline=None)
@given(batches=batches, single=st.lists(st.booleans(), min_size=12, max_size=12),
       seg_size=st.sampled_from([256, 1024, 1 << 20]))
def test_random_batches_replay_exactly(tmp_path_factory, batches, single, seg_size) -> None:
    d = tmp_path_factory.mktemp("log")
    w = Wal.open(d, segment_size=seg_size, sync="none")
    want = []
    for batch, one in zip(batches, single):
        if one:
            for p in batch:
                w.append(p, type=len(p) % 7)
                want.append((len(want) + 1, len(p) % 7, p))
        else:
            w.append_many(batch, type=3)
            want += [(len(want) + 1 + i, 3, p) for i, p in enumerate(batch)]
    assert [r for b in w.read_batches() for r in b] == want
    w.close()
    w = Wal.open(d, segment_size=seg_size)
    assert [tuple(r) for r in w.read_from()] == want
    start = 1 + len(want) // 2
    assert [r for b in w.read_batches(start) for r in b] == want[start - 1:]
    w.close()
    assert [tuple(r) for r in Wal.reader(d).read_from()] == want
    assert verify(str(d)).records == len(want)
