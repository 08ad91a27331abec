from __future__ import annotations

import os
import threading

import pytest

from transfer import (ChecksumError, Demander, DirectoryStorage, RemoteError, SupplierServer,
                      Limits, Priority)
from transfer import frames
from transfer.auth import client_handshake
from transfer.frames import ErrorCode, FrameType
from transfer.transport import connect_tcp

from transfer_helpers import SECRET, Proxy, WriteSizes, disk_filler, peer_of, read, write_part

MB = 1 << 20


def _fetch(srv_peer: str, dst: str, p: int, **kw):
    kw.setdefault("chunk_size", MB)      # small test files still span several chunks
    return Demander(DirectoryStorage(dst), srv_peer, SECRET, timeout=10, **kw).fetch(p)


def _leftovers(d: str) -> list[str]:
    return sorted(f for f in os.listdir(d) if "ferry" in f)


def test_fetch_installs_exact_copy(server, src, dst) -> None:
    data = write_part(src, 7, 5 * MB + 123)
    seen = []
    res = Demander(DirectoryStorage(dst), peer_of(server), SECRET).fetch(7, progress=seen.append)
    assert read(os.path.join(dst, "part-7.bin")) == data
    assert res.verified and res.bytes == len(data) and res.bytes_wire == len(data) and res.bytes_reused == 0
    assert {"handshake", "manifest", "receive", "verify", "install"} <= set(res.stages)
    # the stages follow one another: their times add up to at most the whole fetch
    # (before, "reserve" timed the whole transfer, so the sum was about twice it)
    assert sum(res.stages.values()) <= res.seconds + 1e-3
    assert seen[-1].done == seen[-1].total == len(data)
    assert _leftovers(dst) == []
    s = res.summary()
    assert set(s) == {"partition", "bytes", "bytes_wire", "bytes_reused", "seconds", "mb_per_s", "verified",
                      "mode", "pages", "pages_sent", "delta_refused", "path"}


def test_empty_and_tiny_files_and_other_cache(server, src, dst) -> None:
    write_part(src, 0, 0)
    write_part(os.path.join(src, "users"), 1, 10)
    d = Demander(DirectoryStorage(dst), peer_of(server), SECRET)
    assert d.fetch(0).bytes == 0 and read(os.path.join(dst, "part-0.bin")) == b""
    d.fetch(1, cache="users")
    assert read(os.path.join(dst, "users", "part-1.bin")) == read(os.path.join(src, "users", "part-1.bin"))


def test_many_demanders_at_once(server, src, tmp_path) -> None:
    datas = {p: write_part(src, p, 2 * MB + p) for p in range(6)}
    errors = []

    def one(p: int) -> None:
        try:
            _fetch(peer_of(server), str(tmp_path / f"d{p}"), p)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
    ts = [threading.Thread(target=one, args=(p,)) for p in datas]
    [t.start() for t in ts]
    [t.join(60) for t in ts]
    assert errors == []
    for p, data in datas.items():
        assert read(str(tmp_path / f"d{p}" / f"part-{p}.bin")) == data


def test_demand_for_partition_not_held(server, dst) -> None:
    with pytest.raises(RemoteError, match="NOT_HELD.*part-42.bin does not exist") as ei:
        _fetch(peer_of(server), dst, 42)
    assert ei.value.code == ErrorCode.NOT_HELD and ei.value.stage == "manifest"
    assert os.listdir(dst) == []          # no temp file or record left behind
    assert not os.path.exists(os.path.join(dst, "part-42.bin"))


def _raw_session(srv: SupplierServer):
    conn = connect_tcp(*srv.address)
    client_handshake(conn, SECRET)
    return conn


PATH_TRICKS = [
    ("dotdot cache", {"cache": "../../etc", "partition": 1}),
    ("absolute cache", {"cache": "/etc", "partition": 1}),
    ("NUL in cache", {"cache": "a\0b", "partition": 1}),
    ("dot cache", {"cache": "..", "partition": 1}),
    ("string partition", {"cache": "default", "partition": "../part-1"}),
    ("negative partition", {"cache": "default", "partition": -1}),
    ("huge partition", {"cache": "default", "partition": 2**40}),
]


@pytest.mark.parametrize("name,body", PATH_TRICKS, ids=[t[0] for t in PATH_TRICKS])
def test_path_tricks_refused_and_server_keeps_serving(server, src, dst, tmp_path, name, body) -> None:
    data = write_part(src, 1, 1000)
    (tmp_path / "secret-outside").write_bytes(b"do not serve")
    conn = _raw_session(server)
    frames.write_frame(conn, FrameType.DEMAND, body | {"priority": 1, "chunk_size": MB, "held": b""})
    with pytest.raises(RemoteError) as ei:
        frames.read_frame(conn)
    assert ei.value.code == ErrorCode.BAD_NAME, ei.value
    conn.close()
    _fetch(peer_of(server), dst, 1)
    assert read(os.path.join(dst, "part-1.bin")) == data


def test_demander_refuses_bad_names_locally(dst) -> None:
    from transfer import BadName
    d = Demander(DirectoryStorage(dst), "127.0.0.1:1", SECRET)
    with pytest.raises(BadName):
        d.fetch(1, cache="../x")
    with pytest.raises(BadName):
        d.fetch(-3)


def test_symlink_in_data_dir_not_followed(server, src, dst, tmp_path) -> None:
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"secret data outside the data dir")
    os.symlink(outside, os.path.join(src, "part-5.bin"))
    with pytest.raises(RemoteError) as ei:
        _fetch(peer_of(server), dst, 5)
    assert ei.value.code == ErrorCode.NOT_HELD


BAD_FRAMES = [
    ("garbage", b"GET / HTTP/1.1\r\n\r\n", ErrorCode.PROTOCOL),
    ("wrong version", b"FY\x07\x0a" + b"\0" * 8, ErrorCode.VERSION),
    ("version 1 peer", b"FY\x01\x0a" + b"\0" * 8, ErrorCode.VERSION),
    ("unknown type", frames.encode(FrameType.END)[:3] + b"\xc8" + frames.encode(FrameType.END)[4:], ErrorCode.UNKNOWN_TYPE),
    ("oversized", b"FY" + bytes([frames.PROTOCOL_VERSION]) + b"\x0a" + (frames.MAX_PAYLOAD + 1).to_bytes(4, "little") + b"\0" * 4, ErrorCode.TOO_LARGE),
    ("bad checksum", frames.encode(FrameType.DEMAND, {"x": 1})[:-1] + b"\x00", ErrorCode.PROTOCOL),
    ("wrong frame type", frames.encode(FrameType.APPLIED, {}), ErrorCode.PROTOCOL),
    ("malformed demand", frames.encode(FrameType.DEMAND, {"cache": "default", "partition": 1}), ErrorCode.PROTOCOL),
]


@pytest.mark.parametrize("name,raw,code", BAD_FRAMES, ids=[b[0] for b in BAD_FRAMES])
def test_bad_frames_get_error_frame_and_server_keeps_serving(server, src, dst, name, raw, code) -> None:
    data = write_part(src, 2, 3000)
    conn = _raw_session(server)
    frames.send_frame(conn, raw)          # sent by an authenticated peer: sealed
    with pytest.raises(RemoteError) as ei:
        frames.read_frame(conn)
    assert ei.value.code == code, ei.value
    conn.close()
    _fetch(peer_of(server), dst, 2)
    assert read(os.path.join(dst, "part-2.bin")) == data


def test_peer_stopping_mid_frame(server, src, dst) -> None:
    data = write_part(src, 3, 3000)
    conn = _raw_session(server)
    full = frames.encode(FrameType.DEMAND, {"cache": "default", "partition": 3, "priority": 1,
                                            "chunk_size": MB, "held": b""})
    conn.send(full[:len(full) - 5])
    conn.close()
    # and a peer that stops mid-handshake
    c2 = connect_tcp(*server.address)
    c2.send(frames.encode(FrameType.HELLO, {"nonce": b"x" * 32, "role": "t"})[:7])
    c2.close()
    _fetch(peer_of(server), dst, 3)
    assert read(os.path.join(dst, "part-3.bin")) == data


MARKER = b"<<ferry-corrupt-me>>"


def _file_with_marker(src: str, p: int, size: int, at: int) -> bytes:
    data = bytearray(write_part(src, p, size))
    data[at:at + len(MARKER)] = MARKER
    with open(os.path.join(src, f"part-{p}.bin"), "wb") as f:
        f.write(data)
    return bytes(data)


def test_corrupted_chunk_on_wire_is_rerequested(server, src, dst) -> None:
    data = _file_with_marker(src, 4, 3 * MB, MB + 5000)
    hits = []

    def once(buf: bytes) -> bytes:
        if MARKER in buf and not hits:
            hits.append(1)
            return buf.replace(MARKER, b"X" * len(MARKER))
        return buf
    proxy = Proxy(server.address, mangle=once, hold=len(MARKER))
    res = _fetch(proxy.peer, dst, 4)
    assert hits and res.resent_chunks == 1
    assert read(os.path.join(dst, "part-4.bin")) == data


def test_always_corrupted_chunk_fails_clearly_blaming_the_wire(server, src, dst) -> None:
    _file_with_marker(src, 4, 3 * MB, MB + 5000)
    proxy = Proxy(server.address, mangle=lambda b: b.replace(MARKER, b"Y" * len(MARKER)), hold=len(MARKER))
    with pytest.raises(ChecksumError, match="on the wire") as ei:
        _fetch(proxy.peer, dst, 4, max_resends=2)
    assert ei.value.culprit == "wire" and ei.value.stage == "verify"
    assert not os.path.exists(os.path.join(dst, "part-4.bin"))
    # the good chunks were kept for resume: a clean path then sends only the bad one
    res = _fetch(peer_of(server), dst, 4)
    assert res.bytes_wire == MB and res.bytes_reused == 2 * MB


def test_file_changing_at_source_is_blamed_on_the_source(server, src, dst) -> None:
    data = write_part(src, 6, 4 * MB)
    path = os.path.join(src, "part-6.bin")

    def scribble(ev) -> None:
        if ev.stage == "accept":      # after the manifest, before the data
            with open(path, "r+b") as f:
                f.seek(3 * MB)
                f.write(b"changed!")
    with pytest.raises(ChecksumError, match="changed during the transfer") as ei:
        Demander(DirectoryStorage(dst), peer_of(server), SECRET, chunk_size=MB).fetch(6, progress=scribble)
    assert ei.value.culprit == "source"
    assert not os.path.exists(os.path.join(dst, "part-6.bin"))
    res = _fetch(peer_of(server), dst, 6)        # a new snapshot: at most the changed chunk travels
    assert res.bytes_wire <= MB and res.bytes_reused >= 3 * MB
    assert read(os.path.join(dst, "part-6.bin")) == read(path) != data


def test_disconnect_then_resume_sends_only_missing(server, src, dst) -> None:
    data = write_part(src, 8, 8 * MB)
    proxy = Proxy(server.address, cut_after=4 * MB + 1000)
    from transfer import PeerClosed
    with pytest.raises(PeerClosed):
        _fetch(proxy.peer, dst, 8)
    assert not os.path.exists(os.path.join(dst, "part-8.bin"))
    assert _leftovers(dst) == ["part-8.bin.ferry-resume", "part-8.bin.ferry-tmp"]
    res = _fetch(peer_of(server), dst, 8)
    assert res.bytes_reused >= 3 * MB and res.bytes_wire <= 5 * MB
    assert read(os.path.join(dst, "part-8.bin")) == data
    assert _leftovers(dst) == []


def test_free_disk_checked_before_accepting(server, src, dst) -> None:
    from transfer import OutOfDiskError
    write_part(src, 9, MB)
    st = os.statvfs(dst)
    with pytest.raises(OutOfDiskError, match="only .* bytes free") as ei:
        # a margin far above what is free: other processes may free space meanwhile
        _fetch(peer_of(server), dst, 9, margin=st.f_bavail * st.f_frsize + (1 << 40))
    assert ei.value.stage == "accept"
    assert not os.path.exists(os.path.join(dst, "part-9.bin"))
    import time
    deadline = time.monotonic() + 10     # the supplier logs the refusal on its own thread
    while server.stats.transfers_failed < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.stats.transfers_failed == 1


def test_disk_filling_mid_transfer(server, src, tmpfs) -> None:
    from transfer import OutOfDiskError
    data = write_part(src, 10, 4 * MB)
    filler = os.path.join(tmpfs, "filler")
    fill = disk_filler(tmpfs, after=MB, size=5 * MB)   # another writer takes the space
    # received at 4 MB/s, so the filler lands while chunks are still arriving
    d = Demander(DirectoryStorage(tmpfs), peer_of(server), SECRET, margin=0, sync_bytes=MB,
                 limits=Limits(1, 4 * MB), chunk_size=MB)
    with pytest.raises(OutOfDiskError, match="out of disk space") as ei:
        d.fetch(10, progress=fill)
    assert ei.value.stage == "receive"
    assert not os.path.exists(os.path.join(tmpfs, "part-10.bin"))
    os.unlink(filler)
    res = d.fetch(10)     # after space is freed it resumes and completes
    assert read(os.path.join(tmpfs, "part-10.bin")) == data and res.bytes_reused > 0
    # the server kept serving
    import time
    deadline = time.monotonic() + 10
    while server.stats.transfers_ok < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.stats.transfers_ok == 1


def test_limits_change_while_running(server, src, dst) -> None:
    write_part(src, 11, 2 * MB)
    server.limits.set_rate(4 * MB)
    server.limits.set_max_transfers(1)
    res = _fetch(peer_of(server), dst, 11)
    assert res.verified
    server.limits.set_rate(None)
    assert server.limits.bucket.rate is None and server.limits.slots.limit == 1


def test_priority_order_of_waiters() -> None:
    lim = Limits(max_transfers=1)
    order: list[str] = []
    gate = threading.Event()

    def holder() -> None:
        with lim.slots.acquire(Priority.REBALANCE):
            gate.wait(5)

    def waiter(name: str, prio: int) -> None:
        with lim.slots.acquire(prio):
            order.append(name)
    h = threading.Thread(target=holder)
    h.start()
    while lim.slots.held == 0:
        pass
    ws = [threading.Thread(target=waiter, args=("rebalance", Priority.REBALANCE)),
          threading.Thread(target=waiter, args=("background", Priority.BACKGROUND))]
    for w in ws:
        w.start()
    while len(lim.slots._waiting) < 2:
        pass
    r = threading.Thread(target=waiter, args=("recovery", Priority.RECOVERY))
    r.start()
    while len(lim.slots._waiting) < 3:
        pass
    gate.set()
    for t in [h, r, *ws]:
        t.join(5)
    assert order == ["recovery", "rebalance", "background"]


def test_queued_demander_gets_keepalives(src, dst) -> None:
    write_part(src, 12, MB)
    lim = Limits(max_transfers=1)
    srv = SupplierServer(DirectoryStorage(src), SECRET, limits=lim).start()
    stages = []
    try:
        with lim.slots.acquire(Priority.RECOVERY):
            t = threading.Thread(target=lambda: Demander(DirectoryStorage(dst), peer_of(srv), SECRET)
                                 .fetch(12, progress=lambda e: stages.append(e.stage)))
            t.start()
            import time
            deadline = time.monotonic() + 10
            while "queued" not in stages and time.monotonic() < deadline:
                time.sleep(0.05)
        t.join(10)
    finally:
        srv.stop()
    assert "queued" in stages and os.path.exists(os.path.join(dst, "part-12.bin"))


def test_rate_parse() -> None:
    from transfer import parse_rate
    assert parse_rate("200MB") == 200e6 and parse_rate("1.5GiB/s") == 1.5 * 2**30 and parse_rate("100") == 100
    with pytest.raises(ValueError):
        parse_rate("fast")


def test_frames_changed_or_injected_after_the_handshake_are_refused(server, src, dst) -> None:
    """After the handshake every frame carries a MAC under the session key: a frame
    sent without it (injected by someone on the path) or changed in flight is refused
    with ERROR AUTH, and the server goes on serving (replay and reordering:
    test_frames.py)."""
    data = write_part(src, 4, 3000)
    good = frames.encode(FrameType.DEMAND, {"cache": "default", "partition": 4, "priority": 1,
                                            "chunk_size": MB, "held": b""})
    # injected: the right framing and checksum, no valid tag
    conn = _raw_session(server)
    conn.send(good + b"\0" * frames.TAG_SIZE)
    with pytest.raises(RemoteError) as ei:
        frames.read_frame(conn)
    assert ei.value.code == ErrorCode.AUTH, ei.value
    conn.close()
    # changed in flight: a valid sealed frame with one payload byte flipped (CRC fixed up)
    conn = _raw_session(server)
    assert conn.sealer is not None
    tag = conn.sealer.tag(good)
    evil = frames.encode(FrameType.DEMAND, {"cache": "default", "partition": 5, "priority": 1,
                                            "chunk_size": MB, "held": b""})
    conn.send(evil + tag)
    with pytest.raises(RemoteError) as ei:
        frames.read_frame(conn)
    assert ei.value.code == ErrorCode.AUTH, ei.value
    conn.close()
    _fetch(peer_of(server), dst, 4)
    assert read(os.path.join(dst, "part-4.bin")) == data


def test_a_one_chunk_fetch_starts_no_helper_threads(server, src, dst, monkeypatch) -> None:
    """Most partitions of a large cluster are one chunk: their fetch hashes and writes
    in the threads already there (no hash-ahead thread on the supplier, no sink thread
    on the demander); a fetch of several chunks still overlaps them."""
    started: list[str] = []
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        started.append(self.name)
        real_start(self)
    monkeypatch.setattr(threading.Thread, "start", start)
    small = write_part(src, 3, 300 * 1024)
    big = write_part(src, 4, 3 * MB + 1)
    assert _fetch(peer_of(server), dst, 3).verified and read(os.path.join(dst, "part-3.bin")) == small
    assert not {"ferry-chunk-sink", "ferry-hash-ahead"} & set(started)
    assert _fetch(peer_of(server), dst, 4).verified and read(os.path.join(dst, "part-4.bin")) == big
    assert {"ferry-chunk-sink", "ferry-hash-ahead"} <= set(started)


def test_received_bytes_reach_the_file_in_writes_of_at_most_one_mib(server, src, dst) -> None:
    """A 4 MiB chunk goes into the page cache as four 1 MiB writes (fileio.WRITE_SLICE:
    a write of 2 MiB or more can take a 2 MiB folio, 12x the CPU on a VM that reports
    free memory to its host)."""
    from faults import fileio
    data = write_part(src, 5, 9 * MB + 7)
    with fileio.use(WriteSizes()) as layer:
        res = _fetch(peer_of(server), dst, 5, chunk_size=4 * MB, splice=False)
    sizes = layer.sizes
    assert res.verified and read(os.path.join(dst, "part-5.bin")) == data
    assert sum(sizes) >= len(data) and max(sizes) <= fileio.WRITE_SLICE == MB
