"""The supplier: serves DEMANDs for partitions it holds.

One session per connection, each stage a named method (see docs/protocol.md):
handshake -> demand -> reserve -> snapshot -> manifest -> accepted -> send ->
preimages -> end -> applied (or error). File data goes by sendfile (zero-copy on a
plain socket), in throttled slices, chunk by chunk, skipping the chunks the demander
already holds with the right checksum; each CHUNK frame carries the chunk's checksum
at C, computed by a second thread just ahead of the send (transfer.pipeline).
Every protocol violation is answered with an
ERROR frame; one broken session never disturbs the others.
"""
from __future__ import annotations

import contextlib
import logging
import socket
import threading
from dataclasses import dataclass

from faults import crashpoint

from .auth import HANDSHAKE_DEADLINE, server_handshake
from .errors import (AuthError, BadName, Busy, FrameError, NotHeld, PeerClosed, RemoteError,
                     TransferError)
from .frames import ErrorCode, FrameType, read_frame, send_error, write_frame
from .limits import Limits
from .listener import HandshakeGate, accept_loop, refuse
from . import delta
from .messages import (Base, Chunk, Demand, End, Manifest, Preimage, Queued, Range, Received,
                       Resend, check_chunk_size)
from . import datamac
from .pipeline import SLICE, AheadHasher, Preimages, chunk_as_of_c, chunk_checksum, chunk_sums
from .resume import checksum
from .stages import Stages
from .storage import Snapshot, TransferStorage
from .tls import FETCHERS, TlsContexts
from .transport import Conn, SocketConn

log = logging.getLogger("ferry.transfer")

# A demander re-requests a few rounds at most (3 by default); each round may cost the
# whole file again, so more than this per DEMAND is a peer making the supplier work.
MAX_RESEND_ROUNDS = 8


@dataclass
class SupplierStats:
    sessions: int = 0
    transfers_ok: int = 0
    transfers_failed: int = 0
    bytes_sent: int = 0


class SupplierSession:
    """One connection: authenticate, then serve DEMANDs one after another until the
    peer closes (a demander may fetch several partitions over one connection)."""

    def __init__(self, server: "SupplierServer", conn: Conn) -> None:
        self.server = server
        self.conn = conn
        self.stages = Stages()
        self._refused = ""                         # why the last delta base was not used
        self._demand: Demand | None = None         # the DEMAND being served
        self._ranges: list[tuple[int, int]] = []   # a delta fetch's (first page, pages)
        self._sums: dict[int, int] = {}     # chunk -> checksum at C the demander was told

    def run(self) -> None:
        try:
            with self.stages.stage("handshake", peer=self.conn.peer):
                try:
                    tls = self.server.tls
                    if tls is None:
                        server_handshake(self.conn, self.server.secret, deadline=self.server.handshake_timeout)
                    elif not isinstance(self.conn, SocketConn):
                        send_error(self.conn, ErrorCode.AUTH, "this supplier takes TLS over TCP only")
                        raise AuthError(f"{self.conn.peer}: TLS needs a TCP connection")
                    else:
                        # a node's or a live validator's certificate: a client's may
                        # not read partition files
                        self.conn = tls.accept(self.conn.sock, self.conn.peer,
                                               deadline=self.server.handshake_timeout,
                                               roles=FETCHERS, what="fetch partition files")
                finally:
                    self.server.gate.leave()     # authenticated (or gone): no longer counted
            while self._serve_one():
                pass
        except AuthError as e:
            log.warning("supplier: refused %s: %s", self.conn.peer, e)
        except Exception:  # noqa: BLE001 - a bug in one session must not take the server down
            log.exception("supplier: session with %s failed unexpectedly", self.conn.peer)
        finally:
            self.conn.close()

    # -- one DEMAND --------------------------------------------------------------
    def _serve_one(self) -> bool:
        demand: Demand | None = None
        snap: Snapshot | None = None
        try:
            with self.stages.stage("demand", peer=self.conn.peer):
                try:
                    frame = read_frame(self.conn, expect=[FrameType.DEMAND])
                except PeerClosed:
                    return False      # clean end of the connection between demands
                demand = Demand.from_body(frame.body)
                self._demand = demand
                base = self._base(demand)
            ctx = {"partition": demand.partition, "peer": self.conn.peer}
            before = dict(self.stages.seconds)     # a connection serves many demands
            with contextlib.ExitStack() as held:
                # the slot is held to the end; the "reserve" timer counts only the wait for it
                with self.stages.stage("reserve", **ctx):
                    held.enter_context(self.server.limits.slots.acquire(demand.priority,
                                                                        on_wait=self._queued))
                with self.stages.stage("snapshot", **ctx):
                    snap = self.server.storage.open_snapshot(demand.cache, demand.partition)
                    crashpoint("supplier.after_snapshot")
                    manifest = (self._delta_manifest(snap, demand, base) if base is not None
                                else None) or self._manifest(snap, demand)
                with self.stages.stage("manifest", **ctx):
                    write_frame(self.conn, FrameType.MANIFEST, manifest.to_body())
                with self.stages.stage("accepted", **ctx):
                    read_frame(self.conn, expect=[FrameType.ACCEPT])
                with self.stages.stage("send", **ctx):
                    sent = self._send_delta(snap) if manifest.delta else self._send(snap, manifest)
                with self.stages.stage("preimages", **ctx):
                    pre = self._preimages(snap)
                with self.stages.stage("end", **ctx):
                    write_frame(self.conn, FrameType.END, End(*sent, len(pre)).to_body())
                with self.stages.stage("applied", **ctx):
                    self._await_applied(snap, manifest, pre)
            self.server.stats.transfers_ok += 1
            took = {k: round(v - before.get(k, 0.0), 3) for k, v in self.stages.seconds.items()
                    if v - before.get(k, 0.0) >= 0.001}
            log.info("supplier: partition %s of %r sent to %s (C=%s, %s bytes on the wire), "
                     "stage seconds %s", demand.partition, demand.cache, self.conn.peer,
                     manifest.counter, sent[1], took)
            return True
        except (FrameError, BadName, NotHeld) as e:
            code = e.code if isinstance(e, FrameError) else (
                ErrorCode.BAD_NAME if isinstance(e, BadName) else ErrorCode.NOT_HELD)
            send_error(self.conn, code, e.reason)
            self._failed(demand, e)
            return not isinstance(e, FrameError)   # after a bad frame the stream is suspect
        except TransferError as e:
            if not isinstance(e, (RemoteError, PeerClosed)):
                send_error(self.conn, ErrorCode.BUSY if isinstance(e, Busy) else ErrorCode.INTERNAL, e.reason)
            self._failed(demand, e)
            return False
        except OSError as e:
            send_error(self.conn, ErrorCode.INTERNAL, f"supplier I/O error: {e}")
            self._failed(demand, TransferError(f"I/O error: {e}", stage=self.stages.current))
            return False
        finally:
            if snap is not None:
                snap.close()

    def _failed(self, demand: Demand | None, e: TransferError) -> None:
        self.server.stats.transfers_failed += 1
        log.warning("supplier: transfer failed at stage %s, partition %s, peer %s: %s",
                    e.stage or self.stages.current, demand.partition if demand else "?",
                    self.conn.peer, e.reason)

    def _queued(self, position: int) -> None:
        # Keep-alive while waiting for a slot, so the demander's read timeout does not fire.
        write_frame(self.conn, FrameType.QUEUED, Queued(position).to_body())

    # -- stages ------------------------------------------------------------------
    def _base(self, demand: Demand) -> bytes | None:
        """The BASE frames that follow a DEMAND offering a delta base: exactly
        ``base_pages`` digests, in order."""
        self._refused = ""
        if not demand.base_pages:
            return None
        parts: list[bytes] = []
        have = 0
        while have < demand.base_pages:
            b = Base.from_body(read_frame(self.conn, expect=[FrameType.BASE]).body)
            n = len(b.digests) // delta.DIGEST
            if b.first != have or have + n > demand.base_pages:
                raise FrameError(ErrorCode.PROTOCOL, f"BASE frame for pages {b.first}..{b.first + n - 1} "
                                 f"after {have} of {demand.base_pages}")
            parts.append(b.digests)
            have += n
        return b"".join(parts)

    def _delta_manifest(self, snap: Snapshot, demand: Demand, base: bytes) -> Manifest | None:
        """The MANIFEST of a delta fetch, or None (and ``self._refused`` says why) when
        the whole file goes instead: the base's pages are of another size, the storage
        has no pages, or more than ``delta_limit`` permille of the pages differ."""
        chunk_size = check_chunk_size(demand.chunk_size)
        self._refused = ""
        if snap.size != snap.page_count * snap.page_size or not self.server.storage.verifies_pages:
            self._refused = "the source is not a page file"
            return None
        if demand.base_page_size != snap.page_size:
            self._refused = (f"the base has {demand.base_page_size}-byte pages, the source "
                             f"{snap.page_size}-byte pages")
            return None
        self._pre = Preimages(snap)
        mine = delta.snapshot_digests(snap.fd, snap.path, snap.page_size, snap.page_count,
                                      self._pre.current)
        ranges = delta.diff_ranges(base, mine)
        pages = delta.pages_in(ranges)
        if pages * 1000 > demand.delta_limit * max(1, snap.page_count):
            self._refused = (f"{pages} of {snap.page_count} pages differ from the base, above "
                             f"the delta limit of {demand.delta_limit / 10:g}%")
            return None
        self._ranges = ranges
        self._sums = {}
        return Manifest(snap.counter, snap.size, snap.page_size, snap.page_count, chunk_size,
                        delta=True, ranges=len(ranges), delta_pages=pages, root=delta.root(mine))

    def _send_delta(self, snap: Snapshot) -> tuple[int, int]:
        """Each range: a RANGE frame with its checksum at C, then its pages by sendfile,
        in ascending order, so "sent up to" moves like a full send's and pages not yet
        sent keep getting pre-images."""
        ps, total = snap.page_size, 0
        self._acked = -1
        buf = bytearray(SLICE)
        key = self._data_key(snap)
        for n, (first, count) in enumerate(self._ranges):
            span = (first * ps, count * ps)
            s, mac = chunk_sums(snap, span, self._pre, buf, key(span[0]) if key else None)
            write_frame(self.conn, FrameType.RANGE, Range(first, count, s, mac).to_body())
            off, size = span
            self._send_span(snap, off, size)
            total += size
            while self.conn.readable():
                self._take_received_range(snap)
            crashpoint("supplier.mid_delta_send")
        while self._acked < len(self._ranges) - 1:
            self._take_received_range(snap)
        snap.mark_sent(snap.size)
        self._check_unchanged(snap)
        return len(self._ranges), total

    def _data_key(self, snap: Snapshot) -> datamac.KeyFor | None:
        """The MAC key of the data at each offset (a sealed session), else None."""
        assert self._demand is not None
        return datamac.key_for(self.conn.sealer, True, self._demand.cache, self._demand.partition,
                               snap.counter)

    def _send_span(self, snap: Snapshot, off: int, size: int) -> None:
        """``size`` bytes of the file from ``off`` by sendfile, in slices the node-wide
        rate limit allows (a chunk's or a delta range's data)."""
        bucket = self.server.limits.bucket
        done = 0
        while done < size:
            k = min(bucket.slice_size(size), size - done)
            bucket.take(k)
            if self.conn.sendfile(snap.fd, off + done, k) < k:
                raise TransferError(f"{snap.path} shrank during the send (at offset {off + done})")
            done += k
        self.server.stats.bytes_sent += size

    def _take_received_range(self, snap: Snapshot) -> None:
        r = Received.from_body(read_frame(self.conn, expect=[FrameType.RECEIVED]).body)
        if r.index >= len(self._ranges):
            raise FrameError(ErrorCode.PROTOCOL, f"RECEIVED range {r.index}: the manifest has "
                             f"{len(self._ranges)}")
        self._acked = max(self._acked, r.index)
        first, count = self._ranges[self._acked]
        snap.mark_sent((first + count) * snap.page_size)

    def _manifest(self, snap: Snapshot, demand: Demand) -> Manifest:
        """Only the chunks the demander offers are hashed here (to decide what to skip);
        every other chunk is hashed just before it is sent (AheadHasher)."""
        chunk_size = check_chunk_size(demand.chunk_size)
        m = Manifest(snap.counter, snap.size, snap.page_size, snap.page_count, chunk_size)
        self._pre = Preimages(snap)
        self._sums = {}
        buf = bytearray(SLICE)
        for i, held in sorted(demand.held.items()):
            if i < m.chunk_count and chunk_checksum(snap, m.chunk_span(i), self._pre, buf) == held:
                self._sums[i] = held
        return Manifest(snap.counter, snap.size, snap.page_size, snap.page_count, chunk_size,
                        frozenset(self._sums), delta_refused=self._refused)

    def _send(self, snap: Snapshot, m: Manifest) -> tuple[int, int]:
        chunks = total = 0
        last = -1                      # last chunk sent
        self._acked = -1
        todo = [i for i in range(m.chunk_count) if i not in m.skip]
        key = self._data_key(snap)
        hasher = AheadHasher(snap, todo, m.chunk_span, self._pre, key=key)
        try:
            for i in todo:
                _, s, mac = hasher.next()
                self._sums[i] = s
                off, n = m.chunk_span(i)
                write_frame(self.conn, FrameType.CHUNK, Chunk(i, n, s, mac).to_body())
                self._send_span(snap, off, n)
                chunks, total, last = chunks + 1, total + n, i
                while self.conn.readable():
                    self._take_received(snap, m)
                crashpoint("supplier.mid_send")
        finally:
            hasher.close()
        # Wait until the demander has read every byte: until then a page overwritten
        # at the source could still reach it post-C (sendfile sends references).
        while self._acked < last:
            self._take_received(snap, m)
        snap.mark_sent(m.size)
        self._check_unchanged(snap)
        return chunks, total

    def _check_unchanged(self, snap: Snapshot) -> None:
        """Chunks are hashed just before they go, so a plain file written during the
        send would give a copy torn between versions whose every chunk verifies."""
        why = snap.changed()
        if why is not None:
            msg = f"{why}; the copy would mix versions: demand it again"
            send_error(self.conn, ErrorCode.SOURCE_CHANGED, msg)
            raise RemoteError(ErrorCode.SOURCE_CHANGED, msg)   # told the peer already

    def _take_received(self, snap: Snapshot, m: Manifest) -> None:
        r = Received.from_body(read_frame(self.conn, expect=[FrameType.RECEIVED]).body)
        if r.index >= m.chunk_count:
            raise FrameError(ErrorCode.PROTOCOL, f"RECEIVED chunk {r.index}: the manifest has {m.chunk_count}")
        self._acked = max(self._acked, r.index)
        snap.mark_sent(sum(m.chunk_span(self._acked)))

    def _preimages(self, snap: Snapshot) -> dict[int, bytes]:
        sent: dict[int, bytes] = {}
        for page, data in snap.preimages():
            if page >= snap.page_count:
                continue          # a page appended after C: the demander cuts it off anyway
            write_frame(self.conn, FrameType.PREIMAGE, Preimage(page, bytes(data)).to_body())
            sent[page] = bytes(data)
            crashpoint("supplier.mid_preimages")
        return sent

    def _await_applied(self, snap: Snapshot, m: Manifest, pre: dict[int, bytes]) -> None:
        rounds = 0
        while True:
            frame = read_frame(self.conn, expect=[FrameType.RESEND, FrameType.APPLIED])
            if frame.type == FrameType.APPLIED:
                return
            rounds += 1
            if rounds > self.server.max_resend_rounds:
                # Each round may cost the whole file again: bounded work per DEMAND.
                raise FrameError(ErrorCode.PROTOCOL, f"more than {self.server.max_resend_rounds} "
                                 "RESEND rounds for one transfer; demand the partition again")
            resend = Resend.from_body(frame.body)      # each chunk named once (deduplicated)
            n_bytes = 0
            for i in resend.chunks:
                if i not in self._sums:
                    raise FrameError(ErrorCode.PROTOCOL, f"RESEND of chunk {i}, which was neither "
                                     f"sent nor confirmed held ({m.chunk_count} chunks)")
                data = bytes(chunk_as_of_c(snap, m.chunk_span(i), pre))
                if checksum(data) != self._sums[i]:
                    msg = (f"chunk {i} of {snap.path} changed at the source during the transfer "
                           "(the file was written while being sent); demand it again")
                    send_error(self.conn, ErrorCode.SOURCE_CHANGED, msg)
                    raise TransferError(msg)
                key = self._data_key(snap)
                mac = datamac.tag(key(m.chunk_span(i)[0]), data) if key else b""
                write_frame(self.conn, FrameType.CHUNK, Chunk(i, len(data), self._sums[i], mac).to_body())
                self.server.limits.bucket.take(len(data))
                self.conn.send(data)
                n_bytes += len(data)
            self.server.stats.bytes_sent += n_bytes
            self._check_unchanged(snap)
            write_frame(self.conn, FrameType.END, End(len(resend.chunks), n_bytes, 0).to_body())


class SupplierServer:
    """Serves the partitions of ``storage`` on ``host:port`` to authenticated demanders.

    Runs in a background thread (``start()``) inside a node, or in the foreground
    (``serve_forever()``) for ``ferry transfer serve``. ``limits`` is the node-wide
    sending limit (concurrent transfers, bytes/s), changeable while running."""

    def __init__(self, storage: TransferStorage, secret: bytes, host: str = "127.0.0.1",
                 port: int = 0, *, limits: Limits | None = None, timeout: float = 60.0,
                 handshake_timeout: float = HANDSHAKE_DEADLINE, max_handshakes: int = 64,
                 max_resend_rounds: int = MAX_RESEND_ROUNDS, tls: TlsContexts | None = None) -> None:
        self.storage = storage
        self.secret = secret
        self.tls = tls         # mutual TLS (node and validator certificates) instead of the secret
        self.limits = limits or Limits()
        self.timeout = timeout
        self.handshake_timeout = handshake_timeout
        self.max_resend_rounds = max_resend_rounds
        self.gate = HandshakeGate(max_handshakes)
        self.stats = SupplierStats()
        self._sock = socket.create_server((host, port), backlog=64, reuse_port=False)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sessions: set[threading.Thread] = set()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()[:2]
        return host, port

    def start(self) -> "SupplierServer":
        self._thread = threading.Thread(target=self.serve_forever, name="ferry-supplier", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Accept until stop(); transient accept() failures (out of file descriptors ...)
        are logged and waited out, never the end of the server (transfer.listener)."""
        accept_loop(self._sock, self._stop, self._accepted, log=log, name="supplier")

    def _accepted(self, sock: socket.socket, peer: str) -> None:
        if not self.gate.enter():
            self._refused(peer)
            refuse(sock, f"too many connections waiting to authenticate ({self.gate.limit}); retry")
            return
        # No Nagle: a small CHUNK header after a sendfile must not wait for an ACK.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._start(SocketConn(sock, peer))

    def _refused(self, peer: str) -> None:
        if self.gate.report.due():
            log.warning("supplier: refused %s: %d connections are already in the handshake "
                        "(max_handshakes); %d refused so far", peer, self.gate.limit, self.gate.refused)

    def serve_connection(self, conn: Conn) -> threading.Thread | None:
        """Serve an already connected stream (TCP, or an SSH channel/stdio) in a thread;
        None when too many connections are authenticating (the peer got ERROR BUSY)."""
        if not self.gate.enter():
            self._refused(conn.peer)
            send_error(conn, ErrorCode.BUSY, "too many connections waiting to authenticate; retry")
            conn.close()
            return None
        return self._start(conn)

    def _start(self, conn: Conn) -> threading.Thread:
        """A session thread for a connection already counted by the gate."""
        conn.set_timeout(self.timeout)
        self.stats.sessions += 1
        t = threading.Thread(target=self._run_session, args=(conn,), name=f"ferry-supply-{conn.peer}",
                             daemon=True)
        self._sessions.add(t)
        try:
            t.start()
        except BaseException:
            self._sessions.discard(t)
            self.gate.leave()
            conn.close()
            raise
        return t

    def _run_session(self, conn: Conn) -> None:
        try:
            SupplierSession(self, conn).run()
        finally:
            self._sessions.discard(threading.current_thread())

    def stop(self, wait: float = 5.0) -> None:
        self._stop.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)   # wakes a blocked accept() at once on Linux
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(wait)

    def __enter__(self) -> "SupplierServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
