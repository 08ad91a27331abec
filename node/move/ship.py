"""The shipped index, demander side (``[rebalance] index_transfer`` = ship or auto):
instead of rebuilding p's index from the installed file, load the entries the
supplier exported at the file snapshot's counter C (:mod:`node.indexship`,
:mod:`indexes.shipped`), once they pass every check:

- the header: partition p, counter C (the installed file's), the supplier's live
  documents at C equal to the installed file's live keys, the definitions'
  fingerprint equal to this store's (the same index ids and codec), the same header
  on every page;
- the digest over the pages (xxh3-128), the page count, the entry count;
- the load's own checks: every key above the last (LMDB's append refuses anything
  else), no entry twice;
- against the file at C: every entry of :data:`SAMPLE_DOCS` documents read from random
  page windows of the installed file must be shipped (a stale or forged index misses
  or alters some), and :data:`SAMPLE_ENTRIES` random shipped entries must each come
  from their document in the file (its primary key is live at C and its value gives
  that very entry).

Both samples cost a few hundred documents' parse and a few hundred key lookups,
whatever the partition's size, next to a rebuild's parse of every document. Any
failure raises (the caller logs the reason and rebuilds from the file); the ready
marker is written only after all of them.
"""
from __future__ import annotations

import logging
import os
import random
from typing import Any, Callable

from checkpoint.pagefile import iter_live_batches
from faults import crashpoint
from indexes import (Progress, RebuildCancelled, RebuildResult, ShipHeader, ShippedIndexRefused,
                     load_shipped)
from indexes.keycodec import parse_entry

from ..errors import Unavailable
from .ports import IndexSupply, PartitionData

log = logging.getLogger("ferry.node.filemove")
SAMPLE_DOCS = 256         # documents of the file whose entries must all be shipped
SAMPLE_ENTRIES = 256      # shipped entries checked against their documents
SAMPLE_WINDOWS = 16       # random page windows those documents are read from
WINDOW_PAGES = 4
# the pages a move holds in memory at most (the rebuild's own bound, its sort buffer);
# a larger export is not received: the index is rebuilt from the file
MAX_RECEIVE_BYTES = 256 << 20


def live_docs(store: Any, p: int) -> int | None:
    """Live keys of p in the store (checkpoint's key index of the partition), or None
    when the store cannot tell."""
    live = getattr(store, "live_keys", None)       # checkpoint.PartitionStore.live_keys
    return live(p) if callable(live) else None


def ship_wanted(mode: str, supply: IndexSupply | None, data: PartitionData) -> bool:
    """Whether to ask the supplier for p's index before the fetch."""
    return mode in ("ship", "auto") and supply is not None and bool(data.indexes.definitions)


def receive(supply: IndexSupply, node: str, cache: str, p: int, counter: int,
            cancel: Callable[[], bool]) -> tuple[ShipHeader, list[bytes]]:
    """Every page of ``node``'s export of p at ``counter``, with its header."""
    first, data = supply.page(node, cache, p, counter, 0)
    try:
        header = ShipHeader(**first)        # type: ignore[arg-type]
        for name in ("partition", "counter", "docs", "count", "bad", "pages"):
            if type(getattr(header, name)) is not int:
                raise TypeError(f"{name} is not an integer")
        if type(header.fingerprint) is not str or type(header.digest) is not str:
            raise TypeError("fingerprint and digest must be strings")
    except TypeError as e:
        raise ShippedIndexRefused(f"the shipped index header of {cache}/{p} from {node} is "
                                  f"malformed: {e}") from None
    if header.counter != counter:
        raise ShippedIndexRefused(f"{node} shipped {cache}/{p}'s index at counter "
                                  f"{header.counter}, the file is at {counter}")
    pages = [data] if header.pages else []
    held = len(data)
    crashpoint("demander.mid_index_receive")
    for i in range(1, header.pages):
        if cancel():
            raise Unavailable(f"index receive of {cache}/{p} cancelled")
        h, data = supply.page(node, cache, p, counter, i)
        if h != first:
            raise ShippedIndexRefused(f"the header of page {i} of {cache}/{p}'s shipped index "
                                      "differs from page 0's")
        held += len(data)
        if held > MAX_RECEIVE_BYTES:
            raise ShippedIndexRefused(f"the shipped index of {cache}/{p} passes "
                                      f"{MAX_RECEIVE_BYTES >> 20} MiB (page {i} of "
                                      f"{header.pages}): not held in memory")
        pages.append(data)
        crashpoint("demander.mid_index_receive")
    return header, pages


def file_sample(path: str, page_size: int, rng: random.Random) -> list[tuple[bytes, bytes]]:
    """Up to SAMPLE_DOCS live (key, value) pairs from random page windows of ``path``."""
    n_pages = os.path.getsize(path) // page_size
    if n_pages <= 1:
        return []
    pairs: list[tuple[bytes, bytes]] = []
    if n_pages - 1 <= SAMPLE_WINDOWS * WINDOW_PAGES:
        starts = [1]
        spans = [(1, n_pages)]
    else:
        starts = sorted(rng.sample(range(1, n_pages), SAMPLE_WINDOWS))
        spans = [(a, min(a + WINDOW_PAGES, n_pages)) for a in starts]
    for span in spans:
        for batch in iter_live_batches(path, pages=span):
            pairs.extend(batch)
    return pairs if len(pairs) <= SAMPLE_DOCS else rng.sample(pairs, SAMPLE_DOCS)


def index_shipped(cache: str, p: int, data: PartitionData, supply: IndexSupply, node: str,
                  counter: int, progress: Callable[[Progress], None] | None,
                  cancel: Callable[[], bool], rng: random.Random | None = None) -> RebuildResult:
    """Receive ``node``'s export of p's index at ``counter``, check it (module doc) and
    load it. ShippedIndexRefused (p not ready) when a check fails; Unavailable when the
    supplier holds no export or the move is cancelled."""
    rng = rng or random.Random()
    header, pages = receive(supply, node, cache, p, counter, cancel)
    mine = data.counter(p)
    if mine != counter:
        raise ShippedIndexRefused(f"{cache}/{p} is at counter {mine} here, the shipped index "
                                  f"at {counter}")
    docs = live_docs(data.store, p)
    if docs is not None and header.docs != docs:
        raise ShippedIndexRefused(f"the shipped index of {cache}/{p} counts {header.docs} live "
                                  f"documents at {counter}, the installed file holds {docs}")
    indexer = data.indexes.indexer
    must: dict[bytes, bytes] = {}
    for pk, raw in file_sample(data.store.partition_path(p), data.store.page_size, rng):
        for e in indexer.entries(pk, raw)[0]:
            must[e.key] = e.data

    def vouch(sampled: list[tuple[bytes, bytes]]) -> str | None:
        for key, d in sampled:
            try:
                pk = parse_entry(key, d)[2]
            except Exception as e:  # noqa: BLE001 - anything that does not parse is refused
                return f"shipped entry {key[:64]!r} does not parse: {e}"
            raw = data.store.get(p, pk)
            if raw is None:
                return f"shipped entry {key[:64]!r} names key {pk[:64]!r}, absent from the file"
            if not any(e.key == key and e.data == d for e in indexer.entries(pk, raw)[0]):
                return (f"shipped entry {key[:64]!r} is not an entry of key {pk[:64]!r}'s "
                        "document in the file")
        return None
    try:
        return load_shipped(data.indexes, p, header, pages, must_hold=must, vouch=vouch,
                            sample=SAMPLE_ENTRIES, rng=rng, progress=progress, cancel=cancel)
    except RebuildCancelled as e:
        raise Unavailable(f"index load of {cache}/{p} stopped: {e}") from None


__all__ = ["index_shipped", "live_docs", "ship_wanted", "receive", "file_sample",
           "SAMPLE_DOCS", "SAMPLE_ENTRIES"]
