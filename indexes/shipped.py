"""A partition's index entries as a file supplier ships them beside the file (the
node's ``[rebalance] index_transfer = "ship"``), and their checked load on the
demander: the rebuild's clear -> load -> ready without its scan.

Supplier: :func:`export` reads every entry of a ready partition in ONE read
transaction (the caller holds the partition's lock, under which the file snapshot was
taken, so both are at the same update counter C) into pages::

    page    msgpack [plain, long]
            plain: [entry key (bin), ...]            the partition's entries with no data,
                                                      in key order, continuing the last page's
            long:  [[entry key (bin), data (bin)], ...]  the entries with data, in key order
            at most PAGE_BYTES of keys and data (one entry alone may pass it)

The plain entries come first (pages 0..), then the long ones. The header
(:class:`ShipHeader`) says the counter, the definitions' fingerprint, the live
documents of the partition at C, the entry count, the page count and the digest:
xxh3-128 over ``u32 BE length | page`` of every page in order.

Demander: :func:`load_shipped` checks the header against the store (same fingerprint,
so the same index ids, codec and layout) and the digest, then clears the partition
and appends each page's plain keys to its tree (``MDB_APPENDDUP``: a key not above the
partition's last one is refused by LMDB, so order and uniqueness are checked for
free) and puts the long entries (``overwrite=False``: a repeated one is refused). While
loading it checks the entries the caller expects (``must_hold``: the entries of
documents sampled from the installed file) and picks ``sample`` random entries, which
``vouch`` checks against the file (each one's document exists at C and gives that
entry). Only then is the ready marker written. Any failure raises
:class:`~indexes.errors.ShippedIndexRefused` and leaves the partition not ready (its
next rebuild clears it); the crash point ``demander.mid_index_load`` follows every
load commit, as ``demander.mid_index_rebuild`` does in a rebuild.
"""
from __future__ import annotations

import bisect
import random
import struct
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import lmdb
import msgpack
import xxhash

import faults

from .entrydb import partition_key
from .errors import IndexNotReadyError, RebuildCancelled, ShippedIndexRefused
from .rebuild import DEFAULT_BATCH
from .results import Progress, RebuildResult, Reporter

if TYPE_CHECKING:
    from .store import IndexStore

PAGE_BYTES = 256 << 10          # keys and data per page: a page travels in one 1 MiB frame
_U32 = struct.Struct(">I")
_ENTRY_OVERHEAD = 3             # msgpack bin header of a key up to 255 bytes, about

__all__ = ["ShipHeader", "IndexShot", "ExportRead", "export", "read_export", "pack_export",
           "load_shipped", "digest", "PAGE_BYTES"]


@dataclass(frozen=True)
class ShipHeader:
    partition: int
    counter: int          # the update counter C the entries are at (the file snapshot's)
    fingerprint: str      # the supplier store's schema fingerprint (meta.Schema)
    docs: int             # live documents of the partition at C on the supplier
    count: int            # entries, plain and long
    bad: int              # bad values as the supplier's ready marker counts them
    pages: int
    digest: str           # xxh3-128 hex of the pages (:func:`digest`)

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class IndexShot:
    """One partition's entries at one counter, paged, as the supplier serves them."""
    header: ShipHeader
    pages: list[bytes]
    taken: float          # time.monotonic() at export
    seconds: float        # the export's duration


def digest(pages: Sequence[bytes]) -> str:
    h = xxhash.xxh3_128()
    for pg in pages:
        h.update(_U32.pack(len(pg)))
        h.update(pg)
    return h.hexdigest()


def _paged(items: list[Any], size: Callable[[list[Any]], int]) -> list[list[Any]]:
    """``items`` cut into slices of at most PAGE_BYTES by ``size`` (a slice of one item
    may pass it); slices sized by halving/doubling, so the per-item work is C's."""
    out: list[list[Any]] = []
    i, n = 0, 4096
    while i < len(items):
        chunk = items[i:i + n]
        sz = size(chunk)
        if sz > PAGE_BYTES and len(chunk) > 1:
            n = max(1, len(chunk) // 2)
            continue
        out.append(chunk)
        i += len(chunk)
        if sz < PAGE_BYTES // 2:
            n *= 2
    return out


def _plain_size(keys: list[bytes]) -> int:
    return sum(map(len, keys)) + _ENTRY_OVERHEAD * len(keys)


def _long_size(pairs: list[tuple[bytes, bytes]]) -> int:
    return sum(len(k) + len(d) + 8 for k, d in pairs)


@dataclass
class ExportRead:
    """p's entries as one read transaction saw them (:func:`read_export`), not yet paged."""
    store: IndexStore
    p: int
    counter: int
    docs: int
    plain: list[bytes]
    long: list[tuple[bytes, bytes]]
    bad: int
    t0: float


def export(store: IndexStore, p: int, counter: int, docs: int) -> IndexShot:
    """Every entry of ready partition ``p`` in one read transaction, paged. The caller
    holds what keeps p's entries at ``counter`` (the node: p's lock). Raises
    IndexNotReadyError when p is not ready."""
    return pack_export(read_export(store, p, counter, docs))


def read_export(store: IndexStore, p: int, counter: int, docs: int) -> ExportRead:
    """The part of :func:`export` that must see p at ``counter``: one read transaction
    (the caller holds p's lock only for this); :func:`pack_export` pages it after."""
    t0 = time.monotonic()
    if not store.ready(p):
        raise IndexNotReadyError(f"index of partition {p} in {store.path} is not ready: "
                                 "nothing to ship")
    env = store.env
    marker = store.marker(p) or {}
    pk = partition_key(p)

    def read(txn: lmdb.Transaction[bytes]) -> tuple[list[bytes], list[tuple[bytes, bytes]]]:
        cur = txn.cursor(db=env.entries.plain)
        plain = list(cur.iternext_dup()) if cur.set_key(pk) else []
        long = [(k, d) for k, d in env.entries._long(txn, pk, b"", None, None)]
        return plain, long
    plain, long = env.read(read)
    return ExportRead(store, p, counter, docs, plain, long, int(marker.get("bad", 0) or 0), t0)


def pack_export(r: ExportRead) -> IndexShot:
    """Page a :func:`read_export` (no lock needed: nothing here reads the store but
    its schema)."""
    pages = [msgpack.packb([chunk, []], use_bin_type=True) for chunk in _paged(r.plain, _plain_size)]
    pages += [msgpack.packb([[], [list(x) for x in chunk]], use_bin_type=True)
              for chunk in _paged(r.long, _long_size)]
    header = ShipHeader(r.p, r.counter, r.store.schema.fingerprint, r.docs,
                        len(r.plain) + len(r.long), r.bad, len(pages), digest(pages))
    return IndexShot(header, pages, time.monotonic(), time.monotonic() - r.t0)


def _cancel_check(cancel: Any) -> Callable[[], bool]:
    if cancel is None:
        return lambda: False
    if hasattr(cancel, "is_set"):
        return cancel.is_set        # type: ignore[no-any-return]
    return cancel                   # type: ignore[no-any-return]


def _refuse(store: IndexStore, p: int, why: str) -> ShippedIndexRefused:
    return ShippedIndexRefused(f"shipped index of partition {p} in {store.path} refused: {why}")


def _unpack(store: IndexStore, p: int, i: int, page: bytes
            ) -> tuple[list[bytes], list[tuple[bytes, bytes]]]:
    try:
        doc = msgpack.unpackb(page, raw=False, use_list=True)
        plain, long = doc
        if not isinstance(plain, list) or not isinstance(long, list):
            raise ValueError("not two lists")
        pairs = [(k, d) for k, d in long]
        for k, d in pairs:
            if type(k) is not bytes or type(d) is not bytes or not d:
                raise ValueError("a long entry is not (key, data) of bin")
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise _refuse(store, p, f"page {i} does not decode: {e}") from None
    return plain, pairs


def load_shipped(store: IndexStore, p: int, header: ShipHeader, pages: Sequence[bytes], *,
                 must_hold: dict[bytes, bytes] | None = None,
                 vouch: Callable[[list[tuple[bytes, bytes]]], str | None] | None = None,
                 sample: int = 256, rng: random.Random | None = None,
                 progress: Callable[[Progress], None] | None = None, cancel: Any = None,
                 batch: int | None = None) -> RebuildResult:
    """Check and load a shipped index of ``p`` (see the module doc). ``must_hold``:
    entry key -> data that must be among the shipped entries; ``vouch(sampled)``:
    None when the sampled (key, data) entries hold against the data, else why not.
    ShippedIndexRefused when anything does not hold: p is then not ready."""
    cancelled = _cancel_check(cancel)
    rng = rng or random.Random()
    batch = batch or DEFAULT_BATCH
    if header.partition != p:
        raise _refuse(store, p, f"it is partition {header.partition}'s")
    if header.fingerprint != store.schema.fingerprint:
        raise _refuse(store, p, "its index definitions differ from this store's (fingerprint "
                                f"{header.fingerprint} vs {store.schema.fingerprint})")
    if header.pages != len(pages):
        raise _refuse(store, p, f"{len(pages)} pages received, {header.pages} announced")
    got = digest(pages)
    if got != header.digest:
        raise _refuse(store, p, f"digest {got} of the pages is not the announced {header.digest}")
    rep = Reporter(p, progress)
    res = RebuildResult(p)
    t0 = time.monotonic()
    env = store.env
    pk = partition_key(p)
    want_plain = sorted(k for k, d in (must_hold or {}).items() if not d)
    want_long = {k: d for k, d in (must_hold or {}).items() if d}
    found_long = 0
    picks = sorted(rng.sample(range(header.count), min(sample, header.count))) if header.count else []
    sampled: list[tuple[bytes, bytes]] = []
    pi = 0                         # next pick
    seen = 0                       # entries before the current page
    rep.start("clear", None)
    store.clear(p)
    rep.start("load", header.count)
    keys: list[bytes] = []
    longs: list[tuple[bytes, bytes]] = []

    def commit() -> None:
        nonlocal keys, longs

        def put(txn: lmdb.Transaction[bytes], keys: list[bytes] = keys,
                longs: list[tuple[bytes, bytes]] = longs) -> tuple[int, int]:
            c1, a1 = env.entries.load(txn, p, keys, {}) if keys else (0, 0)
            c2, a2 = (txn.cursor(db=env.entries.long).putmulti(
                ((pk + k, d) for k, d in longs), overwrite=False) if longs else (0, 0))
            return c1 + c2, a1 + a2
        try:
            consumed, added = env.write(put)
        except (TypeError, lmdb.BadValsizeError) as e:
            raise _refuse(store, p, f"an entry is not a valid key: {e}") from None
        if added != consumed:
            raise _refuse(store, p, f"{consumed - added} entries out of order or repeated")
        res.entries += added
        keys, longs = [], []
        faults.crashpoint("demander.mid_index_load")
        if cancelled():
            raise RebuildCancelled(f"load of the shipped index of partition {p} cancelled; "
                                   "the partition is not ready")
        rep.report(res.entries)

    for i, page in enumerate(pages):
        plain, pairs = _unpack(store, p, i, page)
        if plain:
            if want_plain:
                lo = bisect.bisect_left(want_plain, plain[0])
                hi = bisect.bisect_right(want_plain, plain[-1])
                for w in want_plain[lo:hi]:
                    j = bisect.bisect_left(plain, w)
                    if j == len(plain) or plain[j] != w:
                        raise _refuse(store, p, f"entry {w!r} of a document in the file is missing")
                del want_plain[lo:hi]
            keys += plain
        if pairs:
            for k, d in pairs:
                if k in want_long:
                    if want_long[k] != d:
                        raise _refuse(store, p, f"entry {k!r} of a document in the file has "
                                                "other data")
                    found_long += 1
            longs += pairs
        n = len(plain) + len(pairs)
        while pi < len(picks) and picks[pi] < seen + n:
            j = picks[pi] - seen
            sampled.append((plain[j], b"") if j < len(plain) else pairs[j - len(plain)])
            pi += 1
        seen += n
        if len(keys) + len(longs) >= batch:
            commit()
    if keys or longs:
        commit()
    if res.entries != header.count:
        raise _refuse(store, p, f"{res.entries} entries loaded, {header.count} announced")
    if want_plain:
        raise _refuse(store, p, f"entry {want_plain[0]!r} of a document in the file is missing "
                                "(past the last shipped key)")
    if found_long != len(want_long):
        raise _refuse(store, p, f"{len(want_long) - found_long} long entries of documents in "
                                "the file are missing")
    if vouch is not None:
        why = vouch(sampled)
        if why:
            raise _refuse(store, p, why)
    rep.report(res.entries, force=True)
    rep.start("ready", None)
    res.scanned = header.docs
    res.bad = header.bad
    store.mark_ready(p, res.entries, res.bad)
    res.seconds = time.monotonic() - t0
    return res
