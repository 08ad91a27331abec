"""Delta fetches (transfer.delta): a demander that holds an older copy of a page file
receives only the pages that differ, zero-copy, and installs nothing that is not
exactly the supplier's partition at C."""
from __future__ import annotations

import os

import pytest

from checkpoint import pagefile
from transfer import (ChecksumError, Demander, FrameError, Limits, PartitionStoreStorage,
                      SupplierServer, delta)
from transfer.frames import ErrorCode, FrameType
from transfer.messages import Base, Demand, Manifest, Range
from transfer_helpers import SECRET, WriteSizes, peer_of


from test_partition_store import _key, stores  # noqa: F401  (stores: the fixture)


def _fill(store, p: int, n: int, tag: bytes = b"v0") -> None:
    for i in range(n):
        store.put(p, _key(i), tag + b"-%d-" % i + b"x" * 200)
    store.checkpoint()


def _fetch(a, b, p: int = 3, **kw):
    srv = SupplierServer(PartitionStoreStorage(a), SECRET, limits=kw.pop("limits", None)).start()
    progress = kw.pop("progress", None)
    try:
        return Demander(PartitionStoreStorage(b), peer_of(srv), SECRET, chunk_size=64 << 10,
                        **kw).fetch(p, progress=progress)
    finally:
        srv.stop()


def test_a_stale_copy_receives_only_the_changed_pages(stores) -> None:
    a, b = stores
    _fill(a, 3, 6000)
    first = _fetch(a, b)
    assert first.mode == "full" and first.pages_sent == 0      # nothing held yet: no base
    for i in range(0, 6000, 600):                             # 10 keys, spread over the file
        a.put(3, _key(i), b"NEW-%d-" % i + b"y" * 200)
    a.checkpoint()
    res = _fetch(a, b)
    assert res.mode == "delta", res
    assert 1 <= res.pages_sent <= 2 * 10 + 1, res               # the pages of 10 keys (+ meta)
    assert res.pages == os.path.getsize(a.partition_path(3)) // 4096
    assert res.bytes_wire <= (res.pages_sent + res.preimages) * 4096
    assert res.bytes_reused == (res.pages - res.pages_sent) * 4096
    assert dict(b.scan(3)) == dict(a.scan(3))
    assert b.counter(3) == a.counter(3) == 6010
    assert pagefile.verify(b.partition_path(3)) == []
    assert open(b.partition_path(3), "rb").read() == open(a.partition_path(3), "rb").read()


def test_delta_under_live_writes_is_exact_at_c(stores) -> None:
    a, b = stores
    _fill(a, 3, 4000)
    _fetch(a, b)
    for i in range(2000, 2400):                 # about a tenth of the pages
        a.put(3, _key(i), b"mid-%d-" % i + b"q" * 200)
    a.checkpoint()
    at_c = dict(a.scan(3))
    wrote = []

    def writer(ev) -> None:
        # overwrite pages (changed and unchanged ones) while the ranges are sent
        if ev.stage in ("accept", "receive") and len(wrote) < 4:
            for i in range(len(wrote) * 1000, len(wrote) * 1000 + 1000, 7):
                a.put(3, _key(i), b"LIVE-%d-" % i + b"z" * 199)
            a.checkpoint()
            wrote.append(1)
    res = _fetch(a, b, limits=Limits(2, rate=4e5), progress=writer)
    assert wrote, "the writer never ran during the transfer"
    assert res.mode == "delta" and res.preimages > 0, res
    assert dict(b.scan(3)) == at_c
    assert dict(a.scan(3)) != at_c
    assert pagefile.verify(b.partition_path(3)) == []


def test_a_copy_too_different_gets_the_whole_file_and_says_why(stores) -> None:
    a, b = stores
    _fill(a, 3, 3000)
    _fetch(a, b)
    _fill(a, 3, 3000, tag=b"changed-everywhere")
    res = _fetch(a, b, delta_limit=300)
    assert res.mode == "full" and "above the delta limit of 30%" in res.delta_refused, res
    assert dict(b.scan(3)) == dict(a.scan(3))


def test_delta_off_sends_the_whole_file(stores) -> None:
    a, b = stores
    _fill(a, 3, 2000)
    _fetch(a, b)
    a.put(3, _key(5), b"changed")
    a.checkpoint()
    res = _fetch(a, b, delta=False)
    assert res.mode == "full" and res.bytes_wire >= res.bytes
    assert dict(b.scan(3)) == dict(a.scan(3))


def test_damaged_base_pages_are_fetched_again(stores) -> None:
    """The base is compared by content: a page of the stale copy damaged on disk
    differs from the supplier's and travels, so the installed file is whole."""
    a, b = stores
    _fill(a, 3, 3000)
    _fetch(a, b)
    with open(b.partition_path(3), "r+b") as f:
        f.seek(5 * 4096 + 100)
        f.write(b"\xff" * 64)                     # rotted bytes in page 5 of the stale copy
    res = _fetch(a, b)
    assert res.mode == "delta" and res.pages_sent == 1, res
    assert pagefile.verify(b.partition_path(3)) == []
    assert dict(b.scan(3)) == dict(a.scan(3))


def test_a_wrong_delta_is_never_installed(stores, monkeypatch) -> None:
    """A supplier that leaves out a changed page (a bug, or a forger without the
    pages) fails the root check: nothing installed, the old copy untouched."""
    a, b = stores
    _fill(a, 3, 3000)
    _fetch(a, b)
    before = open(b.partition_path(3), "rb").read()
    a.put(3, _key(7), b"changed-" + b"w" * 200)
    a.put(3, _key(2500), b"changed-" + b"w" * 200)
    a.checkpoint()
    real = delta.diff_ranges
    monkeypatch.setattr(delta, "diff_ranges", lambda base, mine, **kw: real(base, mine, **kw)[1:])
    with pytest.raises(ChecksumError) as ei:
        _fetch(a, b)
    assert "root digest mismatch" in str(ei.value)
    assert open(b.partition_path(3), "rb").read() == before
    assert not os.path.exists(b.partition_path(3) + ".ferry-tmp")


# -- the frames, refused when malformed ---------------------------------------------------
def test_delta_frames_round_trip_and_refuse_garbage() -> None:
    d = Demand("c", 1, base_pages=70000, base_page_size=4096, delta_limit=250)
    assert Demand.from_body(d.to_body()) == d
    with pytest.raises(FrameError):
        Demand.from_body(d.to_body() | {"held": b"\0" * 12})          # held and a base
    with pytest.raises(FrameError):
        Demand.from_body(d.to_body() | {"base_pages": 1 << 30})       # too many digests
    with pytest.raises(FrameError):
        Demand.from_body(d.to_body() | {"delta_limit": 1001})
    b = Base(0, b"\1" * 32)
    assert Base.from_body(b.to_body()) == b
    for bad in (b"", b"\1" * 15, b"\1" * 16 * ((1 << 15) + 1)):
        with pytest.raises(FrameError):
            Base.from_body({"first": 0, "digests": bad})
    r = Range(5, 3, 123)
    assert Range.from_body(r.to_body()) == r
    with pytest.raises(FrameError):
        Range.from_body({"first": 1, "pages": 0, "sum": 1})
    m = Manifest(9, 4096 * 10, 4096, 10, 1 << 20, delta=True, ranges=2, delta_pages=3, root=b"r" * 16)
    assert Manifest.from_body(m.to_body()) == m
    for change in ({"root": b"short"}, {"delta_pages": 11}, {"ranges": 4}, {"size": 4096 * 10 + 1},
                   {"skip": b"\0\0\0\0"}, {"delta": 1}):
        with pytest.raises(FrameError):
            Manifest.from_body(m.to_body() | change)
    assert FrameType.BASE and FrameType.RANGE and ErrorCode.PROTOCOL


def test_diff_ranges_coalesces_and_cuts() -> None:
    D = delta.DIGEST
    base = b"".join(i.to_bytes(D, "little") for i in range(100))
    mine = bytearray(base)
    for i in (3, 5, 40, 41, 42):
        mine[i * D] ^= 1
    mine += bytes(D * 3)                        # three pages beyond the base
    assert delta.diff_ranges(base, bytes(mine)) == [(3, 3), (40, 3), (100, 3)]
    assert delta.diff_ranges(base, bytes(mine), gap=0) == [(3, 1), (5, 1), (40, 3), (100, 3)]
    assert delta.diff_ranges(base, base) == []
    assert delta.diff_ranges(base, base[:50 * D]) == []        # the source shrank
    big = delta.diff_ranges(b"", bytes(D * 2500), max_pages=1024)
    assert big == [(0, 1024), (1024, 1024), (2048, 452)]


def test_the_base_copy_writes_in_pieces_of_at_most_one_mib(tmp_path) -> None:
    from faults import fileio
    from transfer.delta import copy_base, page_digests
    layer = WriteSizes()
    body = os.urandom(9 * (1 << 20))
    (tmp_path / "src").write_bytes(body)
    src = os.open(tmp_path / "src", os.O_RDONLY)
    dst = os.open(tmp_path / "dst", os.O_RDWR | os.O_CREAT)
    try:
        digests = copy_base(src, dst, 4096, io=layer)
    finally:
        os.close(src)
        os.close(dst)
    assert (tmp_path / "dst").read_bytes() == body and digests == page_digests(body, 4096)
    assert sum(layer.sizes) == len(body) and max(layer.sizes) <= fileio.WRITE_SLICE
