"""The supplier's side of a shipped index (``[rebalance] index_transfer``): a demander
about to fetch p's file asks for p's index entries (RPC ``index_want``); when the
file supplier then opens p's transfer snapshot, it takes, under p's lock, both the
snapshot (counter C) and an export of p's index entries in one LMDB read transaction
(:func:`indexes.export_shipped`): nothing changes p in between, so the entries are
those of the file at C. The demander reads them page by page (RPC ``index_page``,
the pages of :mod:`indexes.shipped`, each within one node RPC frame) and checks them
against the installed file (:mod:`node.move.ship`).

With ``index_transfer = auto`` the want carries ``below``: the supplier takes it
only when p's file holds fewer bytes per live entry than that (its own file and key
count, the ones the snapshot will send), so big values never cost an export.

An export is kept until the demander has read its last page, a newer export of p
replaces it, or :data:`KEEP_S` pass; a want is forgotten after :data:`WANT_S`. The
exports held take at most :data:`MAX_HELD_BYTES` of memory (as the demander receives at
most ``node.move.ship.MAX_RECEIVE_BYTES``): a new export that would pass it drops the
oldest ones first, and one that alone is bigger is not kept. Either way the demander
finds no export and rebuilds from the file.
Nothing here is durable: a restarted supplier answers ``index_page`` with
``Unavailable`` and the demander rebuilds from the file.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from indexes import IndexShot, IndexStore
from indexes.shipped import ExportRead, pack_export, read_export

from .errors import Unavailable
from .move.ship import live_docs
from .rpcapi import IndexPage

log = logging.getLogger("ferry.node.filemove")
WANT_S = 120.0     # a want not met by a snapshot in this time is forgotten
KEEP_S = 300.0     # an export not read whole in this time is dropped
MAX_HELD_BYTES = 256 << 20    # the exports held at once, their pages' bytes


def shot_bytes(shot: IndexShot) -> int:
    return sum(len(pg) for pg in shot.pages)


class IndexShipper:
    """``sizer(cache, p)``: (bytes of p's file, live entries of p or None) here, for a
    want that ships only below a size per entry (``index_transfer = auto``)."""

    def __init__(self, me: str, sizer: Callable[[str, int], tuple[int, int | None]] | None = None,
                 max_bytes: int = MAX_HELD_BYTES) -> None:
        self.me = me
        self.sizer = sizer
        self.max_bytes = max_bytes
        self.dropped = 0          # exports dropped or not kept for the memory bound
        self._lock = threading.Lock()
        self.wants: dict[tuple[str, int], float] = {}           # -> deadline
        self.shots: dict[tuple[str, int], IndexShot] = {}

    def handlers(self) -> dict[str, Any]:
        return {"index_want": self.op_index_want, "index_page": self.op_index_page}

    def _expire(self, now: float) -> None:
        for k in [k for k, t in self.wants.items() if t < now]:
            del self.wants[k]
        for k in [k for k, s in self.shots.items() if s.taken + KEEP_S < now]:
            del self.shots[k]

    # -- RPC ---------------------------------------------------------------------------
    def op_index_want(self, cache: str, p: int, node: str, below: int = 0) -> bool:
        """Note the want (True); with ``below`` > 0 only when p's file here holds fewer
        bytes per live entry than that (else False: the demander rebuilds)."""
        if below > 0 and self.sizer is not None:
            size, docs = self.sizer(cache, p)
            if docs and size / docs >= below:
                return False
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            self.wants[(cache, p)] = now + WANT_S
        return True

    def op_index_page(self, cache: str, p: int, counter: int, page: int) -> IndexPage:
        with self._lock:
            shot = self.shots.get((cache, p))
            if shot is None or shot.header.counter != counter:
                held = "none" if shot is None else f"counter {shot.header.counter}"
                raise Unavailable(f"{self.me} holds no index export of {cache}/{p} at counter "
                                  f"{counter} ({held})")
            if not 0 <= page < len(shot.pages) and not (page == 0 and not shot.pages):
                raise Unavailable(f"{cache}/{p}: no page {page} of {len(shot.pages)}")
            if page >= len(shot.pages) - 1:         # the last one: read whole
                del self.shots[(cache, p)]
        data = shot.pages[page] if shot.pages else b""
        return IndexPage(header=shot.header.to_wire(), data=data)

    # -- the file supplier's side (p's lock held) -------------------------------------
    def wanted(self, cache: str, p: int) -> bool:
        with self._lock:
            t = self.wants.get((cache, p))
            return t is not None and t >= time.monotonic()

    def capture(self, cache: str, p: int, indexes: IndexStore, counter: int,
                docs: int | None) -> ExportRead | None:
        """Read p's entries at ``counter`` (the caller holds p's lock, under which
        the file snapshot at ``counter`` was just taken); :meth:`publish` pages them
        after the lock is released. A failure is logged (None): the demander finds no
        export and rebuilds."""
        with self._lock:
            self.wants.pop((cache, p), None)
        try:
            return read_export(indexes, p, counter, -1 if docs is None else docs)
        except Exception as e:  # noqa: BLE001 - the demander rebuilds; the send goes on
            log.warning("stage=supply cache=%s partition=%d index export failed: %s; the "
                        "demander rebuilds the index", cache, p, e)
            return None

    def publish(self, cache: str, p: int, read: ExportRead | None) -> None:
        """Page a :meth:`capture` (p's lock no longer held) and serve it."""
        if read is None:
            return
        try:
            shot = pack_export(read)
        except Exception as e:  # noqa: BLE001 - the demander rebuilds; the send goes on
            log.warning("stage=supply cache=%s partition=%d index export failed: %s; the "
                        "demander rebuilds the index", cache, p, e)
            return
        counter, size = shot.header.counter, shot_bytes(shot)
        if size > self.max_bytes:
            self.dropped += 1
            log.warning("stage=supply cache=%s partition=%d index export of %d bytes is more "
                        "than the %d held at most; the demander rebuilds the index", cache, p,
                        size, self.max_bytes)
            return
        with self._lock:
            self._expire(time.monotonic())
            self.shots.pop((cache, p), None)
            held = sum(shot_bytes(s) for s in self.shots.values())
            while self.shots and held + size > self.max_bytes:
                old = min(self.shots, key=lambda k: self.shots[k].taken)
                held -= shot_bytes(self.shots.pop(old))
                self.dropped += 1
                log.warning("stage=supply cache=%s partition=%d index export dropped unread "
                            "for the memory bound (%d bytes); its demander rebuilds the index",
                            old[0], old[1], self.max_bytes)
            self.shots[(cache, p)] = shot
        log.info("stage=supply cache=%s partition=%d index export at counter %d: %d entries, "
                 "%d pages, %.3fs", cache, p, counter, shot.header.count, shot.header.pages,
                 shot.seconds)


__all__ = ["IndexShipper", "live_docs", "shot_bytes", "WANT_S", "KEEP_S", "MAX_HELD_BYTES"]
