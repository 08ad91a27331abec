"""Random damage to whole logs: corrupt or torn, never a silent drop.

Hypothesis writes a log (format versions 1, 2 and 3; plain and batch frames; payloads
with long zero runs, which are what made a flipped byte look like a torn write), flips
random bytes anywhere in its files, sometimes after cutting the last segment short as a
crash would, and then asks ``verify``, a reader in another process and the writer's
open. Whatever they say must agree with what the damage can justify:

* damage in a segment header, or in any segment but the last: corruption;
* a frame that still checks out on its own after the first damaged byte (its bytes and
  the check before it undamaged): corruption -- it was written after the damage and may
  have been acknowledged, so cutting there would drop it silently;
* otherwise torn or corrupt; when torn, exactly the records of the frames before the
  first damaged byte (or cut) are returned, in order, by every reader and after the
  cut.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wal import CorruptRecordError, Wal, verify
from wal.format import (BATCH_COUNT, FRAME, HEAD3, HEAD_SIZE, HEADER_SIZE, SegmentHeader,
                        encode_frame, encode_frame_v1, segment_name)

payloads = st.one_of(
    st.binary(max_size=80),
    st.builds(lambda n, tail: bytes(n) + tail, st.integers(0, 1500), st.binary(max_size=8)),
    st.builds(lambda head, n: head + bytes(n), st.binary(min_size=1, max_size=8),
              st.integers(512, 1200)),
)
# A record, or (version 3) a batch of records: one frame either way.
items = st.lists(st.one_of(payloads, st.lists(payloads, min_size=2, max_size=4)),
                 min_size=1, max_size=14)
flips = st.lists(st.tuples(st.integers(0, 2**31), st.integers(0, 2**31), st.integers(1, 255)),
                 max_size=3)


@dataclass(frozen=True)
class Frame:
    start: int
    end: int
    first_lsn: int
    count: int


def build(d: Path, version: int, entries: list, segment_size: int) -> list[bytes]:
    """Write ``entries`` as a log of frame ``version``; the payloads, in LSN order."""
    flat = [p for e in entries for p in (e if isinstance(e, list) else [e])]
    if version == 3:
        w = Wal.open(d, segment_size=segment_size, sync="none")
        for e in entries:
            if isinstance(e, list):
                w.append_many(e)
            else:
                w.append(e)
        w.close()
        return flat
    # Versions 1 and 2 are no longer written by the log: segments made by hand, cut
    # where the next frame would pass segment_size (as the writer of the time did).
    d.mkdir(parents=True)
    encode = encode_frame if version == 2 else encode_frame_v1
    seq, lsn, chain = 0, 1, 0
    seg = bytearray(SegmentHeader(0, 1, 0, version).encode())
    first = 1
    for p in flat:
        frame, after = encode(p, lsn, 0, chain)
        if len(seg) + len(frame) > segment_size and len(seg) > HEADER_SIZE:
            (d / segment_name(seq, first)).write_bytes(bytes(seg))
            seq, first = seq + 1, lsn
            seg = bytearray(SegmentHeader(seq, lsn, chain, version).encode())
        seg += frame
        chain, lsn = after, lsn + 1
    (d / segment_name(seq, first)).write_bytes(bytes(seg))
    return flat


def frames_of(data: bytes, version: int, first_lsn: int) -> list[Frame]:
    out, off, lsn = [], HEADER_SIZE, first_lsn
    while off < len(data):
        if version == 1:
            end = off + FRAME.size + FRAME.unpack_from(data, off)[1]
            count = 1
        else:
            length, _, _, flags = HEAD3.unpack_from(data, off)
            end = off + HEAD_SIZE + length + 4
            count = BATCH_COUNT.unpack_from(data, off + HEAD_SIZE)[0] if flags else 1
        out.append(Frame(off, end, lsn, count))
        off, lsn = end, lsn + count
    assert off == len(data)
    return out


def proves_itself(f: Frame, damaged: set[int], version: int, frames: list[Frame]) -> bool:
    """The frame can be checked without the chain from the segment's start: its own
    bytes are undamaged, and so is what seeds its check (v2/v3: the check stored just
    before it; v1: the CRC, length and LSN fields of the frame before it)."""
    if any(f.start <= o < f.end for o in damaged):
        return False
    if version >= 2:
        return not any(f.start - 4 <= o < f.start for o in damaged)
    prev = next(p for p in frames if p.end == f.start)
    return not any(prev.start <= o < prev.start + FRAME.size for o in damaged)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(version=st.sampled_from([1, 2, 3, 3]), entries=items, flips=flips,
       segment_size=st.sampled_from([2048, 4096, 1 << 20]),
       cut=st.one_of(st.none(), st.integers(0, 2**31)))
def test_random_damage_is_corrupt_or_torn_never_a_silent_drop(version, entries, flips,
                                                              segment_size, cut) -> None:
    if version < 3:
        entries = [p for e in entries for p in (e if isinstance(e, list) else [e])]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "log"
        flat = build(d, version, entries, segment_size)
        segs = sorted(d.glob("*.wal"))
        datas = [bytearray(p.read_bytes()) for p in segs]
        layouts, lsn = [], 1
        for data in datas:
            layouts.append(frames_of(bytes(data), version, lsn))
            lsn = layouts[-1][-1].first_lsn + layouts[-1][-1].count if layouts[-1] else lsn

        last = datas[-1]
        if cut is not None and len(last) > HEADER_SIZE:
            del last[HEADER_SIZE + cut % (len(last) - HEADER_SIZE):]   # a crash's short write
            layouts[-1] = [f for f in layouts[-1] if f.end <= len(last)]
        touched: list[set[int]] = [set() for _ in datas]
        for which, at, mask in flips:
            i = which % len(datas)
            if datas[i]:
                o = at % len(datas[i])
                datas[i][o] ^= mask
                touched[i].add(o)
        # (two flips of one byte may cancel out)
        damaged = [{o for o in t if data[o] != orig[o]}
                   for t, data, orig in zip(touched, datas, (p.read_bytes() for p in segs))]
        for p, data in zip(segs, datas):
            p.write_bytes(bytes(data))

        # What the damage can justify.
        hit = next((i for i, dm in enumerate(damaged) if dm), None)
        cut_short = len(last) > (layouts[-1][-1].end if layouts[-1] else HEADER_SIZE)
        must_be_corrupt = hit is not None and (
            hit < len(datas) - 1 or min(damaged[hit]) < HEADER_SIZE or
            any(proves_itself(f, damaged[hit], version, layouts[hit])
                for f in layouts[hit] if f.start > min(damaged[hit])))
        frames = [f for lay in layouts[:-1] for f in lay] + \
            [f for f in layouts[-1] if not damaged[-1] or f.end <= min(damaged[-1])]
        before = sum(f.count for f in frames)     # records wholly before any damage/cut
        torn_possible = hit is not None or cut_short

        rep = verify(str(d))
        reader_error = None
        try:
            read = [r.payload for r in Wal.reader(d).read_from()]
        except CorruptRecordError as e:
            reader_error = e
        if must_be_corrupt:
            assert not rep.ok, (rep.as_dict(), damaged)
        if not rep.ok:
            assert reader_error is not None, rep.as_dict()
            if rep.corruption[0] == str(segs[-1]) and rep.corruption[1] >= HEADER_SIZE:
                try:
                    Wal.open(d, segment_size=segment_size).close()
                except CorruptRecordError as e:
                    assert (e.path, e.offset) == rep.corruption[:2]
                else:
                    raise AssertionError(f"open accepted {rep.corruption}")
            return
        # Torn (or untouched): exactly the records before the first damaged byte.
        assert torn_possible or rep.torn is None
        assert reader_error is None, reader_error
        assert read == flat[:before], (len(read), before, rep.as_dict())
        w = Wal.open(d, segment_size=segment_size)
        try:
            assert w.last_lsn == before
            assert [r.payload for r in w.read_from()] == flat[:before]
        finally:
            w.close()
        assert verify(str(d)).torn is None


def test_a_cut_alone_is_always_a_torn_tail(tmp_path) -> None:
    """No damage, only a short last segment (what SIGKILL mid-append leaves), even when
    the partial frame's payload is a long run of zeros: always torn, never corrupt."""
    for version in (1, 2, 3):
        d = tmp_path / f"v{version}"
        flat = build(d, version, [b"a", bytes(3000), b"b" * 40, bytes(1500) + b"z"], 1 << 20)
        seg = sorted(d.glob("*.wal"))[-1]
        size = seg.stat().st_size
        for keep in range(HEADER_SIZE, size, 97):
            data = seg.read_bytes()
            try:
                os.truncate(seg, keep)
                rep = verify(str(d))
                assert rep.ok, (version, keep, rep.as_dict())
                frames = frames_of(data, version, 1)
                whole = sum(f.count for f in frames if f.end <= keep)
                assert [r.payload for r in Wal.reader(d).read_from()] == flat[:whole]
            finally:
                seg.write_bytes(data)
