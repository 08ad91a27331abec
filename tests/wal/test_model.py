"""Hypothesis stateful test: a model of what was written and acknowledged beside the
real log; crashes cut the last segment at a random point past its last durable byte."""
from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from wal import Wal
from wal.format import FRAME_HEADER_SIZE, HEAD3, HEADER_SIZE, parse_segment_name

SEG = 2048


def abandon(w: Wal) -> None:
    """What SIGKILL leaves: descriptors closed by the kernel, no fsync, no close()."""
    for s in w._segs:
        if s.fd >= 0:
            os.close(s.fd)
            s.fd = -1
    w._dirlock.release()
    w._closed = True
    w._committer.stop(failed=True)   # the sync thread dies with the process too
    w._committer.join_thread()


def durable_end(path: str, durable: int) -> int:
    """End of the frame holding LSN ``durable`` in the segment at ``path`` (its header's
    end when the segment holds no durable record): a walk over the frame heads. A batch
    frame (format version 3) holds several records, and group commit writes the records
    it gathers as one, so the frame boundaries come from the file, not the model."""
    with open(path, "rb") as f:
        data = f.read()
    off = HEADER_SIZE
    while off + HEAD3.size <= len(data):
        length, lsn, _, _ = HEAD3.unpack_from(data, off)
        if lsn > durable:      # (durable LSNs end frames: a frame is written whole)
            break
        off += FRAME_HEADER_SIZE + length
    return off


class WalModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="walmodel-")
        self.wal = Wal.open(self.dir, segment_size=SEG, sync="group")
        self.written: list[bytes] = []      # payload of LSN i+1
        self.acked = 0                      # every LSN <= acked was acknowledged durable

    def teardown(self) -> None:
        if not self.wal._closed:
            self.wal.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(data=st.binary(max_size=300), wait=st.booleans())
    def append(self, data: bytes, wait: bool) -> None:
        lsn = self.wal.append(data, wait=wait)
        self.written.append(data)
        assert lsn == len(self.written)
        if wait:
            self.acked = lsn

    @rule(batch=st.lists(st.binary(max_size=700), max_size=12))
    def append_many(self, batch: list[bytes]) -> None:
        last = self.wal.append_many(batch)
        self.written.extend(batch)
        assert last == len(self.written)
        self.acked = last

    @rule()
    def sync(self) -> None:
        self.wal.sync()
        self.acked = len(self.written)

    @rule(where=st.floats(0, 1), zeros=st.booleans())
    def crash(self, where: float, zeros: bool) -> None:
        w = self.wal
        durable = w.durable_lsn
        assert durable >= self.acked
        last = w._seg
        abandon(w)
        # Byte where the frame holding the last durable record of the last segment ends.
        end = durable_end(last.path, durable)
        size = os.path.getsize(last.path)
        assert end <= size
        cut_at = end + int((size - end) * where)
        with open(last.path, "r+b") as f:
            f.truncate(cut_at)
            if zeros:   # the file system kept the size but not the data
                f.seek(cut_at)
                f.write(bytes(size - cut_at))
        self.wal = Wal.open(self.dir, segment_size=SEG, sync="group")
        first = self.wal.first_lsn
        got = [r.payload for r in self.wal.read_from()]
        kept = first - 1 + len(got)
        assert got == self.written[first - 1:kept], "log is not a prefix of what was written"
        assert kept >= self.acked, f"lost acknowledged records: {kept} < {self.acked}"
        self.written = self.written[:kept]
        self.acked = kept

    @precondition(lambda self: len(self.written) > 0)
    @rule(frac=st.floats(0, 1))
    def truncate_before(self, frac: float) -> None:
        lsn = 1 + int(frac * len(self.written))
        before = self.wal.first_lsn
        self.wal.truncate_before(lsn)
        assert self.wal.first_lsn <= max(lsn, before)

    @invariant()
    def reads_match_model(self) -> None:
        w = self.wal
        first = w.first_lsn
        assert w.last_lsn == len(self.written)
        got = [r.payload for r in w.read_from()]
        assert got == self.written[first - 1:]
        segs = sorted(n for n in os.listdir(self.dir) if n.endswith(".wal"))
        assert [parse_segment_name(n)[1] for n in segs][0] == first


TestWalModel = WalModel.TestCase
TestWalModel.settings = settings(max_examples=30, stateful_step_count=25, deadline=None,
                                 suppress_health_check=[HealthCheck.too_slow])
