"""Mutual TLS for every Ferry connection (node RPC, client RPC, file transfers), the
certificate alternative to the shared-secret handshake of :mod:`transfer.auth`.

Both sides present a certificate signed by the cluster's CA (``ferry certs``) and
check the other's; TLS 1.3 only. Who a peer is comes from its certificate alone, from
a subject alternative name URI:

    ferry://node/<id>          a node of the cluster (may call every method, supply
                               and demand partition files)
    ferry://client/<name>      a client (the client methods only; no transfers)
    ferry://validator/<name>   a live validator (``ferry validate --cluster``): reads
                               the map, fences a partition for a validation and
                               fetches partition files; no write, no other method

A certificate with none of them (an etcd server certificate of the same CA, say) is
refused. Host names are not checked: the dialling side instead compares the node id
in the peer's certificate with the member it meant to reach (``expect``).

Inside TLS the frames are not sealed again (no ``Conn.sealer``, no per-frame HMAC, no
Poly1305 over file data): TLS already authenticates every byte of the stream, in
order, and refuses a changed, injected, replayed or dropped record by closing the
connection.

:class:`TlsContexts` holds the server and client ``ssl.SSLContext`` built from three
files (CA, certificate, key) and rebuilds them when any of the files changes: each new
connection checks, at most every ``check_every`` seconds, whether the files' size,
mtime or inode changed. Connections already open keep the certificate they started
with. A change that does not load (a key that does not match the certificate, a file
half written) is logged and the previous contexts stay in use.

**Revocation.** ``TlsFiles.crl`` names a certificate revocation list signed by the
cluster CA (``ferry certs revoke``, node/crl.py). Every handshake then checks the
peer's certificate against it (OpenSSL's ``VERIFY_CRL_CHECK_LEAF``), both ways: a node
refuses a revoked client, validator or node, and a client refuses a revoked node. The
list is checked when it loads: signed by the CA, not past its next update, and not
listing this side's own certificate (a node whose certificate was revoked does not
start); a list that fails is refused with a message, never half used. A changed list
is picked up within ``check_every`` seconds even with no new connection (a thread
looks), and connections already open whose peer certificate it now lists are closed.

File data goes through user space over TLS (:meth:`TlsConn.sendfile`: ``os.preadv``
into one reused buffer, ``SSLSocket.sendall``); :func:`ktls_available` says whether
the kernel offers TLS offload (the ``tls`` TCP ULP), which this module only reports.
"""
from __future__ import annotations

import datetime
import logging
import os
import select
import socket
import ssl
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

from .errors import PeerClosed, RemoteError, TlsCut, TlsError, TransferError
from .frames import ErrorCode, FrameType, read_frame, send_error, write_frame
from .transport import COPY_BLOCK, Conn, wait_fd

log = logging.getLogger("ferry.tls")

NODE_URI = "ferry://node/"
CLIENT_URI = "ferry://client/"
VALIDATOR_URI = "ferry://validator/"
NODE, CLIENT, VALIDATOR = "node", "client", "validator"
ROLES = (NODE, CLIENT, VALIDATOR)     # every identity a certificate may name
FETCHERS = (NODE, VALIDATOR)          # the roles a file supplier serves (clients: never)
ULP_FILE = "/proc/sys/net/ipv4/tcp_available_ulp"
X509_V_ERR_CERT_REVOKED = 23          # OpenSSL's verify code for a certificate a CRL lists

# What FetchResult.path / `ferry transfer fetch --json` report for the data path
PATH_SENDFILE = "sendfile"
PATH_TLS_USERSPACE = "tls-userspace"
PATH_KTLS_SENDFILE = "ktls-sendfile"
PATH_CHANNEL = "channel"          # an SSH channel or another byte stream: copied through user space


@dataclass(frozen=True)
class TlsFiles:
    """The three files of a TLS setup: the cluster CA's certificate, this side's
    certificate and its private key (PEM)."""
    ca: str
    cert: str
    key: str
    crl: str | None = None      # a revocation list signed by the CA (ferry certs revoke)


@dataclass(frozen=True)
class Peer:
    """Who a certificate names: ``role`` is ``node``, ``client`` or ``validator``."""
    role: str
    name: str

    def __str__(self) -> str:
        return f"{self.role} {self.name!r}"


def ktls_available(path: str = ULP_FILE) -> bool:
    """True when the kernel lists the ``tls`` upper-layer protocol for TCP (kernel TLS;
    the module may also have to be loaded: ``modprobe tls``)."""
    try:
        with open(path) as f:
            return "tls" in f.read().split()
    except OSError:
        return False


def identity_of(uris: list[str]) -> Peer | None:
    """The identity the ``ferry://`` URIs of a certificate give (None: none of them)."""
    for uri in uris:
        for prefix, role in ((NODE_URI, NODE), (CLIENT_URI, CLIENT), (VALIDATOR_URI, VALIDATOR)):
            if uri.startswith(prefix) and len(uri) > len(prefix) and "/" not in uri[len(prefix):]:
                return Peer(role, uri[len(prefix):])
    return None


def peer_identity(sock: ssl.SSLSocket) -> Peer | None:
    cert: Any = sock.getpeercert()
    if not cert:
        return None
    uris = [v for k, v in cert.get("subjectAltName", ()) if k == "URI"]
    return identity_of(uris)


def file_identity(path: str) -> Peer | None:
    """The identity a certificate file names (read with ``cryptography``)."""
    from cryptography import x509
    try:
        with open(path, "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return None
    return identity_of(list(san.get_values_for_type(x509.UniformResourceIdentifier)))


def _stamp(files: TlsFiles) -> tuple[tuple[int, int, int, int], ...]:
    out = []
    for p in (files.ca, files.cert, files.key) + ((files.crl,) if files.crl else ()):
        try:
            st = os.stat(p)
            out.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        except OSError:
            out.append((0, 0, 0, 0))
    return tuple(out)


def serial_hex(n: int) -> str:
    """A serial number as ssl's ``getpeercert()`` writes it: upper-case hex, even length."""
    h = f"{n:X}"
    return h if len(h) % 2 == 0 else "0" + h


def check_crl(files: TlsFiles) -> frozenset[str]:
    """The serials (``serial_hex``) that ``files.crl`` revokes, once it is known to be
    a CRL signed by ``files.ca``'s key, for that CA, not past its next update, and not
    revoking ``files.cert``; else TlsError saying which."""
    from cryptography import x509
    assert files.crl is not None
    try:
        with open(files.crl, "rb") as f:
            raw = f.read(64 << 20)
        with open(files.ca, "rb") as f:
            ca = x509.load_pem_x509_certificate(f.read())
        with open(files.cert, "rb") as f:
            mine = x509.load_pem_x509_certificate(f.read())
    except OSError as e:
        raise TlsError(f"TLS revocation list {files.crl} cannot be read: {e.strerror}") from None
    except ValueError as e:
        raise TlsError(f"TLS CA certificate {files.ca} or certificate {files.cert} does not load: "
                       f"{str(e)[:120]}") from None
    try:
        crl = x509.load_pem_x509_crl(raw)
    except ValueError:
        raise TlsError(f"TLS revocation list {files.crl} is not a PEM certificate revocation list "
                       "(ferry certs revoke writes one)") from None
    if crl.issuer != ca.subject:
        raise TlsError(f"TLS revocation list {files.crl} is issued by {crl.issuer.rfc4514_string()}, "
                       f"not by the CA {ca.subject.rfc4514_string()} of {files.ca}")
    try:
        signed = crl.is_signature_valid(ca.public_key())   # type: ignore[arg-type]
    except (TypeError, ValueError):
        signed = False
    if not signed:
        raise TlsError(f"TLS revocation list {files.crl} is not signed by the CA of {files.ca} "
                       "(a forged or another cluster's list): refused")
    nxt = crl.next_update_utc
    if nxt is not None and nxt < datetime.datetime.now(datetime.timezone.utc):
        raise TlsError(f"TLS revocation list {files.crl} expired on {nxt.isoformat()}: write a new "
                       "one with `ferry certs crl CA_DIR` and copy it to every node")
    revoked = frozenset(serial_hex(r.serial_number) for r in crl)
    if serial_hex(mine.serial_number) in revoked:
        raise TlsError(f"certificate {files.cert} (serial {serial_hex(mine.serial_number)}) is "
                       f"revoked by {files.crl}: issue this side a new certificate")
    return revoked


def _load(files: TlsFiles) -> tuple[ssl.SSLContext, ssl.SSLContext, Peer, frozenset[str]]:
    """(server context, client context, own identity, revoked serials), or TlsError
    naming the file."""
    named = [("CA certificate", files.ca), ("certificate", files.cert), ("key", files.key)]
    if files.crl:
        named.append(("revocation list", files.crl))
    for what, p in named:
        if not os.path.isfile(p):
            raise TlsError(f"TLS {what} {p} is not a readable file")
    revoked = check_crl(files) if files.crl else frozenset()
    me = file_identity(files.cert)
    if me is None:
        raise TlsError(f"certificate {files.cert} names no Ferry identity (a subject alternative "
                       f"name {NODE_URI}ID, {CLIENT_URI}NAME or {VALIDATOR_URI}NAME): issue it with "
                       "`ferry certs issue --node ID`, `--client NAME` or `--validator NAME`")
    out = []
    for purpose in (ssl.PROTOCOL_TLS_SERVER, ssl.PROTOCOL_TLS_CLIENT):
        ctx = ssl.SSLContext(purpose)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.check_hostname = False     # the peer's ferry:// identity is checked instead
        if purpose == ssl.PROTOCOL_TLS_SERVER:
            # no session tickets: nothing resumes sessions, and an unread ticket makes an
            # idle client connection look readable (node.wire's check for a closed one)
            ctx.num_tickets = 0
        try:
            ctx.load_verify_locations(cafile=files.ca)
        except (ssl.SSLError, OSError) as e:
            raise TlsError(f"TLS CA certificate {files.ca} does not load: {_reason(e)}") from None
        if files.crl:
            try:
                ctx.load_verify_locations(cafile=files.crl)
            except (ssl.SSLError, OSError) as e:
                raise TlsError(f"TLS revocation list {files.crl} does not load: {_reason(e)}") from None
            ctx.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
        try:
            ctx.load_cert_chain(files.cert, files.key)
        except (ssl.SSLError, OSError) as e:
            raise TlsError(f"TLS certificate {files.cert} with key {files.key} does not load "
                           f"(is the key this certificate's?): {_reason(e)}") from None
        out.append(ctx)
    return out[0], out[1], me, revoked


def _reason(e: BaseException) -> str:
    if isinstance(e, ssl.SSLCertVerificationError):
        return e.verify_message or str(e)
    if isinstance(e, ssl.SSLError):
        return e.reason or str(e)
    return getattr(e, "strerror", None) or str(e)


class TlsContexts:
    """The server and client contexts of one certificate, rebuilt when the files change
    (checked on use, at most every ``check_every`` seconds). ``identity`` is the
    certificate's own. Raises TlsError when the files do not load at first."""

    def __init__(self, files: TlsFiles, *, check_every: float = 1.0) -> None:
        self.files = files
        self.check_every = check_every
        self._lock = threading.Lock()
        self._stamp = _stamp(files)
        self._server, self._client, self.identity, self.revoked = _load(files)
        self._checked = time.monotonic()
        self.reloads = 0
        self.cut = 0                     # open connections closed because their peer was revoked
        self._conns: "weakref.WeakSet[TlsConn]" = weakref.WeakSet()
        if files.crl:
            # a revocation must not wait for the next connection: look every check_every
            threading.Thread(target=_watch_crl, args=(weakref.ref(self),), daemon=True,
                             name="ferry-tls-crl").start()

    def _current(self) -> tuple[ssl.SSLContext, ssl.SSLContext]:
        with self._lock:
            now = time.monotonic()
            if now - self._checked >= self.check_every:
                self._checked = now
                stamp = _stamp(self.files)
                if stamp != self._stamp:
                    try:
                        self._server, self._client, self.identity, self.revoked = _load(self.files)
                        self._stamp = stamp
                        self.reloads += 1
                        log.info("stage=tls reloaded certificate %s (%s), CA %s%s", self.files.cert,
                                 self.identity, self.files.ca,
                                 f", revocation list {self.files.crl} ({len(self.revoked)} revoked)"
                                 if self.files.crl else "")
                        self._cut_revoked()
                    except TlsError as e:
                        # a rotation in progress (key written, certificate not yet):
                        # keep what works, look again at the next connection
                        log.warning("stage=tls the changed files do not load, still using the "
                                    "previous ones: %s", e)
            return self._server, self._client

    def _cut_revoked(self) -> None:
        """Close every open connection whose peer certificate is now revoked (the lock is held)."""
        for conn in list(self._conns):
            if conn.peer_serial and conn.peer_serial in self.revoked:
                log.warning("stage=tls closed the connection of %s (%s): its certificate (serial %s) "
                            "is revoked by %s", conn.peer, conn.peer_id, conn.peer_serial, self.files.crl)
                self.cut += 1
                conn.close()

    def server_context(self) -> ssl.SSLContext:
        return self._current()[0]

    def client_context(self) -> ssl.SSLContext:
        return self._current()[1]

    # -- connections ------------------------------------------------------------------
    def accept(self, sock: socket.socket, peer: str, *, deadline: float,
               roles: tuple[str, ...] = ROLES, what: str = "connect") -> "TlsConn":
        """The server side of a new TCP connection: TLS handshake within ``deadline``
        seconds, the peer's certificate checked (its role must be one of ``roles``;
        ``what`` names the refused action), then AUTH_OK or an ERROR frame saying why.
        TlsError (the socket closed) on any failure."""
        conn = self._handshake(sock, peer, deadline, server=True)
        who = conn.peer_id
        conn.set_deadline(deadline)
        try:
            if who.role not in roles:
                why = f"a {who.role} certificate ({who.name!r}) cannot {what}"
                send_error(conn, ErrorCode.AUTH, why)
                conn.close()
                raise TlsError(f"refused {peer}: {why}", stage="handshake", peer=peer)
            write_frame(conn, FrameType.AUTH_OK, {})
        except TransferError as e:
            conn.close()
            if isinstance(e, TlsError):
                raise
            raise TlsError(f"TLS with {peer} failed: {e.reason}", stage="handshake", peer=peer) from None
        finally:
            conn.set_deadline(None)
        return conn

    def connect(self, sock: socket.socket, peer: str, *, deadline: float,
                expect: str | None = None) -> "TlsConn":
        """The client side: TLS handshake, then the peer must be a node, and the node
        ``expect`` when given, and it must accept us (AUTH_OK); TlsError (the socket
        closed) if not."""
        conn = self._handshake(sock, peer, deadline, server=False)
        who = conn.peer_id
        why = None
        if who.role != NODE:
            why = f"it presented a {who.role} certificate ({who.name!r}), not a node's"
        elif expect is not None and who.name != expect:
            why = f"its certificate names node {who.name!r}, not {expect!r}, the member at that address"
        if why is not None:
            conn.close()
            raise TlsError(f"refused {peer}: {why}", stage="handshake", peer=peer)
        conn.set_deadline(deadline)
        try:
            read_frame(conn, expect=[FrameType.AUTH_OK], limit=4096)
        except RemoteError as e:
            conn.close()
            raise TlsError(f"{peer} refused this connection: {e.reason}", stage="handshake",
                           peer=peer) from None
        except PeerClosed as e:
            conn.close()
            raise TlsCut(f"TLS with {peer} failed: {e.reason}", stage="handshake", peer=peer) from None
        except TlsError as e:
            conn.close()
            raise TlsError(f"TLS with {peer} refused: {e.detail or e.reason}", stage="handshake",
                           peer=peer) from None
        except TransferError as e:
            conn.close()
            raise TlsError(f"TLS with {peer} failed: {e.reason}", stage="handshake", peer=peer) from None
        finally:
            conn.set_deadline(None)
        return conn

    @staticmethod
    def _drive(ssock: ssl.SSLSocket, peer: str, deadline: float) -> None:
        """The TLS handshake within ``deadline`` seconds in all: non-blocking steps and
        poll(2), so a peer that drips one byte at a time cannot stretch it (a socket
        timeout would restart with every byte)."""
        end = time.monotonic() + deadline
        ssock.settimeout(0.0)
        while True:
            try:
                ssock.do_handshake()
                return
            except ssl.SSLWantReadError:
                events = select.POLLIN
            except ssl.SSLWantWriteError:
                events = select.POLLOUT
            left = end - time.monotonic()
            if left <= 0 or not wait_fd(ssock.fileno(), events, left):
                raise TlsCut(f"{peer} did not finish the TLS handshake within {deadline:g} s (deadline)",
                             stage="handshake", peer=peer)

    def _handshake(self, sock: socket.socket, peer: str, deadline: float, *, server: bool) -> "TlsConn":
        ctx = self.server_context() if server else self.client_context()
        old = sock.gettimeout()
        try:
            sock.settimeout(deadline)
            ssock = ctx.wrap_socket(sock, server_side=server, do_handshake_on_connect=False)
        except (OSError, ValueError) as e:
            sock.close()
            raise TlsCut(f"TLS with {peer} failed: {_reason(e)}", stage="handshake", peer=peer) from None
        try:
            self._drive(ssock, peer, deadline)
        except TlsCut:
            ssock.close()
            raise
        except ssl.SSLEOFError as e:
            # the peer's end closed mid-handshake without an alert (a reset, a cut link,
            # a relay that dropped it): the network, not a refusal, as in secret mode
            ssock.close()
            raise TlsCut(f"TLS with {peer} failed: the connection closed during the handshake "
                         f"({_reason(e)})", stage="handshake", peer=peer) from None
        except ssl.SSLCertVerificationError as e:
            ssock.close()
            side = "peer" if server else "node"
            if e.verify_code == X509_V_ERR_CERT_REVOKED:
                raise TlsError(f"refused {side} {peer}: its certificate is revoked (listed in "
                               f"{self.files.crl})", stage="handshake", peer=peer) from None
            raise TlsError(f"refused {side} {peer}: its certificate is not trusted here "
                           f"({_reason(e)}; signed by another cluster's CA?)",
                           stage="handshake", peer=peer) from None
        except ssl.SSLError as e:
            ssock.close()
            raise TlsError(f"TLS with {peer} refused: {_describe_alert(e)}",
                           stage="handshake", peer=peer) from None
        except (OSError, socket.timeout) as e:
            ssock.close()
            raise TlsCut(f"TLS with {peer} failed: {_reason(e) or 'timed out'}",
                           stage="handshake", peer=peer) from None
        ssock.settimeout(old)
        who = peer_identity(ssock)
        if who is None:
            ssock.close()
            raise TlsError(f"refused {peer}: its certificate names no ferry:// identity "
                           f"({NODE_URI}ID, {CLIENT_URI}NAME or {VALIDATOR_URI}NAME)", stage="handshake",
                           peer=peer)
        conn = TlsConn(ssock, peer, who)
        if self.files.crl:
            with self._lock:
                self._conns.add(conn)
        return conn


def _describe_alert(e: ssl.SSLError) -> str:
    reason = (e.reason or str(e)).lower()
    if "bad_record_mac" in reason or "bad record mac" in reason or "decryption_failed" in reason:
        return "a record failed its authentication tag (changed on the path)"
    if "unknown_ca" in reason or "unknown ca" in reason or "certificate_unknown" in reason:
        return "the peer does not trust our certificate (signed by another cluster's CA?)"
    if "certificate_revoked" in reason or "certificate revoked" in reason:
        return "the peer refused our certificate: it is revoked (listed in the cluster CA's revocation list)"
    if "certificate_required" in reason or "peer did not return a certificate" in reason:
        return "a certificate is required"
    if "wrong_version" in reason or "unsupported_protocol" in reason or "protocol_version" in reason:
        return "the peer does not speak TLS 1.3 (a node without TLS, or an old client?)"
    return e.reason or str(e)


# OpenSSL's reasons for a record that does not parse or does not authenticate
_RECORD_BROKEN = ("bad_record_mac", "bad record mac", "decryption_failed", "bad_decrypt",
                  "bad_record_type", "wrong_version_number", "packet_length_too_long",
                  "record_length_mismatch", "encrypted_length_too_long",
                  "data_length_too_long", "length_too_short", "bad_length",
                  "record_too_small", "record_layer_failure", "unexpected_record")


def _describe_stream_error(e: ssl.SSLError) -> str:
    """An error on an established connection. The handshake authenticated both ends,
    so a record whose header or tag does not check (a flipped byte lands in either)
    was changed on the path; anything else reads as an alert does."""
    reason = (e.reason or str(e)).lower()
    if any(r in reason for r in _RECORD_BROKEN):
        return f"a record failed its checks ({e.reason or reason}: changed on the path)"
    return _describe_alert(e)


class TlsConn(Conn):
    """A TLS stream (``ssl.SSLSocket``). ``peer_id`` is who the certificate says the peer
    is. File data is read into one reused buffer and encrypted in user space."""

    zero_copy = False
    data_path = PATH_TLS_USERSPACE

    def __init__(self, sock: ssl.SSLSocket, peer: str, peer_id: Peer) -> None:
        self.sock = sock
        self.peer = peer
        self.peer_id = peer_id
        try:
            self.peer_serial = str((sock.getpeercert() or {}).get("serialNumber", "")).upper()
        except (ValueError, OSError):
            self.peer_serial = ""
        self._timeout = sock.gettimeout()
        self._buf: memoryview | None = None

    def send(self, data: bytes | memoryview) -> None:
        try:
            self._before_io()
            self.sock.sendall(data)
        except socket.timeout:
            raise self._timed_out("sending to") from None
        except ssl.SSLError as e:
            why = _describe_stream_error(e)
            raise TlsError(f"TLS connection to {self.peer} failed while sending: {why}",
                           peer=self.peer, detail=why) from None
        except OSError as e:
            raise PeerClosed(f"connection to {self.peer} lost while sending: {e}") from None

    def recv_into(self, view: memoryview) -> int:
        try:
            self._before_io()
            return self.sock.recv_into(view)
        except socket.timeout:
            raise self._timed_out("waiting for") from None
        except ssl.SSLEOFError:
            return 0          # closed without close_notify: the end of the stream all the same
        except ssl.SSLError as e:
            # a record that fails its authentication tag (changed on the path) ends here
            why = _describe_stream_error(e)
            raise TlsError(f"TLS connection from {self.peer} refused: {why}",
                           peer=self.peer, detail=why) from None
        except OSError as e:
            raise PeerClosed(f"connection reset by {self.peer}: {e}") from None

    def sendfile(self, fd: int, offset: int, count: int) -> int:
        """``count`` bytes of ``fd`` from ``offset`` through one reused buffer."""
        if self._buf is None:
            self._buf = memoryview(bytearray(COPY_BLOCK))
        buf = self._buf
        sent = 0
        while sent < count:
            want = min(len(buf), count - sent)
            n = os.preadv(fd, [buf[:want]], offset + sent)
            if n <= 0:
                break
            self.send(buf[:n])
            sent += n
        return sent

    def _apply_timeout(self, seconds: float | None) -> None:
        try:
            self.sock.settimeout(seconds)
        except OSError:
            pass        # closed already (a refused handshake): the next I/O says so

    def readable(self) -> bool:
        return self.sock.pending() > 0 or wait_fd(self.sock.fileno(), select.POLLIN, 0)

    def peer_closed(self) -> bool:
        try:
            info = self.sock.getsockopt(socket.IPPROTO_TCP, getattr(socket, "TCP_INFO", 11), 8)
        except (OSError, AttributeError):
            return False
        return info[0] == 8          # TCP_CLOSE_WAIT

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except (OSError, ValueError):
            pass
        try:
            self.sock.close()
        except OSError:
            pass


def _watch_crl(ref: "weakref.ref[TlsContexts]") -> None:
    """Reload the files of the contexts behind ``ref`` every ``check_every`` seconds while
    they live (a revocation list that changes cuts revoked peers without waiting for a
    new connection)."""
    while True:
        ctxs = ref()
        if ctxs is None:
            return
        every = ctxs.check_every
        try:
            ctxs._current()
        except Exception:  # noqa: BLE001 - a watcher never dies of one bad look
            log.exception("stage=tls revocation list check failed")
        del ctxs
        time.sleep(max(0.05, every))


def load(files: TlsFiles | None) -> TlsContexts | None:
    return TlsContexts(files) if files is not None else None


__all__ = ["TlsFiles", "TlsContexts", "TlsConn", "TlsError", "TlsCut", "Peer", "NODE", "CLIENT", "VALIDATOR",
           "ROLES", "FETCHERS", "NODE_URI", "CLIENT_URI", "VALIDATOR_URI", "ktls_available", "identity_of",
           "file_identity", "load", "check_crl", "serial_hex",
           "PATH_SENDFILE", "PATH_TLS_USERSPACE", "PATH_KTLS_SENDFILE", "PATH_CHANNEL",
           "TransferError"]
