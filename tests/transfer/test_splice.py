"""The zero-copy receive path (socket -> pipe -> file by splice) and its fallback
(recv_into + pwrite): both install exact copies, re-request corrupted chunks, never
install a bad one, and turn a full disk into a clear error with nothing installed."""
from __future__ import annotations

import os
import socket
import threading

import pytest

from faults import fileio
from transfer import ChecksumError, Demander, DirectoryStorage, Limits, OutOfDiskError, PeerClosed
from transfer import receive as receive_mod
from transfer import splice
from transfer.pipeline import ChunkSink
from transfer.resume import checksum

from transfer_helpers import SECRET, Proxy, disk_filler, peer_of, read, write_part

MB = 1 << 20
MARKER = b"\xde\xad\xbe\xef-corrupt-me-here"
linux_only = pytest.mark.skipif(not splice.available(), reason="os.splice needs Linux and Python 3.10+")
BOTH = pytest.mark.parametrize("use_splice", [pytest.param(True, marks=linux_only), False],
                               ids=["splice", "copy"])


def _demander(peer: str, dst: str, use_splice: bool, **kw) -> Demander:
    kw.setdefault("chunk_size", MB)
    return Demander(DirectoryStorage(dst), peer, SECRET, timeout=10, splice=use_splice, **kw)


class _CountingSplice(splice.SpliceReceiver):
    calls = 0

    def receive(self, *a, **kw) -> None:
        type(self).calls += 1
        super().receive(*a, **kw)


@pytest.fixture
def counted(monkeypatch) -> type[_CountingSplice]:
    _CountingSplice.calls = 0
    monkeypatch.setattr(receive_mod, "SpliceReceiver", _CountingSplice)
    return _CountingSplice


@BOTH
def test_both_paths_install_exact_copy(server, src, dst, use_splice, counted) -> None:
    data = write_part(src, 1, 5 * MB + 123)
    res = _demander(peer_of(server), dst, use_splice).fetch(1)
    assert read(os.path.join(dst, "part-1.bin")) == data
    assert res.spliced is use_splice and (counted.calls > 0) is use_splice
    assert res.bytes_wire == len(data) and sorted(os.listdir(dst)) == ["part-1.bin"]


@BOTH
def test_rate_limited_receive_on_both_paths(server, src, dst, use_splice) -> None:
    data = write_part(src, 2, 3 * MB)
    res = _demander(peer_of(server), dst, use_splice, limits=Limits(1, 40 * MB)).fetch(2)
    assert read(os.path.join(dst, "part-2.bin")) == data and res.spliced is use_splice


def _with_marker(src: str, p: int, size: int, at: int) -> bytes:
    data = bytearray(write_part(src, p, size))
    data[at:at + len(MARKER)] = MARKER
    with open(os.path.join(src, f"part-{p}.bin"), "wb") as f:
        f.write(data)
    return bytes(data)


@BOTH
def test_corrupted_chunk_is_rerequested_on_both_paths(server, src, dst, use_splice) -> None:
    data = _with_marker(src, 3, 3 * MB, MB + 5000)
    hits: list[int] = []

    def once(buf: bytes) -> bytes:
        if MARKER in buf and not hits:
            hits.append(1)
            return buf.replace(MARKER, b"X" * len(MARKER))
        return buf
    proxy = Proxy(server.address, mangle=once, hold=len(MARKER))
    res = _demander(proxy.peer, dst, use_splice).fetch(3)
    assert hits and res.resent_chunks == 1 and res.spliced is use_splice
    assert read(os.path.join(dst, "part-3.bin")) == data


@BOTH
def test_always_corrupted_chunk_is_never_installed(server, src, dst, use_splice) -> None:
    _with_marker(src, 4, 3 * MB, 2 * MB + 77)
    proxy = Proxy(server.address, mangle=lambda b: b.replace(MARKER, b"Y" * len(MARKER)), hold=len(MARKER))
    with pytest.raises(ChecksumError, match="on the wire") as ei:
        _demander(proxy.peer, dst, use_splice, max_resends=1).fetch(4)
    assert ei.value.culprit == "wire"
    assert not os.path.exists(os.path.join(dst, "part-4.bin"))
    # the two good chunks were recorded, the bad one was not: only it travels again
    res = _demander(peer_of(server), dst, use_splice).fetch(4)
    assert res.bytes_wire == MB and res.bytes_reused == 2 * MB


@BOTH
def test_disk_full_mid_transfer_on_both_paths(server, src, tmpfs, use_splice, counted) -> None:
    data = write_part(src, 5, 4 * MB)
    filler = os.path.join(tmpfs, "filler")
    fill = disk_filler(tmpfs, after=MB, size=5 * MB)   # another writer takes the space
    d = _demander(peer_of(server), tmpfs, use_splice, margin=0, sync_bytes=MB, limits=Limits(1, 4 * MB))
    with pytest.raises(OutOfDiskError, match="out of disk space") as ei:
        d.fetch(5, progress=fill)
    assert ei.value.stage == "receive" and (counted.calls > 0) is use_splice
    assert not os.path.exists(os.path.join(tmpfs, "part-5.bin"))
    os.unlink(filler)
    res = d.fetch(5)
    assert read(os.path.join(tmpfs, "part-5.bin")) == data and res.bytes_reused > 0


class _Recording(fileio.FileLayer):
    def __init__(self) -> None:
        self.written = 0

    def pwrite(self, fd: int, data, offset: int) -> int:
        self.written += len(data)
        return super().pwrite(fd, data, offset)


def test_swapped_file_layer_sees_every_write(server, src, dst) -> None:
    """The crash harness swaps the file layer: it must see the data writes, so the
    demander takes the copying path under any layer but the real one."""
    data = write_part(src, 6, 3 * MB)
    with fileio.use(_Recording()) as layer:
        res = _demander(peer_of(server), dst, True).fetch(6)
    assert not res.spliced and layer.written >= len(data)
    assert read(os.path.join(dst, "part-6.bin")) == data


# -- the SpliceReceiver and the hash-from-file sink on their own ---------------------
@linux_only
def test_splice_receiver_moves_exact_bytes_and_reports_a_closed_or_silent_peer(tmp_path) -> None:
    a, b = socket.socketpair()
    payload = os.urandom(3 * MB + 17)
    t = threading.Thread(target=lambda: (a.sendall(payload + b"tail"), a.shutdown(socket.SHUT_WR)))
    t.start()
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    b.settimeout(5)
    r = splice.SpliceReceiver(b.fileno(), 0.5, "pair")
    try:
        assert r.pipe_size >= 64 << 10
        r.receive(fd, 100, len(payload), lambda e, n: e)
        assert os.pread(fd, len(payload) + 1, 100) == payload     # nothing past the chunk
        with pytest.raises(PeerClosed, match="closed by pair"):
            r.receive(fd, 0, 10, lambda e, n: e)                    # 4 bytes, then EOF
        t.join()
        c, d = socket.socketpair()
        d.settimeout(5)
        r2 = splice.SpliceReceiver(d.fileno(), 0.2, "quiet")
        with pytest.raises(PeerClosed, match="timed out waiting for quiet"):
            r2.receive(fd, 0, 10, lambda e, n: e)
        r2.close()
        c.close(), d.close()
    finally:
        r.close()
        os.close(fd)
        a.close(), b.close()


def test_sink_hashes_what_is_in_the_file(tmp_path) -> None:
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    good, bad = os.urandom(MB), os.urandom(MB)
    os.pwrite(fd, good, 0)
    os.pwrite(fd, bad, MB)
    seen: list[tuple[int, bool]] = []
    sink = ChunkSink(MB, lambda o, d: None, lambda i, n, s, ok: seen.append((i, ok)), in_file=fd)
    try:
        for i, expected in ((0, checksum(good)), (1, checksum(good)), (2, checksum(good))):
            sink.put(sink.buffer(), i, i * MB, MB, expected)   # chunk 2 lies past the end
        # chunks at any offset, short or spanning the written bytes
        sink.put(sink.buffer(), 3, 100, 5000, checksum(good[100:5100]))
        sink.put(sink.buffer(), 4, MB - 10, 5000, checksum(good[-10:] + good[:4990]))
        sink.drain()
    finally:
        sink.close()
        os.close(fd)
    assert seen == [(0, True), (1, False), (2, False), (3, True), (4, False)]


def test_a_sink_without_a_thread_checks_the_same_and_raises_the_first_error(tmp_path) -> None:
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    good = os.urandom(MB)
    os.pwrite(fd, good, 0)
    seen: list[tuple[int, bool]] = []
    before = {t.name for t in threading.enumerate()}
    sink = ChunkSink(MB, lambda o, d: None, lambda i, n, s, ok: seen.append((i, ok)), in_file=fd,
                     threaded=False)
    try:
        assert "ferry-chunk-sink" not in {t.name for t in threading.enumerate()} - before
        sink.put(sink.buffer(), 0, 0, MB, checksum(good))
        assert seen == [(0, True)]                       # done before put returned
        sink.put(sink.buffer(), 1, 0, MB, checksum(good) ^ 1)
        sink.drain()
        assert seen == [(0, True), (1, False)]
    finally:
        sink.close()
        os.close(fd)

    def full(o: int, d: memoryview) -> None:
        raise OSError(28, "No space left on device")
    sink = ChunkSink(MB, full, lambda i, n, s, ok: None, threaded=False)
    buf = sink.buffer()
    buf[:4] = b"abcd"
    sink.put(buf, 0, 0, 4, checksum(b"abcd"))
    with pytest.raises(OSError, match="No space"):
        sink.drain()
    sink.close()
