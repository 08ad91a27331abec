"""Hypothesis against a live supplier: garbage, mutated and hostile frames, before and
after the handshake. The server must answer with well-formed frames or close, never
fail unexpectedly, leave no session or handshake slot behind, and keep serving a good
demander afterwards. (Decoder-level fuzzing of the framing is in test_frames.py.)
"""
from __future__ import annotations

import logging
import os

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from transfer import Demander, DirectoryStorage, Limits, SupplierServer
from transfer import frames
from transfer.frames import ErrorCode, FrameType

from transfer_helpers import SECRET, peer_of, read, wait_until, write_part
from wire_fuzz import HANDSHAKE_BODIES, TRANSFER_BODIES, exchange, mutated, streams

FUZZ = settings(max_examples=80, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
pytestmark = pytest.mark.timeout(120)

# What a supplier may send at all (CHUNK data is skipped by the parser).
SUPPLIER_SENDS = {FrameType.CHALLENGE, FrameType.AUTH_OK, FrameType.QUEUED, FrameType.MANIFEST,
                  FrameType.CHUNK, FrameType.PREIMAGE, FrameType.END, FrameType.ERROR}


@pytest.fixture
def live(tmp_path):
    src = tmp_path / "src"
    write_part(str(src), 0, 200 << 10)
    write_part(str(src / "c"), 1, 1000)
    srv = SupplierServer(DirectoryStorage(str(src)), SECRET, limits=Limits(4), timeout=5,
                         handshake_timeout=3).start()
    yield srv, str(src)
    srv.stop()


def _frame(t: int, body: dict) -> bytes:
    return frames.encode(t, body)


# A transfer driven through its stages with plausible, slightly wrong frames: a good
# DEMAND (or one field off), ACCEPT, RECEIVED, then RESENDs and APPLIED, each present or
# not, mutated or not. Random frames alone rarely get past the DEMAND's checks.
_chunk = st.sampled_from([64 << 10, 64 << 10, 1 << 20, 3 << 16, 0])
_demand = st.fixed_dictionaries({"cache": st.sampled_from(["default", "default", "c", "nope"]),
                                 "partition": st.sampled_from([0, 0, 1, 2]), "priority": st.integers(0, 3),
                                 "chunk_size": _chunk,
                                 "held": st.lists(st.binary(min_size=12, max_size=12), max_size=3).map(b"".join)})
_accept = st.just(_frame(FrameType.ACCEPT, {}))
_received = st.sampled_from([3, 3, 3, 0, 1, 4, 5]).map(lambda i: _frame(FrameType.RECEIVED, {"index": i}))
_tail = st.one_of(
    st.lists(st.integers(0, 6), min_size=1, max_size=40).map(lambda c: _frame(FrameType.RESEND, {"chunks": c})),
    st.just(_frame(FrameType.APPLIED, {"ok": True})))


def _maybe_mutated(s: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    return st.one_of(s, s, s, s, s, mutated(s), st.just(b""))


# sent part by part, each after the server's answer to the one before
scripted = st.tuples(_demand.map(lambda d: _frame(FrameType.DEMAND, d)), _maybe_mutated(_accept),
                     _maybe_mutated(_received), st.lists(_maybe_mutated(_tail), max_size=4)) \
    .map(lambda t: [t[0], t[1], t[2], *t[3]])
GOOD_SCRIPT = [_frame(FrameType.DEMAND, {"cache": "default", "partition": 0, "priority": 1,
                                         "chunk_size": 64 << 10, "held": b""}),
               _frame(FrameType.ACCEPT, {}), _frame(FrameType.RECEIVED, {"index": 3}),
               _frame(FrameType.RESEND, {"chunks": [0] * 30 + [3]}), _frame(FrameType.APPLIED, {"ok": True})]


def _check(frames_back) -> None:
    for fr in frames_back:
        assert fr.type in SUPPLIER_SENDS, fr
        if fr.type == FrameType.ERROR:
            assert fr.body["code"] in set(ErrorCode) and isinstance(fr.body["message"], str), fr


def _still_serving(srv: SupplierServer, src: str, dst: str, caplog) -> None:
    wait_until(lambda: not (srv._sessions or srv.gate.pending))
    assert not srv._sessions and srv.gate.pending == 0, (srv._sessions, srv.gate.pending)
    Demander(DirectoryStorage(dst), peer_of(srv), SECRET, timeout=10).fetch(0)
    assert read(os.path.join(dst, "part-0.bin")) == read(os.path.join(src, "part-0.bin"))
    bad = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert bad == []


def test_fuzz_before_the_handshake(live, dst, caplog) -> None:
    srv, src = live

    @FUZZ
    @given(streams(list(HANDSHAKE_BODIES) + [FrameType.DEMAND, FrameType.ERROR], HANDSHAKE_BODIES))
    def one(payload: bytes) -> None:
        _check(exchange(srv.address, payload))

    with caplog.at_level(logging.WARNING):
        one()
    _still_serving(srv, src, dst, caplog)


def test_fuzz_after_the_handshake(live, dst, caplog) -> None:
    srv, src = live

    seen: set[int] = set()

    @FUZZ
    @example(GOOD_SCRIPT)          # every stage at least once, whatever is drawn
    @given(streams(list(TRANSFER_BODIES), TRANSFER_BODIES) | scripted)
    def one(payload: bytes | list[bytes]) -> None:
        back = exchange(srv.address, payload, secret=SECRET)
        _check(back)
        seen.update(fr.type for fr in back)

    with caplog.at_level(logging.WARNING):
        one()
    assert {FrameType.MANIFEST, FrameType.CHUNK, FrameType.END} <= seen     # it got that far
    _still_serving(srv, src, dst, caplog)
