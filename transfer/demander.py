"""The demander: fetches one partition from a supplier and installs it, verified.

Stages (see docs/protocol.md): reserve -> connect -> handshake -> demand -> manifest
-> accept (free-disk check) -> receive (chunks, pre-images) -> verify (re-request bad
chunks) -> install -> applied. Data lands in ``part-<p>.bin.ferry-tmp`` next to the
target; verified chunks are recorded durably (transfer.resume), so a later fetch of
the same partition sends what it holds and only missing or changed chunks travel.
Nothing is installed unless every chunk matches its checksum and every page passes
the storage's page check; on failure the temp file stays for resume, never installed.
"""
from __future__ import annotations

import contextlib

import logging
import os
import stat
import time
from typing import Callable

from faults import FerryError, crashpoint

from .auth import client_handshake
from .errors import (AuthError, ChecksumError, FrameError, OutOfDiskError, PageCheckError, PeerClosed,
                     RemoteError, TransferError)
from .frames import ErrorCode, FrameType, read_frame, send_error, write_frame
from .limits import Limits
from . import datamac, delta
from .connpool import POOL, ConnPool, Kept
from .messages import (BASE_PER_FRAME, Base, Demand, Manifest, Priority, Queued, Resend,
                       check_cache, check_partition)
from .result import FetchResult, Progress, free_bytes
from .receive import DataStage, ReceiveObserver
from .resume import Receiving, checksum, partial_paths
from .stages import Stages
from .storage import DEFAULT_CACHE, BadPage, TransferStorage
from .tls import PATH_CHANNEL, PATH_SENDFILE, TlsContexts, TlsConn
from .transport import Conn, SocketConn, connect_tcp, parse_hostport

log = logging.getLogger("ferry.transfer")

DEFAULT_CHUNK = 4 << 20
DEFAULT_MARGIN = 64 << 20


class Demander:
    """Fetches partitions from one supplier ``peer`` ("host:port") into ``storage``.

    ``connect`` replaces the plain TCP connection (e.g. transfer.ssh's tunnel);
    ``limits`` is the node-wide receiving limit shared by all demanders of a node;
    ``margin`` bytes of free disk must remain beyond the partition and
    ``reserve_extra`` (the caller's own needs during the move, e.g. its temp WAL);
    ``splice=True`` receives chunk data by splice (transfer.splice) where it can,
    instead of the default one-pass copy (transfer.receive); ``observer`` (a
    :class:`~transfer.receive.ReceiveObserver`) is told of every page written to the temp file of a page-file fetch (the streaming
    install builds the partition's index from them while the file arrives)."""

    def __init__(self, storage: TransferStorage, peer: str, secret: bytes, *,
                 limits: Limits | None = None, connect: Callable[[], Conn] | None = None,
                 chunk_size: int = DEFAULT_CHUNK, timeout: float = 60.0,
                 margin: int = DEFAULT_MARGIN, max_resends: int = 3,
                 sync_bytes: int = 32 << 20, splice: bool = False,
                 observer: ReceiveObserver | None = None, delta: bool = True,
                 delta_limit: int = 500, tls: TlsContexts | None = None,
                 tls_peer: str | None = None, reuse: bool | None = None,
                 pool: ConnPool | None = None, adopt: bool = False) -> None:
        self.storage = storage
        self.tls = tls               # mutual TLS instead of the secret's handshake
        self.tls_peer = tls_peer     # the node id the supplier's certificate must name
        self.peer = peer
        self.secret = secret
        self.limits = limits or Limits(max_transfers=1 << 30)
        self._connect = connect or (lambda: connect_tcp(*parse_hostport(peer), timeout=timeout))
        self.chunk_size = chunk_size
        self.timeout = timeout
        self.margin = margin
        self.max_resends = max_resends
        self.sync_bytes = sync_bytes
        self.splice = splice
        self.observer = observer
        self.delta = delta                # offer this side's older copy as a delta base
        self.delta_limit = delta_limit    # permille of the pages a delta may send at most
        # a delta fetch takes the storage's older file as its temp file (``adopt_base``)
        # instead of copying it: for a holder that replaces the partition whatever
        # happens (a node's MOVING copy); a failed fetch then leaves the older copy only
        # as the next fetch's base, not as the partition
        self.adopt = adopt
        # ``reuse`` (None: as the process's pool says, POOL.enabled): the connections
        # this class makes (TCP) are kept for the next fetch from the same supplier
        # (transfer.connpool); a caller's own transport (``connect``) never is
        pool = pool or POOL
        self.pool = pool if (pool.enabled if reuse is None else reuse) and connect is None else None
        self.pool_key = (peer, secret, id(tls) if tls is not None else None, tls_peer)

    def fetch(self, partition: int, *, cache: str = DEFAULT_CACHE,
              progress: Callable[[Progress], None] | None = None,
              priority: int = Priority.REBALANCE, reserve_extra: int = 0) -> FetchResult:
        check_cache(cache)
        check_partition(partition)
        run = _Fetch(self, cache, partition, progress or (lambda p: None), priority, reserve_extra)
        return run.run()


class _Fetch(DataStage):
    """One fetch of one partition; attributes are its state across the stages."""

    def __init__(self, d: Demander, cache: str, partition: int,
                 progress: Callable[[Progress], None], priority: int, reserve_extra: int) -> None:
        self.d: Demander = d      # the data stage sees it as a ReceiveSettings
        self.cache, self.partition = cache, partition
        self.progress, self.priority, self.reserve_extra = progress, priority, reserve_extra
        self.stages = Stages()
        self.conn: Conn | None = None
        self.rec: Receiving | None = None
        self.m: Manifest | None = None
        self.wire = 0
        self.reused = 0
        self.preimages = 0
        self.resent = 0
        self.release_slot: Callable[[], None] = lambda: None   # set by run() once the slot is held
        self.done = 0
        self.spliced = False     # whether the last data stage used the zero-copy path
        self.prepared = None     # the storage's checked install (prepare_install), if any
        # told of the temp file's pages (page files only: plain files have no pages)
        self.observer = d.observer if d.storage.verifies_pages else None
        self.base: bytes | None = None      # the digests of the base's pages (a delta fetch)
        self.base_page_size = 0
        self.mode = "full"
        self.delta_refused = ""
        self.kept: Kept | None = None       # the connection, when it may be kept after
        self.conn_reused = False            # it carried an earlier fetch

    def _tell(self) -> None:
        total = self.m.size if self.m else 0
        self.progress(Progress(self.partition, self.stages.current, self.done, total, self.wire))

    def run(self) -> FetchResult:
        t0 = time.perf_counter()
        ctx = {"partition": self.partition, "peer": self.d.peer}
        try:
            with contextlib.ExitStack() as held:
                # the slot is held while bytes come from the wire (resends included) and
                # given back before the page check and install, which are this side's
                # CPU and disk alone: the next transfer's bytes flow meanwhile. The
                # "reserve" timer counts only the wait for it.
                with self.stages.stage("reserve", **ctx):
                    held.enter_context(self.d.limits.slots.acquire(self.priority))
                self.release_slot = held.close
                self._tell()
                with self.stages.stage("base", **ctx):
                    self._open()
                self._open_conn(ctx)
                self._demand_on_reused(ctx)
                with self.stages.stage("accept", **ctx):
                    self._accept()
                with self.stages.stage("receive", **ctx):
                    self._receive()
                with self.stages.stage("verify", **ctx):
                    self._verify()
                with self.stages.stage("install", **ctx):
                    self._install()
                with self.stages.stage("applied", **ctx):
                    assert self.conn is not None
                    write_frame(self.conn, FrameType.APPLIED, {"ok": True})
                    self._tell()
        except BaseException as e:
            self._abort(e)
            if self.conn is not None:
                self.conn.close()
            raise
        self._release_conn()
        assert self.m is not None
        m = self.m
        res = FetchResult(self.partition, self.cache, m.size, self.wire, self.reused,
                          time.perf_counter() - t0, True, m.counter, self.preimages,
                          self.resent, dict(self.stages.seconds), self.spliced, self.mode,
                          m.page_count if self.d.storage.verifies_pages else 0,
                          m.delta_pages if m.delta else 0, self.delta_refused, self._path())
        log.info("demander: partition %s installed from %s: %s bytes, %s over the wire, %.1f MB/s",
                 self.partition, self.d.peer, res.bytes, res.bytes_wire, res.mb_per_s)
        return res

    # -- the connection: kept from an earlier fetch, or new -------------------------
    def _take_conn(self) -> None:
        pool = self.d.pool
        kept = pool.take(self.d.pool_key, (self.cache, self.partition)) if pool is not None else None
        if kept is not None:
            self.kept, self.conn, self.conn_reused = kept, kept.conn, True
            self.conn.set_timeout(self.d.timeout)

    def _new_conn(self) -> None:
        self.conn = self.d._connect()
        self.conn.set_timeout(self.d.timeout)
        self.conn_reused = False
        self.kept = Kept(self.conn) if self.d.pool is not None else None

    def _open_conn(self, ctx: dict[str, object], *, fresh: bool = False) -> None:
        """A kept connection (unless ``fresh``) or a new one, authenticated."""
        with self.stages.stage("connect", **ctx):
            if not fresh:
                self._take_conn()
            if self.conn is None:
                self._new_conn()
        if not self.conn_reused:        # (a kept connection is authenticated)
            with self.stages.stage("handshake", **ctx):
                self._authenticate()

    def _demand_on_reused(self, ctx: dict[str, object]) -> None:
        """DEMAND and MANIFEST. On a kept connection the supplier may have closed it
        just now (its idle end): then once more on a new connection. Nothing has
        changed on either side by then (the supplier opens its snapshot after the
        DEMAND and closes it when the connection ends)."""
        while True:
            t0 = time.monotonic()
            try:
                with self.stages.stage("demand", **ctx):
                    self._demand()
                with self.stages.stage("manifest", **ctx):
                    self._manifest()
                return
            except PeerClosed:
                # closed at once (not a timeout: that would take the timeout again)
                if not self.conn_reused or self.m is not None or \
                        time.monotonic() - t0 > min(1.0, self.d.timeout / 2):
                    raise
            assert self.conn is not None
            log.info("demander: partition %s: the kept connection to %s was closed; connecting again",
                     self.partition, self.d.peer)
            self.conn.close()
            self.conn = None
            self._open_conn(ctx, fresh=True)       # not kept: conn_reused is False from here

    def _release_conn(self) -> None:
        """After a fetch that ended well: keep the connection for the next one, else
        close it."""
        conn, kept, pool = self.conn, self.kept, self.d.pool
        if conn is None:
            return
        if kept is None or pool is None:
            conn.close()
            return
        kept.conn = conn                       # (TLS wraps the TCP connection)
        kept.carried.add((self.cache, self.partition))
        pool.give(self.d.pool_key, kept)

    def _authenticate(self) -> None:
        conn = self.conn
        assert conn is not None
        tls = self.d.tls
        if tls is None:
            client_handshake(conn, self.d.secret)
            return
        if not isinstance(conn, SocketConn):
            raise AuthError(f"TLS to {conn.peer} needs a TCP connection (not a tunnel)",
                            stage="handshake", peer=conn.peer)
        self.conn = tls.connect(conn.sock, conn.peer, deadline=self.d.timeout, expect=self.d.tls_peer)
        self.conn.set_timeout(self.d.timeout)

    def _path(self) -> str:
        """Which way the file data came: by sendfile in clear, encrypted through user
        space (TLS), or through a byte channel (SSH)."""
        if isinstance(self.conn, TlsConn):
            return self.conn.data_path
        return PATH_SENDFILE if isinstance(self.conn, SocketConn) else PATH_CHANNEL

    def _abort(self, e: BaseException) -> None:
        """Tell the supplier why (unless it told us), keep what is verified for resume."""
        if self.conn is not None and not isinstance(e, (RemoteError, PeerClosed)):
            code = (e.code if isinstance(e, FrameError) else ErrorCode.NO_SPACE
                    if isinstance(e, OutOfDiskError) else ErrorCode.CHECKSUM
                    if isinstance(e, ChecksumError) else ErrorCode.ABORTED)
            send_error(self.conn, code, str(e))
        if self.rec is not None:
            try:
                self.rec.flush()
            except (OSError, FerryError) as fe:   # the disk may be what failed; the journal
                # is only an optimisation
                log.info("resume journal of partition %d not flushed: %s", self.partition, fe)
            if self.rec.held or (self.d.adopt and self.base is not None):
                # kept for resume, or as the next fetch's base: an adopted base is the
                # only older copy this side has left
                self.rec.close()
            else:
                self.rec.discard_journal()   # nothing worth keeping: leave no litter
        if self.prepared is not None:
            prepared, self.prepared = self.prepared, None
            prepared.close()
        self._observer_end(False)
        reason = e.reason if isinstance(e, TransferError) else repr(e)
        log.warning("demander: transfer failed at stage %s, partition %s, peer %s: %s",
                    self.stages.current, self.partition, self.d.peer, reason)

    # -- stages ------------------------------------------------------------------
    def _open(self) -> None:
        """The temp file: resumed from the chunks an earlier fetch verified, else (a
        delta fetch) holding this side's older copy of the partition, whose page
        digests are offered as the base. With ``adopt`` and a storage that can hand its
        file over (``adopt_base``: the node's page store), the file is renamed to the
        temp file, which the fetch then writes in place: nothing of the base is copied,
        and the install's fsync writes only the pages received. Where it holds no file
        (an earlier attempt already took it), what that attempt left in the temp file
        is the base. Otherwise the file is copied into the temp file
        (:func:`delta.copy_base`) and stays the partition until the install."""
        target = self.d.storage.target_path(self.cache, self.partition)
        if not os.path.isdir(os.path.dirname(target)):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            # asked again now that the directory exists: a link made meanwhile is refused
            target = self.d.storage.target_path(self.cache, self.partition)
        chunk = Receiving.stored_chunk_size(target) or self.d.chunk_size
        self.rec = Receiving(target, chunk, sync_bytes=self.d.sync_bytes)
        if self.rec.held:
            self.mode = "resume"
            return
        page_size = getattr(self.d.storage, "base_page_size", None)
        if not (self.d.delta and self.d.storage.verifies_pages and page_size is not None):
            return
        ps = page_size(self.cache)
        adopt = getattr(self.d.storage, "adopt_base", None) if self.d.adopt else None
        if adopt is not None:
            # nothing held to resume: a journal here describes no chunk of what follows
            self.rec.close()
            self.rec.drop_journal()
            self.rec = None
            adopt(self.cache, self.partition, partial_paths(target)[0])
            self.rec = Receiving(target, self.d.chunk_size, sync_bytes=self.d.sync_bytes)
            try:
                digests = delta.base_digests(self.rec.fd, ps, io=self.rec.io)
            except OSError as e:
                raise self.rec.write_error(e, None) from e
            if digests:
                self.base, self.base_page_size = digests, ps
            return
        try:
            # the installed copy, only if it is a regular file (never through a link,
            # never waiting on a FIFO)
            src = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return                              # nothing held here: a full fetch
        try:
            if not stat.S_ISREG(os.fstat(src).st_mode):
                return
            digests = delta.copy_base(src, self.rec.fd, ps, io=self.rec.io)
        except OSError as e:
            raise self.rec.write_error(e, None) from e
        finally:
            os.close(src)
        if digests:
            self.base, self.base_page_size = digests, ps

    def _demand(self) -> None:
        assert self.conn is not None and self.rec is not None   # connected and opened by run()
        held = self.rec.held_checksums()
        self.offered = held
        base = self.base or b""
        pages = len(base) // delta.DIGEST
        write_frame(self.conn, FrameType.DEMAND,
                    Demand(self.cache, self.partition, self.priority, self.rec.chunk_size, held,
                           pages, self.base_page_size, self.d.delta_limit).to_body())
        step = BASE_PER_FRAME * delta.DIGEST
        for lo in range(0, len(base), step):
            write_frame(self.conn, FrameType.BASE,
                        Base(lo // delta.DIGEST, base[lo:lo + step]).to_body())

    def _manifest(self) -> None:
        assert self.conn is not None      # connected by run() before this stage
        while True:
            frame = read_frame(self.conn, expect=[FrameType.QUEUED, FrameType.MANIFEST])
            if frame.type == FrameType.QUEUED:
                Queued.from_body(frame.body)
                self.stages.current = "queued"
                self._tell()
                self.stages.current = "manifest"
                continue
            m = Manifest.from_body(frame.body)
            break
        assert self.rec is not None
        if m.chunk_size != self.rec.chunk_size:
            raise FrameError(ErrorCode.PROTOCOL, f"supplier chose chunk size {m.chunk_size}, "
                             f"demanded {self.rec.chunk_size}")
        if m.size > m.page_count * m.page_size:
            raise FrameError(ErrorCode.PROTOCOL, f"manifest size {m.size} exceeds its "
                             f"{m.page_count} pages of {m.page_size} bytes")
        self.delta_refused = m.delta_refused
        if m.delta:
            if self.base is None or m.page_size != self.base_page_size:
                raise FrameError(ErrorCode.PROTOCOL, "a delta MANIFEST answers a DEMAND that "
                                 "offered no base of that page size")
            self.mode = "delta"
            self.expected = {}
            self.m = m
            return
        if m.chunk_count <= 1:
            # nothing to resume from: no journal, a crash fetches it again
            self.rec.without_journal()
        if self.base is not None:
            log.info("demander: partition %s: the whole file follows (%s)", self.partition,
                     m.delta_refused or "the supplier offers no delta")
        # chunk -> checksum at C: the held ones the supplier confirmed (skip), then each
        # sent chunk's from its CHUNK frame.
        self.expected: dict[int, int] = {}
        for i in m.skip:
            held = self.rec.held.get(i)
            if i not in self.offered or held is None or held[0] != m.chunk_span(i)[1]:
                raise FrameError(ErrorCode.PROTOCOL, f"MANIFEST skips chunk {i}, which this side "
                                 "did not offer with that length")
            self.expected[i] = held[1]
        self.m = m

    def _accept(self) -> None:
        m, rec = self.m, self.rec
        assert m is not None and rec is not None and self.conn is not None
        self.reused = (sum(m.chunk_span(i)[1] for i in m.skip) if not m.delta
                       else (m.page_count - m.delta_pages) * m.page_size)
        self.done = self.reused
        have = os.fstat(rec.fd).st_blocks * 512
        needed = max(0, m.size - have) + self.reserve_extra + self.d.margin
        free = free_bytes(os.path.dirname(rec.tmp_path))
        if free < needed:
            raise OutOfDiskError(rec.tmp_path, needed,
                                 f"only {free} bytes free for partition {self.partition} "
                                 f"({m.size} bytes, {self.reused} already held, margin {self.d.margin})")
        write_frame(self.conn, FrameType.ACCEPT, {})
        if self.observer is not None:
            self.observer.begin(rec.tmp_path, m.page_size, m.page_count, m.chunk_size, m.counter)
            ps = m.page_size
            if m.delta and self.base:        # the base's pages: already in the file
                self.observer.pages_written(0, min(m.page_count, len(self.base) // delta.DIGEST))
            for i in sorted(m.skip):         # held from an earlier fetch: already in the file
                off, n = m.chunk_span(i)
                self.observer.pages_written(off // ps, -(-(off + n) // ps))
        self._tell()

    def _receive(self) -> None:
        m = self.m
        assert m is not None
        self.suspect: set[int] = set()
        self.fresh: set[int] = set()       # chunks received in this fetch
        self.macs: dict[int, bytes] = {}   # chunk -> the MAC its CHUNK frame carried
        try:
            if m.delta:
                self._read_ranges()
            else:
                self._read_data(acknowledge=True)
        except RemoteError as e:
            if e.code == ErrorCode.SOURCE_CHANGED:
                raise ChecksumError(f"the supplier's file changed during the transfer: {e.reason}",
                                    "source") from None
            raise
        # Pages overwritten at the source after C arrive as pre-images after the data.

    def _verify(self) -> None:
        m, rec = self.m, self.rec
        assert m is not None and rec is not None and self.conn is not None
        if m.delta:
            assert self.base is not None
            self._verify_ranges(self.base)
            self.done = m.size
            self._tell()
            self.release_slot()
            self._check_pages()
            return
        key = self._data_key()
        for attempt in range(self.d.max_resends + 1):
            bad = []
            for i in range(m.chunk_count):
                want = self.expected.get(i)
                if want is None:
                    raise FrameError(ErrorCode.PROTOCOL, f"the supplier ended without sending chunk {i} "
                                     "(not skipped by its MANIFEST)")
                if i not in self.suspect and (i in self.fresh or i in m.skip):
                    continue          # verified on arrival or held (its record may be pending)
                off, n = m.chunk_span(i)
                data = os.pread(rec.fd, n, off)
                if len(data) == n and checksum(data) == want and (
                        key is None or datamac.same(datamac.tag(key(off), data), self.macs.get(i, b""))):
                    rec.verified(i, n, want)
                    self.suspect.discard(i)
                    self.fresh.add(i)
                else:
                    bad.append(i)
            rec.flush()
            if not bad:
                self.done = m.size
                self._tell()
                break
            if attempt == self.d.max_resends:
                raise ChecksumError(
                    f"chunk(s) {bad[:8]} of partition {self.partition} failed their checksum "
                    f"{self.d.max_resends + 1} times while the supplier confirmed its source "
                    "matches the manifest: the data is being corrupted on the wire "
                    "(network, NIC or proxy); the verified chunks are kept for resume", "wire")
            log.warning("demander: partition %s: %d chunk(s) failed their checksum (%s...), "
                        "re-requesting (attempt %d)", self.partition, len(bad), bad[:4], attempt + 1)
            self.resent += len(bad)
            for i in bad:
                self.suspect.add(i)
            write_frame(self.conn, FrameType.RESEND, Resend(tuple(bad)).to_body())
            try:
                self._read_data()
            except RemoteError as e:
                if e.code == ErrorCode.SOURCE_CHANGED:
                    raise ChecksumError(f"the supplier's file changed during the transfer: {e.reason}",
                                        "source") from None
                raise
        self.release_slot()
        self._check_pages()

    def _check_pages(self) -> None:
        m, rec = self.m, self.rec
        assert m is not None and rec is not None
        if not self.d.storage.verifies_pages:
            return
        prepare = getattr(self.d.storage, "prepare_install", None)
        if prepare is not None:
            # The storage's install scan checks every page in the pass that builds the
            # partition's key index: the file is read and checked once, not twice.
            rec.flush()
            rec.finish(m.size)
            try:
                self.prepared = prepare(self.cache, self.partition, rec.tmp_path)
            except BadPage as e:
                self._bad_page(e.page, e.reason)
            return
        ps = m.page_size
        block = max(ps, (4 << 20) // ps * ps)
        for off in range(0, m.size, block):
            data = os.pread(rec.fd, min(block, m.size - off), off)
            for k in range(0, len(data), ps):
                page = (off + k) // ps
                why = self.d.storage.check_page(data[k:k + ps], page, ps)
                if why is not None:
                    self._bad_page(page, why)

    def _bad_page(self, page: int, why: str) -> None:
        assert self.rec is not None
        # The chunk checksums matched, so the source itself holds this page.
        self.rec.discard_journal()
        self.rec = None
        raise PageCheckError(f"page {page} of partition {self.partition} is bad at the "
                             f"source ({why}); nothing installed")

    def _observer_end(self, ok: bool) -> None:
        obs, self.observer = self.observer, None
        if obs is not None:
            obs.end(ok)

    def _install(self) -> None:
        m, rec = self.m, self.rec
        assert m is not None and rec is not None
        if self.prepared is None:
            rec.flush()
            rec.finish(m.size)
        self._observer_end(True)         # before the rename: the temp file's name goes
        crashpoint("demander.before_install")
        rec.check_in_place()        # only the file received is renamed into place
        rec.close()
        if self.prepared is not None:
            prepared, self.prepared = self.prepared, None
            self.d.storage.install(self.cache, self.partition, rec.tmp_path, prepared)
        else:
            self.d.storage.install(self.cache, self.partition, rec.tmp_path)
        rec.discard_journal()
        self.rec = None
        self.done = m.size
