"""The demander's data stage: CHUNK and PREIMAGE frames up to END, into the temp file.

On a plain TCP socket (the default) each chunk arrives as pieces of whatever the
socket holds, read into the start of one reused buffer (``SocketConn.recv_piece``);
each piece is hashed (xxh3, and Poly1305 on a sealed session, both fed piece by piece)
and written to the temp file while its bytes are still in this core's cache: the raw
receiver's recv + write plus the checks, with no second pass over the bytes.
Alternatives: by splice (``Demander(splice=True)``, transfer.splice: socket -> pipe ->
file, then the chunk hashed back from the page cache by the ChunkSink thread), and, on
other streams (SSH channel, TLS), ``recv_into`` one of several buffers that the
ChunkSink thread writes and hashes. On every path the ChunkSink thread records a chunk
for resume only if it matched; a mismatch is left to the verify stage (re-request).
Mixed into the demander's per-fetch state (_Fetch).
"""
from __future__ import annotations

import bisect
import os
import time
from typing import Protocol

from faults import crashpoint, fileio

from . import datamac, delta
from .errors import ChecksumError, FrameError, PeerClosed
from .frames import ErrorCode, FrameType, read_frame, write_frame
from .limits import Limits, TokenBucket
from .messages import Chunk, End, Manifest, Preimage, Range, Received
from .pipeline import ChunkSink, ChunkSums
from .resume import Receiving, checksum
from .splice import SpliceReceiver, available as splice_available
from .transport import Conn, SocketConn

# RECEIVED is sent per 16 MiB (and for the last chunk), not per chunk: on loopback a
# tiny send runs the peer's TCP work in our syscall and cost as much as the pwrites.
# Acknowledging later only means the supplier keeps saving pre-images a little longer.
ACK_BYTES = 16 << 20


class ReceiveSettings(Protocol):
    """What the data stage reads of its demander (a :class:`~transfer.Demander`)."""

    @property
    def limits(self) -> Limits: ...

    @property
    def splice(self) -> bool: ...


class ReceiveObserver(Protocol):
    """Told of every change to a fetch's temp file (the streaming install: an index
    built while the file arrives). Called from the receive loop and the ChunkSink
    thread; must be quick and must not raise (it is an optimisation: whatever it
    misses, its owner checks against the installed file)."""

    def begin(self, tmp_path: str, page_size: int, page_count: int, chunk_size: int,
              counter: int) -> None:
        """A fetch of a page file starts receiving into ``tmp_path``."""
        ...

    def pages_written(self, first: int, stop: int) -> None:
        """Pages ``first <= i < stop`` of the temp file changed (a chunk, a pre-image,
        a chunk held from an earlier fetch)."""
        ...

    def end(self, ok: bool) -> None:
        """The file is complete and checked, about to be renamed into place (True), or
        the fetch failed (False). Nothing is told after this."""
        ...


class DataStage:
    """The data-stage methods of a fetch; the state (m, rec, conn, d, expected,
    suspect, fresh, counters) belongs to demander._Fetch."""

    d: ReceiveSettings
    m: Manifest | None
    rec: Receiving | None
    conn: Conn | None
    expected: dict[int, int]      # chunk -> checksum at C
    suspect: set[int]             # chunks that failed their checksum (decided in verify)
    fresh: set[int]               # chunks received in this fetch
    macs: dict[int, bytes]        # chunk -> the MAC its CHUNK frame carried (sealed sessions)
    wire: int
    done: int
    preimages: int
    spliced: bool
    observer: ReceiveObserver | None
    cache: str
    partition: int

    def _data_key(self) -> datamac.KeyFor | None:
        """The MAC key of the data at each offset (a sealed session), else None."""
        assert self.m is not None and self.conn is not None
        return datamac.key_for(self.conn.sealer, False, self.cache, self.partition, self.m.counter)

    def _chunk_mac(self, mac: bytes, what: str) -> bytes:
        if self.conn is not None and self.conn.sealer is not None and not mac:
            raise FrameError(ErrorCode.PROTOCOL, f"{what} carries no MAC on a sealed session")
        return mac

    def _tell(self) -> None:        # progress report, defined by the fetch
        raise NotImplementedError

    def _read_data(self, acknowledge: bool = False) -> End:
        """Read CHUNK/PREIMAGE frames up to END; with ``acknowledge``, tell the supplier
        every ACK_BYTES that the bytes are out of the socket (RECEIVED). Chunks are
        written, hashed and recorded by a ChunkSink thread while the next one arrives (by
        this thread when chunk 0 is the only one that can come)."""
        m, rec = self.m, self.rec
        assert m is not None and rec is not None and self.conn is not None
        bucket = self.d.limits.bucket
        last_tell = 0.0
        # the supplier sends exactly the chunks its MANIFEST does not skip
        last_expected = max((i for i in range(m.chunk_count) if i not in m.skip), default=-1)
        unacked = 0
        splicer = self._splicer()
        self.spliced = splicer is not None
        # one thread, one pass: on plain TCP without splice each chunk comes in pieces,
        # each hashed (and MACed) while its bytes are in this core's cache and written
        # from there (_stream_chunk); the sink thread only records the chunk
        inline = splicer is None and isinstance(self.conn, SocketConn)
        sink = ChunkSink(m.chunk_size, self._write_chunk, self._chunk_done,
                         depth=4 if splicer or inline else 3, in_file=rec.fd if splicer else None,
                         checked=inline, threaded=last_expected > 0)
        key = self._data_key()
        try:
            while True:
                frame = read_frame(self.conn, expect=[FrameType.CHUNK, FrameType.PREIMAGE, FrameType.END])
                if frame.type == FrameType.END:
                    sink.drain()
                    rec.flush()
                    return End.from_body(frame.body)
                if frame.type == FrameType.PREIMAGE:
                    sink.drain()      # a pre-image goes over its chunk's bytes, never under
                    self._preimage(Preimage.from_body(frame.body))
                    continue
                ch = Chunk.from_body(frame.body)
                if ch.index >= m.chunk_count or ch.length != m.chunk_span(ch.index)[1] or \
                        ch.index in m.skip or self.expected.setdefault(ch.index, ch.checksum) != ch.checksum:
                    raise FrameError(ErrorCode.PROTOCOL, f"CHUNK {ch.index} of {ch.length} bytes does not "
                                     f"fit the manifest ({m.chunk_count} chunks of {m.chunk_size}, "
                                     f"{len(m.skip)} skipped) or changed its checksum")
                buf = sink.buffer()
                off = ch.index * m.chunk_size
                self.macs[ch.index] = self._chunk_mac(ch.mac, f"CHUNK {ch.index}")
                if splicer is not None:
                    self._splice_chunk(splicer, ch, bucket)
                elif inline:
                    ok = self._stream_chunk(ch, off, key, bucket)
                else:
                    view = buf[:ch.length]
                    if bucket.rate:          # slices of ~1/20 s, so the rate stays smooth
                        step = bucket.slice_size(ch.length)
                        for lo in range(0, ch.length, step):
                            self.conn.recv_fill(view[lo:lo + step])
                            bucket.take(len(view[lo:lo + step]))
                    else:
                        self.conn.recv_fill(view)
                self.wire += ch.length
                if inline:
                    sink.put_checked(buf, ch.index, off, ch.length, ch.checksum, ok)
                else:
                    sink.put(buf, ch.index, off, ch.length, ch.checksum, key(off) if key else None, ch.mac)
                unacked += ch.length
                if acknowledge and (unacked >= ACK_BYTES or ch.index == last_expected):
                    if not self.conn.peer_closed():      # else keep reading what arrived
                        write_frame(self.conn, FrameType.RECEIVED, Received(ch.index).to_body())
                    unacked = 0
                now = time.monotonic()
                if now - last_tell > 0.1:
                    last_tell = now
                    self._tell()
        finally:
            sink.close()
            if splicer is not None:
                splicer.close()
            if inline and isinstance(self.conn, SocketConn):
                self.conn.drop_read_buffer()

    def _stream_chunk(self, ch: Chunk, off: int, key: datamac.KeyFor | None,
                      bucket: TokenBucket) -> bool:
        """Receive CHUNK ``ch``'s bytes piece by piece into the temp file at ``off``;
        True if its checksum (and on a sealed session its MAC) matched."""
        conn, rec = self.conn, self.rec
        assert isinstance(conn, SocketConn) and rec is not None
        rec.forget(ch.index)            # its old bytes stop counting as held, then go
        sums = ChunkSums(key(off) if key is not None else None)
        # under a rate limit, pieces of at most ~1/20 s of data so the rate stays smooth
        step = bucket.slice_size(ch.length) if bucket.rate else ch.length
        got = 0
        while got < ch.length:
            piece = conn.recv_piece(min(step, ch.length - got))
            if not piece:
                raise PeerClosed(f"connection closed by {conn.peer} after {got} of "
                                 f"{ch.length} bytes of data")
            sums.update(piece)
            rec.write_at(off + got, piece)
            got += len(piece)
            if bucket.rate:
                bucket.take(len(piece))
        return sums.matches(ch.checksum, ch.mac)

    # -- a delta fetch (transfer.delta) ---------------------------------------------
    def _read_ranges(self) -> End:
        """RANGE frames (each followed by its pages) and then PREIMAGE frames up to END,
        into the temp file that holds the base. A range whose checksum at C does not
        match what arrived is suspect: a pre-image may still restore it (verify)."""
        m, rec, conn = self.m, self.rec, self.conn
        assert m is not None and rec is not None and conn is not None
        ps, bucket = m.page_size, self.d.limits.bucket
        self.ranges: list[tuple[int, int, int]] = []     # (first page, pages, checksum at C)
        self.range_macs: list[bytes] = []
        key = self._data_key()
        self.suspect_ranges: set[int] = set()
        self.touched: set[int] = set()                   # pages written by pre-images
        buf = bytearray(0)
        next_page = pages = unacked = 0
        last_tell = 0.0
        while True:
            frame = read_frame(conn, expect=[FrameType.RANGE, FrameType.PREIMAGE, FrameType.END])
            if frame.type == FrameType.END:
                end = End.from_body(frame.body)
                if len(self.ranges) != m.ranges or pages != m.delta_pages or end.chunks_sent != m.ranges:
                    raise FrameError(ErrorCode.PROTOCOL, f"END after {len(self.ranges)} ranges of "
                                     f"{pages} pages; the MANIFEST announced {m.ranges} of {m.delta_pages}")
                return end
            if frame.type == FrameType.PREIMAGE:
                pre = Preimage.from_body(frame.body)
                self._preimage_page(pre)
                continue
            r = Range.from_body(frame.body)
            if self.touched or r.first < next_page or r.first + r.pages > m.page_count or \
                    len(self.ranges) >= m.ranges:
                raise FrameError(ErrorCode.PROTOCOL, f"RANGE of pages {r.first}..{r.first + r.pages - 1} "
                                 f"does not fit the manifest ({m.page_count} pages, {m.ranges} ranges, "
                                 f"next page {next_page}, after a pre-image: {bool(self.touched)})")
            n = r.pages * ps
            if len(buf) < n:
                buf = bytearray(n)
            view = memoryview(buf)[:n]
            step = bucket.slice_size(n) if bucket.rate else n
            for lo in range(0, n, step):
                conn.recv_fill(view[lo:lo + step])
                if bucket.rate:
                    bucket.take(len(view[lo:lo + step]))
            rec.write_at(r.first * ps, view)
            mac = self._chunk_mac(r.mac, f"RANGE of page {r.first}")
            if checksum(view) != r.checksum or (key is not None and not datamac.same(
                    datamac.tag(key(r.first * ps), view), mac)):
                self.suspect_ranges.add(len(self.ranges))
            self.ranges.append((r.first, r.pages, r.checksum))
            self.range_macs.append(mac)
            if self.observer is not None:
                self.observer.pages_written(r.first, r.first + r.pages)
            next_page, pages = r.first + r.pages, pages + r.pages
            self.wire += n
            self.done += n
            unacked += n
            if unacked >= ACK_BYTES or len(self.ranges) == m.ranges:
                if not conn.peer_closed():
                    write_frame(conn, FrameType.RECEIVED, Received(len(self.ranges) - 1).to_body())
                unacked = 0
            crashpoint("demander.mid_delta_receive")
            now = time.monotonic()
            if now - last_tell > 0.1:
                last_tell = now
                self._tell()

    def _preimage_page(self, pre: Preimage) -> None:
        m, rec = self.m, self.rec
        assert m is not None and rec is not None
        if pre.page >= m.page_count or len(pre.data) != m.page_size:
            raise FrameError(ErrorCode.PROTOCOL, f"pre-image of page {pre.page} "
                             f"({len(pre.data)} bytes) does not fit the manifest")
        rec.write_at(pre.page * m.page_size, pre.data)
        self.touched.add(pre.page)
        at = bisect.bisect_right(self.ranges, (pre.page, 1 << 62, 0)) - 1
        if at >= 0 and self.ranges[at][0] + self.ranges[at][1] > pre.page:
            self.suspect_ranges.add(at)
        if self.observer is not None:
            self.observer.pages_written(pre.page, pre.page + 1)
        self.preimages += 1
        self.wire += len(pre.data)

    def _verify_ranges(self, base: bytes) -> None:
        """Every suspect range now matches its checksum at C, and the file's page
        digests (the base's, with every page written in this fetch taken again from the
        temp file) have the supplier's root: else nothing is installed."""
        m, rec = self.m, self.rec
        assert m is not None and rec is not None
        ps = m.page_size
        key = self._data_key()
        for i in sorted(self.suspect_ranges):
            first, count, want = self.ranges[i]
            data = os.pread(rec.fd, count * ps, first * ps)
            if checksum(data) != want or (key is not None and not datamac.same(
                    datamac.tag(key(first * ps), data), self.range_macs[i])):
                raise ChecksumError(f"pages {first}..{first + count - 1} of partition {m.page_count}-page "
                                    "file arrived corrupted (the checksum at C does not match after the "
                                    "pre-images); nothing installed", "wire")
        digests = bytearray(base[:m.page_count * delta.DIGEST])
        digests.extend(bytes(m.page_count * delta.DIGEST - len(digests)))
        d = delta.DIGEST
        for first, count, _ in self.ranges:
            digests[first * d:(first + count) * d] = delta.page_digests(
                os.pread(rec.fd, count * ps, first * ps), ps)
        for page in self.touched:
            digests[page * d:(page + 1) * d] = delta.page_digests(os.pread(rec.fd, ps, page * ps), ps)
        if delta.root(digests) != m.root:
            raise ChecksumError("the file built from this side's copy and the received pages "
                                "differs from the supplier's at C (root digest mismatch); "
                                "nothing installed", "delta")

    def _splicer(self) -> SpliceReceiver | None:
        """The zero-copy receiver, where it applies: a plain socket, Linux, and the real
        file layer (a swapped-in layer must see every write)."""
        conn, rec = self.conn, self.rec
        assert rec is not None
        # (not while bytes read ahead wait in the connection: splice reads the socket)
        if not (self.d.splice and splice_available() and isinstance(conn, SocketConn)
                and not conn.pending() and type(rec.io) is fileio.FileLayer):
            return None
        return SpliceReceiver(conn.sock.fileno(), conn.sock.gettimeout(), conn.peer)

    def _splice_chunk(self, splicer: SpliceReceiver, ch: Chunk, bucket: TokenBucket) -> None:
        """Socket -> temp file, no user-space copy; the ChunkSink hashes it from there."""
        m, rec = self.m, self.rec
        assert m is not None and rec is not None
        rec.forget(ch.index)            # its old bytes stop counting as held, then go
        off = ch.index * m.chunk_size
        step = bucket.slice_size(ch.length) if bucket.rate else ch.length
        for lo in range(0, ch.length, step):
            k = min(step, ch.length - lo)
            splicer.receive(rec.fd, off + lo, k, rec.write_error)
            if bucket.rate:
                bucket.take(k)

    def _write_chunk(self, offset: int, data: memoryview) -> None:
        """(ChunkSink thread) the chunk's old bytes stop counting as held, then go."""
        assert self.m is not None and self.rec is not None
        self.rec.forget(offset // self.m.chunk_size)
        self.rec.write_at(offset, data)

    def _chunk_done(self, index: int, length: int, expected: int, ok: bool) -> None:
        """(ChunkSink thread) record a chunk that matched; a mismatch may be the wire or a
        page written after C that a pre-image will restore: decided in verify."""
        assert self.rec is not None and self.m is not None
        self.fresh.add(index)
        if self.observer is not None:
            off, ps = index * self.m.chunk_size, self.m.page_size
            self.observer.pages_written(off // ps, -(-(off + length) // ps))
        if ok:
            self.suspect.discard(index)
            self.rec.verified(index, length, expected)
            self.done += length
        else:
            self.suspect.add(index)
        crashpoint("demander.mid_receive")

    def _preimage(self, pre: Preimage) -> None:
        m, rec = self.m, self.rec
        assert m is not None and rec is not None
        if pre.page >= m.page_count or len(pre.data) != m.page_size:
            raise FrameError(ErrorCode.PROTOCOL, f"pre-image of page {pre.page} "
                             f"({len(pre.data)} bytes) does not fit the manifest")
        chunk = pre.page * m.page_size // m.chunk_size
        rec.forget(chunk)
        self.suspect.add(chunk)
        rec.write_at(pre.page * m.page_size, pre.data[:max(0, m.size - pre.page * m.page_size)])
        if self.observer is not None:
            self.observer.pages_written(pre.page, pre.page + 1)
        self.preimages += 1
        self.wire += len(pre.data)
