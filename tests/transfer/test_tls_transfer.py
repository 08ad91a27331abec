"""File transfers over mutual TLS: real supplier and demander on loopback, real
certificates made by node.certs (the ``cryptography`` package) in the test's folder."""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time

import pytest
from click.testing import CliRunner

from node.certs import init_ca, issue
from transfer import Demander, DirectoryStorage, Limits, SupplierServer
from transfer.cli import transfer
from transfer.errors import TransferError
from transfer.tls import (PATH_TLS_USERSPACE, TlsContexts, TlsError, TlsFiles, file_identity,
                          identity_of, ktls_available)

from transfer_helpers import Proxy, peer_of, read, write_part

MB = 1 << 20


def make_ca(root, name: str = "ca") -> str:
    d = os.path.join(str(root), name)
    init_ca(d, name=f"test-{name}")
    return d


def node_files(ca_dir: str, node_id: str) -> TlsFiles:
    out = issue(ca_dir, node_id, os.path.join(ca_dir, "issued"), role="node")
    return TlsFiles(os.path.join(ca_dir, "ca.crt"), out.cert, out.key)


def client_files(ca_dir: str, name: str) -> TlsFiles:
    out = issue(ca_dir, name, os.path.join(ca_dir, "issued"), role="client")
    return TlsFiles(os.path.join(ca_dir, "ca.crt"), out.cert, out.key)


@pytest.fixture
def ca(tmp_path) -> str:
    return make_ca(tmp_path)


@pytest.fixture
def tls_server(src, ca):
    srv = SupplierServer(DirectoryStorage(src), b"", limits=Limits(4), timeout=10,
                         tls=TlsContexts(node_files(ca, "n1"))).start()
    yield srv
    srv.stop()


def _fetch(peer: str, dst: str, p: int, files: TlsFiles, expect: str | None = "n1", **kw):
    d = Demander(DirectoryStorage(dst), peer, b"", timeout=10, chunk_size=MB,
                 tls=TlsContexts(files), tls_peer=expect, **kw)
    return d.fetch(p)


def test_certificates_name_their_role(ca) -> None:
    n = node_files(ca, "n1")
    c = client_files(ca, "ops")
    assert str(file_identity(n.cert)) == "node 'n1'" and str(file_identity(c.cert)) == "client 'ops'"
    assert identity_of(["ferry://node/a/b", "https://x"]) is None


def test_full_fetch_over_tls_is_byte_identical(tls_server, src, dst, ca) -> None:
    data = write_part(src, 3, 5 * MB + 77)
    res = _fetch(peer_of(tls_server), dst, 3, node_files(ca, "n2"))
    assert read(os.path.join(dst, "part-3.bin")) == data
    assert res.verified and res.bytes_wire == len(data)
    assert res.path == PATH_TLS_USERSPACE and res.summary()["path"] == PATH_TLS_USERSPACE


def test_client_certificate_cannot_fetch(tls_server, src, dst, ca) -> None:
    write_part(src, 1, MB)
    with pytest.raises(TlsError, match="client certificate .* cannot fetch partition files"):
        _fetch(peer_of(tls_server), dst, 1, client_files(ca, "ops"))
    assert not os.path.exists(os.path.join(dst, "part-1.bin"))


def test_foreign_ca_is_refused_both_ways(tls_server, src, dst, ca, tmp_path, caplog) -> None:
    write_part(src, 1, MB)
    other = make_ca(tmp_path, "other")
    # a demander whose certificate the supplier's CA did not sign (it trusts its own CA)
    with caplog.at_level(logging.WARNING, logger="ferry.transfer"):
        foreign = TlsFiles(os.path.join(ca, "ca.crt"), *_pair(node_files(other, "n2")))
        with pytest.raises(TlsError, match="does not trust our certificate") as e:
            _fetch(peer_of(tls_server), dst, 1, foreign)
        assert "\n" not in str(e.value)
        deadline = time.monotonic() + 5
        while not any("not trusted here" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert any("refused" in r.getMessage() and "not trusted here" in r.getMessage() for r in caplog.records)
    # a demander of the other CA does not trust the supplier either
    with pytest.raises(TlsError, match="not trusted here"):
        _fetch(peer_of(tls_server), dst, 1, node_files(other, "n3"))
    assert not os.path.exists(os.path.join(dst, "part-1.bin"))
    assert tls_server.stats.transfers_ok == 0


def _pair(f: TlsFiles) -> tuple[str, str]:
    return f.cert, f.key


def test_supplier_with_another_node_id_is_refused(tls_server, src, dst, ca) -> None:
    write_part(src, 1, MB)
    with pytest.raises(TlsError, match="names node 'n1', not 'n7'"):
        _fetch(peer_of(tls_server), dst, 1, node_files(ca, "n2"), expect="n7")
    assert not os.path.exists(os.path.join(dst, "part-1.bin"))


def test_plain_demander_is_refused_by_tls_supplier(tls_server, src, dst) -> None:
    from transfer_helpers import SECRET
    write_part(src, 1, MB)
    with pytest.raises(TransferError):
        Demander(DirectoryStorage(dst), peer_of(tls_server), SECRET, timeout=5).fetch(1)
    assert not os.path.exists(os.path.join(dst, "part-1.bin"))


class RecordFlipper:
    """Follows the supplier's TLS records (5-byte header: type, version, length) across
    the proxy's chunks and, past ``after`` bytes, flips one byte of the next record:
    its header's byte ``at`` (0-4), or with ``at`` = None the middle of its body."""

    def __init__(self, after: int, at: int | None) -> None:
        self.after, self.at = after, at
        self.seen = 0
        self.next_record = 0         # stream offset of the next record's header
        self.head = bytearray()      # the header bytes of that record seen so far
        self.target: int | None = None

    def __call__(self, b: bytes) -> bytes:
        out = bytearray(b)
        for i in range(len(b)):
            pos = self.seen + i
            if pos == self.target:
                out[i] ^= 0x01
                self.target = -1                     # done
            if self.next_record <= pos < self.next_record + 5:
                self.head.append(b[i])
                if len(self.head) == 5:
                    length = int.from_bytes(self.head[3:5], "big")
                    start = self.next_record
                    if self.target is None and start > self.after:
                        # (the header byte itself is past: flip the next record's)
                        if self.at is None:
                            self.target = start + 5 + length // 2
                    self.next_record = start + 5 + length
                    self.head.clear()
                    if (self.target is None and self.at is not None
                            and self.next_record > self.after):
                        self.target = self.next_record + self.at
        self.seen += len(b)
        return bytes(out)


@pytest.mark.parametrize("at", [0, 1, 3, None], ids=["type", "version", "length", "body"])
def test_a_flipped_byte_anywhere_in_a_record_is_changed_on_the_path(tls_server, src, dst, ca,
                                                                    at) -> None:
    """A flipped byte in a record's header (its type, version or length) or in its body
    ends the connection with the same words: the handshake authenticated both ends, so
    a record that does not check was changed on the path. Nothing is installed."""
    write_part(src, 2, 2 * MB + 5)
    flip = RecordFlipper(MB, at)
    evil = Proxy(tls_server.address, mangle=flip)
    try:
        with pytest.raises(TransferError, match="TLS connection from .* refused") as e:
            _fetch(evil.peer, dst, 2, node_files(ca, "n2"))
    finally:
        evil.close()
    assert flip.target == -1, "no byte was flipped"
    assert "changed on the path" in str(e.value), str(e.value)
    assert not os.path.exists(os.path.join(dst, "part-2.bin"))


def test_path_sees_no_plaintext_and_cannot_alter_a_byte(tls_server, src, dst, ca) -> None:
    data = write_part(src, 2, 2 * MB + 5)
    seen: list[bytes] = []

    def record(b: bytes) -> bytes:
        seen.append(b)
        return b
    tap = Proxy(tls_server.address, mangle=record)
    res = _fetch(tap.peer, dst, 2, node_files(ca, "n2"))
    tap.close()
    assert res.verified and read(os.path.join(dst, "part-2.bin")) == data
    wire = b"".join(seen)
    assert len(wire) > len(data)
    # no 32-byte window of the file (nor the frames' magic) crosses the path in clear
    for off in range(0, len(data) - 32, 64 * 1024 + 17):
        assert data[off:off + 32] not in wire
    assert b"part-" not in wire and b"MANIFEST" not in wire

    # one byte flipped in the middle of the stream: the record fails TLS's check, the
    # connection ends, nothing is installed
    os.remove(os.path.join(dst, "part-2.bin"))
    state = {"n": 0, "done": False}

    def flip(b: bytes) -> bytes:
        state["n"] += len(b)
        if not state["done"] and state["n"] > MB:
            state["done"] = True
            i = len(b) // 2
            return b[:i] + bytes([b[i] ^ 0x01]) + b[i + 1:]
        return b
    evil = Proxy(tls_server.address, mangle=flip)
    with pytest.raises(TransferError, match="TLS connection from .* refused") as e:
        _fetch(evil.peer, dst, 2, node_files(ca, "n2"))
    assert "changed on the path" in str(e.value)
    evil.close()
    assert state["done"]
    assert not os.path.exists(os.path.join(dst, "part-2.bin"))


def test_rotation_new_connections_use_new_files(tmp_path, src, dst) -> None:
    ca1, ca2 = make_ca(tmp_path, "ca1"), make_ca(tmp_path, "ca2")
    live = tmp_path / "live"
    live.mkdir()
    n1 = node_files(ca1, "n1")
    files = TlsFiles(str(live / "ca.crt"), str(live / "n1.crt"), str(live / "n1.key"))
    for a, b in zip((n1.ca, n1.cert, n1.key), (files.ca, files.cert, files.key)):
        shutil.copy(a, b)
    contexts = TlsContexts(files, check_every=0.0)
    srv = SupplierServer(DirectoryStorage(src), b"", timeout=10, tls=contexts).start()
    try:
        data = write_part(src, 1, MB)
        _fetch(peer_of(srv), dst, 1, node_files(ca1, "n2"))
        # rotate to another CA: the files are replaced under the running supplier
        n1b = node_files(ca2, "n1")
        for a, b in zip((n1b.ca, n1b.cert, n1b.key), (files.ca, files.cert, files.key)):
            shutil.copy(a, b + ".new")
            os.replace(b + ".new", b)
        with pytest.raises(TlsError):
            _fetch(peer_of(srv), str(tmp_path / "d2"), 1, node_files(ca1, "n2"))
        res = _fetch(peer_of(srv), str(tmp_path / "d3"), 1, node_files(ca2, "n2"))
        assert res.verified and read(str(tmp_path / "d3" / "part-1.bin")) == data
        assert contexts.reloads == 1
        # a half-done rotation (a key that is not the certificate's) keeps the last good files
        shutil.copy(node_files(ca2, "n9").key, files.key)
        res = _fetch(peer_of(srv), str(tmp_path / "d4"), 1, node_files(ca2, "n2"))
        assert res.verified and contexts.reloads == 1
    finally:
        srv.stop()


def test_ktls_detection_reads_the_ulp_list(tmp_path) -> None:
    f = tmp_path / "ulp"
    f.write_text("mptcp\n")
    assert ktls_available(str(f)) is False
    f.write_text("mptcp tls\n")
    assert ktls_available(str(f)) is True
    assert ktls_available(str(tmp_path / "absent")) is False


def test_cli_fetch_over_tls_reports_its_path(tmp_path, src, dst, ca) -> None:
    data = write_part(src, 4, 3 * MB)
    s = node_files(ca, "n1")
    d = node_files(ca, "n2")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    srv = SupplierServer(DirectoryStorage(src), b"", port=port, timeout=10, tls=TlsContexts(s)).start()
    try:
        r = CliRunner().invoke(transfer, ["fetch", f"127.0.0.1:{port}", "--partition", "4", "--dest", dst,
                                          "--tls-ca", d.ca, "--tls-cert", d.cert, "--tls-key", d.key,
                                          "--tls-node", "n1", "--json"])
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["ok"] and out["partitions"][0]["path"] == "tls-userspace"
        assert out["ktls_available"] is ktls_available()
        assert read(os.path.join(dst, "part-4.bin")) == data
        # only some of the three options: refused before anything connects
        r = CliRunner().invoke(transfer, ["fetch", f"127.0.0.1:{port}", "--partition", "4", "--dest", dst,
                                          "--tls-ca", d.ca])
        assert r.exit_code == 1 and "needs all of --tls-ca, --tls-cert and --tls-key" in r.output
    finally:
        srv.stop()


def test_a_dripping_peer_gets_one_deadline_for_the_tls_handshake(src, ca) -> None:
    from transfer_helpers import drip
    srv = SupplierServer(DirectoryStorage(src), b"", timeout=10, handshake_timeout=1.0,
                         tls=TlsContexts(node_files(ca, "n1"))).start()
    try:
        # the start of a TLS ClientHello, one byte every 0.3 s: each read is quick, the
        # whole is not; the supplier drops it at its 1 s deadline, not 0.3 s per byte
        hello = bytes.fromhex("160301020001") + b"\x00" * 200
        closed, took = drip(srv.address, hello, 0.3)
        assert closed and 0.9 <= took < 3.0, (closed, took)
        assert srv.gate.enter()       # the slot was given back
        srv.gate.leave()
    finally:
        srv.stop()


def test_a_certificate_of_the_ca_without_a_ferry_identity_is_refused(tls_server, src, ca, caplog) -> None:
    import ssl
    write_part(src, 1, MB)
    etcd_client = issue(ca, "etcd-user", os.path.join(ca, "issued"))      # an etcd client certificate
    with pytest.raises(TlsError, match="names no Ferry identity"):
        TlsContexts(TlsFiles(os.path.join(ca, "ca.crt"), etcd_client.cert, etcd_client.key))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(os.path.join(ca, "ca.crt"))
    ctx.load_cert_chain(etcd_client.cert, etcd_client.key)
    with caplog.at_level(logging.WARNING, logger="ferry.transfer"):
        with socket.create_connection(tls_server.address, timeout=5) as raw:
            with ctx.wrap_socket(raw) as s:
                assert s.recv(100) == b""         # closed without a frame: nothing is served
        deadline = time.monotonic() + 5
        while not any("no ferry:// identity" in r.getMessage() for r in caplog.records) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
    assert any("no ferry:// identity" in r.getMessage() for r in caplog.records)
    assert tls_server.stats.transfers_ok == 0


def test_a_handshake_the_peer_closes_midway_is_a_cut_not_a_refusal(ca) -> None:
    """A connection closed during the TLS handshake without an alert (a relay that cut
    it, a peer that went away) is TlsCut, retried like a cut handshake in secret mode,
    not a refusal."""
    import threading

    from transfer.errors import TlsCut
    client = TlsContexts(client_files(ca, "c1"))
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]

        def accept_and_close() -> None:
            conn, _ = srv.accept()
            conn.settimeout(0.3)
            try:                         # the whole ClientHello, then close without a word
                while conn.recv(65536):  # (read first: unread bytes would make it a reset)
                    pass
            except socket.timeout:
                pass
            conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        t = threading.Thread(target=accept_and_close, daemon=True)
        t.start()
        sock = socket.create_connection(("127.0.0.1", port), timeout=5.0)
        with pytest.raises(TlsCut):
            client.connect(sock, f"127.0.0.1:{port}", deadline=5.0)
        t.join(5.0)
