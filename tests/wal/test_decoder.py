"""decode_block against a plain reading of the frame format, for both frame versions.

The replay loop is tuned for speed (stop reasons folded into one test, the buffer end
found by an exception, a separate loop for skipped records; in version 2 one CRC call per
run with a frame-by-frame fallback); this checks that it still keeps exactly the
records, and stops at exactly the offset, chain value, LSN and reason, that a
straightforward decoder written from docs/formats.md does, on damaged input too.
"""
from __future__ import annotations

from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from wal.decoder import BlockState, Stop, decode_block, scan
from wal.format import (CHECK, FRAME, FRAME_HEADER_SIZE, HEAD, encode_frame, encode_frame_v1,
                        mix)


def reference_v2(buf: bytes, off: int, chain: int, lsn: int, min_lsn: int):
    """Version 2 read straight from docs/formats.md, one frame at a time."""
    out = []
    while True:
        if len(buf) - off < HEAD.size:
            stop = Stop.END if off == len(buf) else Stop.SHORT
            return out, (off, chain, lsn, stop, len(buf) if off == len(buf) else len(buf) + 1)
        length, flsn, typ = HEAD.unpack_from(buf, off)
        end = off + HEAD.size + length
        if end + 4 > len(buf):
            return out, (off, chain, lsn, Stop.SHORT, end + 4)
        v = crc32c(buf[off:end], chain)
        if CHECK.pack(mix(v)) != buf[end:end + 4]:
            return out, (off, chain, lsn, Stop.BAD_CRC, end + 4)
        if flsn != lsn:
            return out, (off, chain, lsn, Stop.BAD_LSN, end + 4)
        if flsn >= min_lsn:
            out.append((flsn, typ, buf[off + HEAD.size:end]))
        off, chain, lsn = end + 4, crc32c(buf[end:end + 4], v), lsn + 1


def reference(buf: bytes, off: int, crc: int, lsn: int, min_lsn: int):
    """Version 1."""
    out = []
    while True:
        if len(buf) - off < FRAME_HEADER_SIZE:
            stop = Stop.END if off == len(buf) else Stop.SHORT
            return out, (off, crc, lsn, stop, len(buf) if off == len(buf) else len(buf) + 1)
        fcrc, length, flsn, typ = FRAME.unpack_from(buf, off)
        end = off + FRAME_HEADER_SIZE + length
        if end > len(buf):
            return out, (off, crc, lsn, Stop.SHORT, end)
        rest, payload = buf[off + 4:off + FRAME_HEADER_SIZE], buf[off + FRAME_HEADER_SIZE:end]
        if crc32c(payload, crc32c(rest, crc)) != fcrc:
            return out, (off, crc, lsn, Stop.BAD_CRC, end)
        if flsn != lsn:
            return out, (off, crc, lsn, Stop.BAD_LSN, end)
        if flsn >= min_lsn:
            out.append((flsn, typ, payload))
        off, crc, lsn = end, fcrc, lsn + 1


frames = st.lists(st.tuples(st.binary(max_size=40), st.integers(0, 3),
                            st.sampled_from([0, 0, 0, 0, 1, -1])), max_size=8)
damage = st.one_of(
    st.just(None),
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(0, 7)),
    st.tuples(st.just("cut"), st.integers(0, 10_000)),
    st.tuples(st.just("zeros"), st.integers(1, 64)),
)


@settings(max_examples=400, deadline=None)
@given(frames=frames, damage=damage, seed=st.integers(0, 2**32 - 1),
       first=st.integers(1, 100), skip=st.sampled_from([0, 1, 3, 100, 1 << 64]),
       prefix=st.integers(0, 5), version=st.sampled_from([1, 2]))
def test_decode_block_matches_reference(frames, damage, seed, first, skip, prefix, version):
    encode = encode_frame if version == 2 else encode_frame_v1
    ref = reference_v2 if version == 2 else reference
    buf, crc = bytearray(bytes(prefix)), seed
    for i, (payload, typ, lsn_off) in enumerate(frames):
        frame, crc = encode(payload, first + i + lsn_off, typ, crc)
        buf += frame
    if damage is not None and len(buf) > prefix:
        if damage[0] == "flip":
            buf[prefix + damage[1] % (len(buf) - prefix)] ^= 1 << damage[2]
        elif damage[0] == "cut":
            del buf[prefix + damage[1] % (len(buf) - prefix):]
    if damage is not None and damage[0] == "zeros":
        buf += bytes(damage[1])
    data = bytes(buf)
    min_lsn = first + skip if skip < 1 << 64 else skip

    state = BlockState()
    got = decode_block(data, prefix, seed, first, state, min_lsn, version)
    want, (off, c, lsn, stop, frame_end) = ref(data, prefix, seed, first, min_lsn)
    assert got == want
    assert all(type(r[2]) is bytes for r in got)
    assert (state.off, state.crc, state.lsn, state.stop, state.frame_end) == \
        (off, c, lsn, stop, frame_end)
    s = scan(data, prefix, seed, first, version)
    assert (s.off, s.crc, s.lsn, s.stop, s.frame_end) == (off, c, lsn, stop, frame_end)
