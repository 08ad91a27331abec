"""A power cut over a whole files move of a partition, in process: the demander's
temp WAL, the install of the partition file, its index (LMDB) and the node's partition
state log all in play at once.

The real move engine (``node.move.MoveEngine``) runs against a real supplier
(``transfer.SupplierServer`` over the node's supplier storage, with a shipped-index
exporter) in another folder, while a writer thread plays the primary: each update is
applied to the supplier's copy and, once the demander has registered, replicated to
the move (``MoveEngine.buffer_update``: the temp WAL, or the direct path after the
replay), under the primary's partition lock as a node does. An update counts as
acknowledged when that call returned (a real backup answers the primary then).

The demander's whole data folder is on the power-loss file layer
(``faults.powerloss``). At a crash point the move passes, the power goes: from that
instant no write, fsync, rename or unlink of the demander reaches its disk (they fail
with EIO while the threads unwind), and ``cut()`` leaves only what was durable
(``keep_unsynced`` > 0: plus a seeded subset of the unsynced writes). The folder is
then opened again the way a node starts (``CacheData`` recovery, ``StateTable``,
``Node._finish_interrupted``, ``check_held``) and checked:

1. p is either not OWNING (its move starts over: it serves nothing) or OWNING at a
   counter at or past every acknowledged update, holding exactly the supplier's data
   at that counter (the file at C plus the updates); its file passes the page check;
2. no temp WAL is left, and whatever a transfer left is taken over by the next move;
3. the index agrees with the data (``IndexStore.verify``).

Then the move runs again, under writes, and must end OWNING with exactly the
supplier's contents, the index verified, and no temp WAL or transfer leftover.

Each crash point is cut with no unsynced write kept and with half of them kept. The
delta fetch's points are cut in the move of a returning copy (one that completed a
move before). In a run that is cut the primary pauses from the switch to the direct
path until OWNING, so that nothing but the checkpoint gate makes the replayed updates
durable (they are applied without node-WAL records).
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

import faults
from checkpoint import pagefile
from faults import fileio
from faults.powerloss import PowerLossLayer
from node.config import CacheConfig, load
from node.filemove import make_supplier_storage
from node.indexship import IndexShipper
from node.move import Move, MoveContext, MoveEngine, Stage
from node.move import tempwal
from node.node import Node
from node.states import State, StateTable
from node.storage import CacheData, check_held
from transfer import Limits, SupplierServer, partial_paths

from transfer_helpers import SECRET, peer_of

pytestmark = pytest.mark.slow

CACHE = "default"
P = 3
ENTRIES = 300                      # a small partition: a few 64 KiB chunks
RATE = 500_000                     # bytes/s received: about 0.3 s for the file
CITIES = ["oslo", "lima", "pune", "kyiv", "rome"]


class _PowerGone(OSError):
    """An I/O of the demander after the power went (the disk is gone: EIO)."""

    def __init__(self) -> None:
        super().__init__(errno.EIO, "power cut")


class _Power(PowerLossLayer):
    """The power-loss layer over one folder (the demander's data dir); files elsewhere
    (the supplier's) pass straight to the OS. After :meth:`die` every change to the
    folder fails: nothing the unwinding threads do after the cut reaches the disk."""

    def __init__(self, root: str, keep: float, seed: int) -> None:
        super().__init__(keep_unsynced=keep, seed=seed)
        self.root = os.path.abspath(root) + os.sep
        self.dead = threading.Event()

    def die(self) -> None:
        with self._lock:                # no operation of the folder half done
            self.dead.set()

    def _mine(self, path: str) -> bool:
        return os.path.abspath(path).startswith(self.root)

    def _alive(self, fd: int | None = None, path: str | None = None) -> bool:
        """Whether the operation is the demander's; raise when its power is gone."""
        mine = (fd in self._fds) if fd is not None else self._mine(path or "")
        if mine and self.dead.is_set():
            raise _PowerGone()
        return mine

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        if not self._alive(path=path):
            return os.open(path, flags, mode)
        return super().open(path, flags, mode)

    def write(self, fd: int, data: Any) -> int:
        self._alive(fd)
        return super().write(fd, data)

    def pwrite(self, fd: int, data: Any, offset: int) -> int:
        self._alive(fd)
        return super().pwrite(fd, data, offset)

    def ftruncate(self, fd: int, size: int) -> None:
        self._alive(fd)
        super().ftruncate(fd, size)

    def fsync(self, fd: int) -> None:
        self._alive(fd)
        super().fsync(fd)

    fdatasync = fsync

    def replace(self, src: str, dst: str) -> None:
        if not self._alive(path=dst):
            os.replace(src, dst)
            return
        super().replace(src, dst)

    def unlink(self, path: str) -> None:
        if not self._alive(path=path):
            os.unlink(path)
            return
        super().unlink(path)

    def fsync_dir(self, path: str) -> None:
        if not self._alive(path=os.path.join(path, "x")):
            fileio.FileLayer.fsync_dir(self, path)
            return
        super().fsync_dir(path)

    def cut(self) -> None:
        # A folder removed outside the seam (a temp WAL's os.rmdir) is not modelled:
        # its durable files come back, as on a disk that never saw the removal's
        # directory fsync in time (the strict reading; the restart must cope).
        for d, names in self._durable.items():
            if names and not os.path.isdir(d):
                os.makedirs(d)
        super().cut()


def _doc(i: int, tag: str) -> bytes:
    return json.dumps({"city": CITIES[i % len(CITIES)], "n": i, "tag": tag,
                       "pad": "x" * 300}).encode()


def _cfg(data: str, node: str, port: int):
    return load(None, id=node, data=data, listen=f"127.0.0.1:{port}")


CACHE_CFG = {"name": CACHE, "partitions": 8, "backups": 1,
             "indexes": [{"name": "by_city", "field": "city", "unique": False}]}


def _open(cfg) -> CacheData:
    return CacheData(cfg, CacheConfig.from_wire(dict(CACHE_CFG)))


class _Use:
    def opened(self, key: Any) -> None:
        pass

    def closed(self, key: Any) -> None:
        pass


class Supplier:
    """The primary and file supplier ``n1``: a node's CacheData in its own folder, its
    supplier storage with an index exporter, and a model of every update made."""

    def __init__(self, root: str) -> None:
        self.data = _open(_cfg(root, "n1", 7101))
        self.data.create(P)
        for i in range(ENTRIES):
            self.data.put(P, b"k%05d" % i, _doc(i, "v0"))
        self.data.checkpoint()
        self.lock = threading.RLock()                    # the primary's partition lock
        self.base = dict(self.data.scan(P))
        self.base_counter = self.data.counter(P)
        self.updates: list[tuple[int, bytes, bytes | None]] = []
        self.shipper = IndexShipper("n1")
        storage = make_supplier_storage({CACHE: self.data}, _Use(),  # type: ignore[arg-type]
                                        lambda c, p: None, plock=lambda c, p: self.lock,
                                        shipper=self.shipper)
        self.server = SupplierServer(storage, SECRET).start()

    def at(self, counter: int) -> dict[bytes, bytes]:
        """p's contents at ``counter`` (the file at C plus the updates up to it)."""
        out = dict(self.base)
        for c, k, v in self.updates:
            if c > counter:
                break
            if v is None:
                out.pop(k, None)
            else:
                out[k] = v
        return out

    def close(self) -> None:
        self.server.stop()
        self.data.close()


class Feed:
    """ReplicaFeed: registering with the primary starts its replication here."""

    def __init__(self, sup: Supplier) -> None:
        self.sup = sup
        self.registered = threading.Event()

    def register(self, primary: str, cache: str, p: int) -> int:
        with self.sup.lock:
            self.registered.set()
            return self.sup.data.counter(p)


class Locator:
    def __init__(self, sup: Supplier) -> None:
        self.addr = peer_of(sup.server)

    def primary(self, cache: str, p: int) -> tuple[str, str]:
        return "n1", "127.0.0.1:1"

    def suppliers(self, cache: str, p: int) -> list[tuple[str, str]]:
        return [("n1", self.addr)]

    def check_files(self, cache: str, p: int) -> None:
        pass


class IndexSupply:
    """The IndexSupply port straight to the supplier's exporter (no RPC)."""

    def __init__(self, shipper: IndexShipper) -> None:
        self.shipper = shipper

    def want(self, supplier: str, cache: str, p: int, below: int = 0) -> bool:
        return self.shipper.op_index_want(cache, p, "n2", below)

    def page(self, supplier: str, cache: str, p: int, counter: int, page: int
             ) -> tuple[dict[str, object], bytes]:
        r = self.shipper.op_index_page(cache, p, counter, page)
        return dict(r.header), r.data


class Demander:
    """Node ``n2`` as the move engine's host: its CacheData and StateTable in ``root``
    (opened as a node opens them), and one engine."""

    def __init__(self, root: str, sup: Supplier, *, stream: bool, ship: bool,
                 delta_limit: float = 0.5) -> None:
        self.cfg = _cfg(root, "n2", 7102)
        self.data = _open(self.cfg)
        self.states = StateTable(self.cfg.data)
        self.lock = threading.RLock()
        self.stopping = threading.Event()
        self.feed = Feed(sup)
        self.ctx = MoveContext(
            me="n2", data_dir=self.cfg.data, secret=SECRET, data={CACHE: self.data},
            states=self.states, plock=lambda c, p: self.lock, feed=self.feed,
            locator=Locator(sup), stopping=self.stopping, tmpwal_sync="group",
            chunk_size=64 << 10, retry_s=0.1, stream_index=stream,
            # paced, so that the primary's writes meanwhile fill the temp WAL with
            # more than the replay's tail (TAIL records)
            recv_limits=Limits(rate=RATE),
            index_transfer=lambda: "ship" if ship else "rebuild",
            index_supply=IndexSupply(sup.shipper), delta_limit=delta_limit)
        self.engine = MoveEngine(self.ctx)
        self.mv = Move(CACHE, P, mode="files")

    def restart_checks(self) -> None:
        """What a node runs at start after CacheData's recovery: the temp WALs a crash
        left are deleted, interrupted evictions finished, OWNING files present."""
        shim = SimpleNamespace(ctx=SimpleNamespace(cfg=self.cfg, states=self.states,
                                                   data={CACHE: self.data}))
        Node._finish_interrupted(shim)  # type: ignore[arg-type]
        check_held({CACHE: self.data}, self.states)

    def close(self) -> None:
        self.engine.finish(self.mv)
        self.data.close()

    def kill(self) -> None:
        """Let go of every file as a dead process does: no checkpoint, and whatever
        fails on the way (the disk is gone) does not stop the rest."""
        d = self.data
        for step in (lambda: self.engine.finish(self.mv), d._index_latch.close,
                     d.indexes.close, lambda: d.store.close(checkpoint=False)):
            with contextlib.suppress(Exception):
                step()


class Writer:
    """The primary's writes of p during the move: each applied to the supplier, then
    (once the demander registered) replicated to the move under the primary's lock."""

    def __init__(self, sup: Supplier, dem: Demander, power: _Power | None, start: int) -> None:
        self.sup, self.dem, self.power = sup, dem, power
        self.acked: list[int] = []
        self.ack_lock = threading.Lock()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.i = start
        self.thread = threading.Thread(target=self._run, name="primary-writer", daemon=True)

    def dead(self) -> bool:
        return self.power is not None and self.power.dead.is_set()

    def _idle(self) -> bool:
        """(p's lock held on both sides) In a run that is cut, the primary writes
        nothing from the switch to the direct path until the move is OWNING: then
        nothing but the gate itself makes its checkpoint durable (an update on the
        direct path is logged and synced, which would sync the checkpoint's marker
        too). The move after the cut has no such pause."""
        mv = self.dem.mv
        return self.power is not None and mv.direct and mv.stage != Stage.OWNING

    def _one(self) -> None:
        sup, dem = self.sup, self.dem
        i = self.i
        self.i += 1
        key = b"k%05d" % ((i * 7) % ENTRIES) if i % 3 else b"w%05d" % i
        value = None if i % 11 == 0 else _doc(i, "w%d" % i)
        with sup.lock:
            if not dem.feed.registered.is_set() or self.dead():
                counter = sup.data.put(P, key, value)
                sup.updates.append((counter, key, value))
                return
            with dem.lock:
                if self._idle():
                    return
                counter = sup.data.put(P, key, value)
                sup.updates.append((counter, key, value))
                answer = dem.engine.buffer_update(dem.mv, key, value, counter, counter - 1)
            assert answer in ("buffered", "applied"), answer
            with self.ack_lock:
                if not self.dead():
                    self.acked.append(counter)
        dem.engine.backpressure(dem.mv)

    def _run(self) -> None:
        try:
            while not self.stop.is_set() and not self.dead():
                self._one()
                time.sleep(0.002)
        except BaseException as e:       # noqa: BLE001 - the power went: expected
            if not self.dead():
                self.error = e

    def since_register(self) -> int:
        with self.ack_lock:
            return len(self.acked)

    def end(self) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the writer hangs"
        assert self.error is None, repr(self.error)


@contextlib.contextmanager
def _running(dem: Demander, writer: Writer) -> Iterator[dict[str, Any]]:
    """The move on a thread of its own while the writer writes."""
    out: dict[str, Any] = {}

    def move() -> None:
        try:
            out["ok"] = dem.engine.run(dem.mv)
        except BaseException as e:       # noqa: BLE001 - reported below
            out["error"] = e
    t = threading.Thread(target=move, name="move", daemon=True)
    out["thread"] = t
    writer.thread.start()
    t.start()
    try:
        yield out
    finally:
        t.join(60)
        assert not t.is_alive(), "the move hangs"
        writer.end()


# -- the crash points -------------------------------------------------------------------
# (case, point, the hit that cuts (-1: the first under p's lock), stream_index,
# index_transfer = ship, returning): every point a files move passes on the demander
# (faults/points.py). The delta fetch's two are passed by a returning copy, one that
# holds an older file of p from a complete move before (delta_limit 1.0: always delta).
POINTS: list[tuple[str, str, int, bool, bool, bool]] = [
    # the 8th temp-WAL commit: a slow machine's move ended after 15 of them
    ("tmpwal-before-sync", "wal.before_sync", 8, False, False, False),   # temp WAL commits
    ("tmpwal-after-sync", "wal.after_sync", 8, False, False, False),
    ("after-demand", "demander.after_demand", 1, False, False, False),
    ("mid-receive", "demander.mid_receive", 1, False, False, False),
    ("mid-stream-index", "demander.mid_stream_index", 1, True, False, False),
    ("before-install", "demander.before_install", 1, False, False, False),
    ("after-install", "demander.after_install", 1, False, False, False),
    ("mid-index-rebuild", "demander.mid_index_rebuild", 1, False, False, False),
    ("mid-index-receive", "demander.mid_index_receive", 1, False, True, False),
    ("mid-index-load", "demander.mid_index_load", 1, False, True, False),
    ("mid-replay", "demander.mid_replay", 1, False, False, False),         # a batch
    ("mid-replay-tail", "demander.mid_replay", -1, False, False, False),   # under p's lock
    ("gate-checkpoint", "checkpoint.mid_write", 1, False, False, False),   # the gate's
    ("before-owning", "demander.before_owning", 1, False, False, False),
    ("after-owning", "demander.after_owning", 1, False, False, False),
    ("delta-base-copy", "demander.mid_base_copy", 1, False, False, True),
    ("delta-receive", "demander.mid_delta_receive", 1, False, False, True),
]


def _arm(m: pytest.MonkeyPatch, point: str, nth: int, power: _Power, dem_root: str,
         writer: Writer, dem: Demander) -> list[str]:
    """Make ``point`` cut the demander's power at its ``nth`` hit of the demander's
    (the supplier runs in this process too: its WAL and checkpoints are not cut)."""
    import checkpoint.checkpointer
    import node.move.engine
    import node.move.ship
    import node.move.stream
    import transfer.delta
    import transfer.demander
    import transfer.receive
    import wal.writer
    root = os.path.abspath(dem_root)
    hits: list[str] = []

    def demanders(name: str) -> bool:
        f = sys._getframe(2)
        if name.startswith("wal."):
            return os.path.abspath(getattr(f.f_locals.get("self"), "path", "")).startswith(
                os.path.join(root, "tmpwal"))
        if name == "checkpoint.mid_write":
            part = f.f_locals.get("part")
            return os.path.abspath(getattr(part, "path", "")).startswith(root)
        return True

    def hit(name: str) -> None:
        if name != point or power.dead.is_set() or not demanders(name):
            return
        hits.append(name)
        locked = dem.lock._is_owned()  # type: ignore[attr-defined]  # p's lock held here
        if len(hits) < nth or (nth < 0 and not locked):
            return
        # let some replicated updates reach the temp WAL first, where waiting holds up
        # no one the writer needs (not under p's lock, not in the WAL's sync thread)
        if not locked and threading.current_thread().name != "primary-writer" \
                and not name.startswith("wal."):
            deadline = time.monotonic() + 2.0
            while writer.since_register() < 10 and time.monotonic() < deadline:
                time.sleep(0.01)
        with writer.ack_lock:
            power.die()
        dem.stopping.set()               # the engine's threads stop at their next check
        raise _PowerGone()
    for mod in (node.move.engine, node.move.ship, node.move.stream, transfer.delta,
                transfer.demander, transfer.receive, wal.writer, checkpoint.checkpointer):
        m.setattr(mod, "crashpoint", hit)
    m.setattr(faults, "crashpoint", hit)     # indexes.rebuild and indexes.shipped
    return hits


def _diff(got: dict[bytes, bytes], want: dict[bytes, bytes], sup: Supplier) -> str:
    """The first keys that differ, with the counters of their updates."""
    bad = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
    out = []
    for k in bad[:5]:
        tag = (got.get(k) or b"").split(b'"tag": "')[-1][:8] if k in got else b"-"
        out.append(f"{k!r}: holds {tag!r}, updates {[c for c, kk, _ in sup.updates if kk == k]}")
    return f"{len(bad)} keys differ; " + "; ".join(out)


def _check_partition(dem: Demander, sup: Supplier, acked: list[int]) -> None:
    """Invariants 1 and 3 after a restart."""
    state = dem.states.get(CACHE, P)
    held = P in dem.data.partitions()
    if held:
        assert pagefile.verify(dem.data.store.partition_path(P)) == [], "torn partition file"
        if not dem.data.index_current(P):
            # not trusted after the cut: the node rebuilds it before any read or change
            assert P in dem.data.stale_indexes()
            assert dem.data.catch_up_index(P)
        rep = dem.data.indexes.verify(P, dem.data.store)
        assert rep.ok, rep
    if state == State.OWNING:
        assert held
        mine = dem.data.counter(P)
        assert not acked or mine >= max(acked), \
            f"OWNING at counter {mine} without acknowledged update {max(acked)}"
        got, want = dict(dem.data.scan(P)), sup.at(mine)
        assert got == want, f"OWNING at {mine} with data that is not the supplier's: {_diff(got, want, sup)}"
    else:
        assert state == State.MOVING, state     # not served; the move starts over


def _check_final(dem: Demander, sup: Supplier) -> None:
    assert dem.states.get(CACHE, P) == State.OWNING
    assert dem.data.counter(P) == sup.data.counter(P)
    assert dict(dem.data.scan(P)) == dict(sup.data.scan(P)) == sup.at(sup.data.counter(P))
    rep = dem.data.indexes.verify(P, dem.data.store)
    assert rep.ok, rep
    assert tempwal.leftovers(dem.cfg.data) == []
    left = [q for q in partial_paths(dem.data.store.partition_path(P)) if os.path.exists(q)]
    assert left == []


def _complete_move(dem: Demander, sup: Supplier, start: int) -> None:
    """A whole move under writes, not cut: it must end OWNING."""
    writer = Writer(sup, dem, None, start=start)
    with _running(dem, writer) as out:
        pass
    assert out.get("ok") is True, out
    assert writer.acked, "no update replicated during the move"


@pytest.mark.parametrize("keep", [0.0, 0.5])
@pytest.mark.parametrize("case", POINTS, ids=[c[0] for c in POINTS])
def test_power_cut_in_a_files_move(tmp_path, monkeypatch, case, keep: float) -> None:
    _, point, nth, stream, ship, returning = case
    sup = Supplier(str(tmp_path / "n1"))
    dem_root = str(tmp_path / "n2")
    os.makedirs(dem_root)
    power = _Power(dem_root, keep, seed=11)
    try:
        with monkeypatch.context() as m:
            with fileio.use(power):
                dem = Demander(dem_root, sup, stream=stream, ship=ship, delta_limit=1.0)
                if returning:
                    # a copy that holds an older file of p: its next move is a delta fetch
                    _complete_move(dem, sup, start=50_000)
                    dem.mv = Move(CACHE, P, mode="files")
                    dem.feed.registered.clear()
                writer = Writer(sup, dem, power, start=0)
                hits = _arm(m, point, nth, power, dem_root, writer, dem)
                with _running(dem, writer) as out:
                    pass
                assert power.dead.is_set(), f"{point} never cut the power (hits: {hits}, {out})"
                assert out.get("ok") is not True, out
                acked = list(writer.acked)
                dem.kill()
            power.cut()
        assert acked, "no update was acknowledged before the cut"

        # -- the restart: the node's own open path over what survived --------------------
        dem = Demander(dem_root, sup, stream=False, ship=False)
        try:
            dem.restart_checks()
            assert tempwal.leftovers(dem.cfg.data) == []
            _check_partition(dem, sup, acked)
            # -- the move again, under writes: it ends exact ----------------------------
            _complete_move(dem, sup, start=100_000)
            _check_final(dem, sup)
        finally:
            dem.close()
    finally:
        sup.close()
