"""Protocol version 2: chunk checksums travel in CHUNK frames, the MANIFEST lists the
offered chunks the supplier confirmed (``skip``). Resume, blame and the checks a
demander makes on a supplier that breaks these rules."""
from __future__ import annotations

import os
import socket
import threading
from typing import Callable

import pytest
import xxhash

from transfer import datamac

from transfer import ChecksumError, Demander, DirectoryStorage, FrameError
from transfer.auth import server_handshake
from transfer.frames import FrameType, read_frame, write_frame
from transfer.messages import Chunk, Demand, End, Manifest
from transfer.resume import Receiving
from transfer.transport import SocketConn
from transfer.errors import PeerClosed, RemoteError
from transfer_helpers import SECRET, Proxy, peer_of, read, write_part

MB = 1 << 20


def _fetch(peer: str, dst: str, p: int, progress=None, **kw):
    kw.setdefault("chunk_size", MB)
    return Demander(DirectoryStorage(dst), peer, SECRET, timeout=10, **kw).fetch(p, progress=progress)


def test_manifest_and_chunk_round_trip() -> None:
    m = Manifest(7, 5 * MB + 3, 4096, 1281, MB, frozenset({0, 4}))
    back = Manifest.from_body(m.to_body())
    assert back == m and back.chunk_count == 6 and back.chunk_span(5) == (5 * MB, 3)
    c = Chunk(3, MB, 2**64 - 1)
    assert Chunk.from_body(c.to_body()) == c


@pytest.mark.parametrize("body,why", [
    ({"skip": b"\x01\x00\x00"}, "malformed"),
    ({"skip": (9).to_bytes(4, "little")}, "beyond"),
    ({"size": (1 << 40)}, "exceeds the maximum"),
    ({"algo": "md5"}, "algorithm"),
])
def test_bad_manifests_are_refused(body, why) -> None:
    good = Manifest(1, 3 * MB, 4096, 768, MB).to_body()
    with pytest.raises(FrameError, match=why):
        Manifest.from_body(good | body)


def test_chunk_without_checksum_is_refused() -> None:
    with pytest.raises(FrameError, match="sum"):
        Chunk.from_body({"index": 0, "length": 10})


def test_resume_after_a_held_chunk_changed_at_the_source(server, src, dst) -> None:
    """The supplier hashes only the chunks the demander offers; an offered chunk that
    changed since is not skipped but sent again, with its new checksum."""
    write_part(src, 1, 6 * MB)
    with pytest.raises(Exception):  # noqa: B017 - any failure of the cut transfer
        _fetch(Proxy(server.address, cut_after=4 * MB + 100).peer, dst, 1, sync_bytes=MB)
    path = os.path.join(src, "part-1.bin")
    with open(path, "r+b") as f:          # chunk 1 (held by the demander) changes
        f.seek(MB + 10)
        f.write(b"new bytes")
    res = _fetch(peer_of(server), dst, 1)
    assert read(os.path.join(dst, "part-1.bin")) == read(path)
    assert res.bytes_reused >= 2 * MB and res.bytes_reused % MB == 0
    assert res.bytes_wire == 6 * MB - res.bytes_reused
    assert res.bytes_wire >= 3 * MB        # at least chunk 1 and the unreceived tail


def test_bad_chunk_is_rerequested_with_its_announced_checksum(server, src, dst) -> None:
    """The wire corrupts a chunk once: the demander re-requests it, the supplier checks
    its source against the checksum it announced in the CHUNK frame and sends it again."""
    marker = b"<<v2-corrupt-me>>"
    data = bytearray(write_part(src, 2, 3 * MB))
    data[2 * MB + 7:2 * MB + 7 + len(marker)] = marker
    with open(os.path.join(src, "part-2.bin"), "wb") as f:
        f.write(data)
    hits: list[int] = []

    def once(buf: bytes) -> bytes:
        if marker in buf and not hits:
            hits.append(1)
            return buf.replace(marker, b"#" * len(marker))
        return buf
    res = _fetch(Proxy(server.address, mangle=once, hold=len(marker)).peer, dst, 2)
    assert hits and res.resent_chunks == 1 and res.bytes_wire == 4 * MB
    assert read(os.path.join(dst, "part-2.bin")) == bytes(data)


def test_source_changing_mid_send_is_blamed_on_the_source(server, src, dst) -> None:
    """A plain file written while it is sent (after its chunk was hashed or not) is
    refused as SOURCE_CHANGED: a copy mixing versions must not verify."""
    write_part(src, 3, 8 * MB)
    path = os.path.join(src, "part-3.bin")

    def scribble(ev) -> None:
        if ev.stage == "receive" and ev.wire >= MB and not scribble.done:
            scribble.done = True
            with open(path, "r+b") as f:
                f.seek(0)                 # a chunk already sent
                f.write(b"late write")
    scribble.done = False
    from transfer import Limits
    with pytest.raises(ChecksumError, match="changed during the transfer") as ei:
        _fetch(peer_of(server), dst, 3, progress=scribble, limits=Limits(1, 8 * MB))
    assert ei.value.culprit == "source" and ei.value.stage == "receive"
    assert not os.path.exists(os.path.join(dst, "part-3.bin"))
    res = _fetch(peer_of(server), dst, 3)          # a new snapshot: chunk 0 travels again
    assert read(os.path.join(dst, "part-3.bin")) == read(path)
    assert res.bytes_wire >= MB


# -- a supplier that breaks the version 2 rules ---------------------------------------
def _fake_supplier(script: Callable[[SocketConn, Demand], None]) -> tuple[str, threading.Thread]:
    srv = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        c, _ = srv.accept()
        conn = SocketConn(c, "demander")
        conn.set_timeout(10)
        try:
            server_handshake(conn, SECRET)
            demand = Demand.from_body(read_frame(conn, expect=[FrameType.DEMAND]).body)
            script(conn, demand)
            try:
                read_frame(conn)       # the demander's ERROR
            except Exception:
                pass
        finally:
            conn.close()
            srv.close()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return "%s:%s" % srv.getsockname()[:2], t


def _data(n: int) -> bytes:
    return bytes(range(256)) * (n // 256)


def _mac(conn: SocketConn, d: Demand, counter: int, offset: int, data: bytes) -> bytes:
    """What a real supplier puts in a CHUNK frame of a sealed session (transfer.datamac)."""
    key = datamac.key_for(conn.sealer, True, d.cache, d.partition, counter)
    assert key is not None
    return datamac.tag(key(offset), data)


def test_manifest_skipping_a_chunk_not_offered_is_a_protocol_error(dst) -> None:
    def script(conn: SocketConn, d: Demand) -> None:
        write_frame(conn, FrameType.MANIFEST, Manifest(1, 2 * MB, 4096, 512, MB, frozenset({1})).to_body())
    peer, t = _fake_supplier(script)
    with pytest.raises(FrameError, match="did not offer"):
        _fetch(peer, dst, 0)
    t.join(10)
    assert not os.path.exists(os.path.join(dst, "part-0.bin"))


def test_end_without_every_chunk_is_a_protocol_error(dst) -> None:
    def script(conn: SocketConn, d: Demand) -> None:
        write_frame(conn, FrameType.MANIFEST, Manifest(1, 2 * MB, 4096, 512, MB).to_body())
        read_frame(conn, expect=[FrameType.ACCEPT])
        data = _data(MB)
        write_frame(conn, FrameType.CHUNK, Chunk(0, MB, xxhash.xxh3_64_intdigest(data),
                                                 _mac(conn, d, 1, 0, data)).to_body())
        conn.send(data)                  # chunk 1 never comes (no RECEIVED expected either)
        write_frame(conn, FrameType.END, End(1, MB, 0).to_body())
    peer, t = _fake_supplier(script)
    with pytest.raises(FrameError, match="without sending chunk 1"):
        _fetch(peer, dst, 0)
    t.join(10)
    assert not os.path.exists(os.path.join(dst, "part-0.bin"))


def test_resent_chunk_with_another_checksum_is_a_protocol_error(dst) -> None:
    """A supplier whose re-sent chunk claims a different checksum than the first time
    cannot be believed: the demander stops instead of verifying against a moving target."""
    def script(conn: SocketConn, d: Demand) -> None:
        write_frame(conn, FrameType.MANIFEST, Manifest(1, MB, 4096, 256, MB).to_body())
        read_frame(conn, expect=[FrameType.ACCEPT])
        data = _data(MB)
        write_frame(conn, FrameType.CHUNK, Chunk(0, MB, 12345, _mac(conn, d, 1, 0, data)).to_body())   # wrong checksum
        conn.send(data)
        read_frame(conn, expect=[FrameType.RECEIVED])
        write_frame(conn, FrameType.END, End(1, MB, 0).to_body())
        read_frame(conn, expect=[FrameType.RESEND])
        write_frame(conn, FrameType.CHUNK, Chunk(0, MB, xxhash.xxh3_64_intdigest(data),
                                                 _mac(conn, d, 1, 0, data)).to_body())
        try:
            conn.send(data)
            write_frame(conn, FrameType.END, End(1, MB, 0).to_body())
        except PeerClosed:
            pass        # the demander may stop at the CHUNK frame, before its bytes
    peer, t = _fake_supplier(script)
    with pytest.raises(FrameError, match="changed its checksum"):
        _fetch(peer, dst, 0)
    t.join(10)
    assert not os.path.exists(os.path.join(dst, "part-0.bin"))


def test_peer_closed_is_seen_before_its_last_bytes_are_read() -> None:
    """The demander must not acknowledge into a dead supplier: that send draws a RST,
    and the RST drops the chunks still queued for it (which resume could reuse)."""
    import time
    srv = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(srv.getsockname())
    s, _ = srv.accept()
    conn = SocketConn(c, "supplier")
    assert not conn.peer_closed()
    s.sendall(b"x" * 100_000)
    s.close()
    deadline = time.monotonic() + 5
    while not conn.peer_closed() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert conn.peer_closed()
    got = bytearray(100_000)
    conn.recv_fill(memoryview(got))        # every byte sent before the close is still there
    assert bytes(got) == b"x" * 100_000
    conn.close()
    srv.close()


def test_chunk_data_whose_checksum_matches_but_not_its_mac_is_never_installed(dst) -> None:
    """The checksum in a CHUNK frame (xxh3) is no cryptographic hash: data forged on the
    path to match it must still fail the chunk's MAC (Poly1305 under a key of the
    session), so nothing is installed (the demander asks again, then gives up)."""
    gave_up: list[RemoteError] = []

    def script(conn: SocketConn, d: Demand) -> None:
        write_frame(conn, FrameType.MANIFEST, Manifest(1, MB, 4096, 256, MB).to_body())
        read_frame(conn, expect=[FrameType.ACCEPT])
        real, forged = _data(MB), b"\xee" * MB
        chunk = Chunk(0, MB, xxhash.xxh3_64_intdigest(forged), _mac(conn, d, 1, 0, real))
        write_frame(conn, FrameType.CHUNK, chunk.to_body())
        conn.send(forged)
        read_frame(conn, expect=[FrameType.RECEIVED])
        write_frame(conn, FrameType.END, End(1, MB, 0).to_body())
        for _ in range(8):                     # each re-request gets the forgery again
            try:
                fr = read_frame(conn, expect=[FrameType.RESEND])
            except RemoteError as e:           # the demander gave up: its ERROR frame
                gave_up.append(e)
                return
            assert fr.body["chunks"] == [0]
            write_frame(conn, FrameType.CHUNK, chunk.to_body())
            conn.send(forged)
            write_frame(conn, FrameType.END, End(1, MB, 0).to_body())
    peer, t = _fake_supplier(script)
    with pytest.raises(ChecksumError):
        _fetch(peer, dst, 0)
    t.join(10)
    assert gave_up and "CHECKSUM" in str(gave_up[0])     # said to the supplier, once
    assert not os.path.exists(os.path.join(dst, "part-0.bin"))


@pytest.mark.parametrize("use_splice", [False, True], ids=["one-pass", "splice"])
def test_forged_chunk_data_fails_its_mac_on_every_receive_path(dst, use_splice: bool) -> None:
    """Data forged to match the chunk's xxh3 fails its MAC whether the demander checks
    the chunk in its receive buffer (the default) or hashes it back from the temp file
    after a splice; the good chunk next to it is kept for resume, the forged one never."""
    gave_up: list[RemoteError] = []

    def script(conn: SocketConn, d: Demand) -> None:
        write_frame(conn, FrameType.MANIFEST, Manifest(1, 2 * MB, 4096, 512, MB).to_body())
        read_frame(conn, expect=[FrameType.ACCEPT])
        good, real, forged = _data(MB), _data(MB)[::-1], b"\xee" * MB
        write_frame(conn, FrameType.CHUNK, Chunk(0, MB, xxhash.xxh3_64_intdigest(good),
                                                 _mac(conn, d, 1, 0, good)).to_body())
        conn.send(good)
        bad = Chunk(1, MB, xxhash.xxh3_64_intdigest(forged), _mac(conn, d, 1, MB, real))
        write_frame(conn, FrameType.CHUNK, bad.to_body())
        conn.send(forged)
        read_frame(conn, expect=[FrameType.RECEIVED])
        write_frame(conn, FrameType.END, End(2, 2 * MB, 0).to_body())
        for _ in range(8):
            try:
                fr = read_frame(conn, expect=[FrameType.RESEND])
            except RemoteError as e:
                gave_up.append(e)
                return
            assert fr.body["chunks"] == [1]
            write_frame(conn, FrameType.CHUNK, bad.to_body())
            conn.send(forged)
            write_frame(conn, FrameType.END, End(1, MB, 0).to_body())
    peer, t = _fake_supplier(script)
    with pytest.raises(ChecksumError):
        _fetch(peer, dst, 0, max_resends=1, splice=use_splice)
    t.join(10)
    assert gave_up and "CHECKSUM" in str(gave_up[0])
    assert not os.path.exists(os.path.join(dst, "part-0.bin"))
    rec = Receiving(os.path.join(dst, "part-0.bin"), MB)
    held = dict(rec.held)
    rec.close()
    assert sorted(held) == [0]
