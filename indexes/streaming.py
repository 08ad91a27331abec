"""A partition's index entries built while its file arrives (the streaming install).

The transfer writes a partition file into a temp file chunk by chunk, then pre-image
pages over pages the supplier changed after its snapshot (counter C). Until the last
pre-image, the file is a mix of page versions: a key may be in two pages (moved by a
split after C) or in none. So entries are kept **per page range** (the transfer's
chunk: ``span`` pages), each with the versions of the pages it was decoded from:

- ``pages_written(first, stop)``: those pages changed in the file; every range holding
  one, and every range whose overflow chains read one, is decoded again (lazily, by
  :meth:`StreamingIndex.step`, so a burst of pre-images costs one decode per range).
  Replacing a range's contribution drops exactly what its old page versions gave.
- :meth:`StreamingIndex.finish` reads the final file once: a range whose recorded
  versions (xxh3-64 of the range's bytes, and of each outside page a chain read) differ
  from the file's, or that met a problem, or was never decoded, is decoded again from
  the final file. So whatever the order of chunks and pre-images, and even a
  notification missed, the entries are exactly those of a rebuild from that file: the
  same decoder (:func:`checkpoint.pagefile.iter_live_range`, per range as the shared
  scan of :mod:`.scanworker` does) and the same ``Indexer.feed_many``.

Nothing here writes LMDB: the keys (sorted per range, in memory, bounded by
``memory_limit``) go to :func:`indexes.rebuild.load_streamed`, the rebuild's own
clear -> load -> ready stages. Why not LMDB during the transfer: every commit of the
environment is synced, it holds the environment's one write lock that the other
partitions' updates need, and a page replaced later would have to be taken out of
LMDB again; the sort-merge-load of already-sorted runs is the cheap part
(docs/indexes.md, "Streaming build").
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

import xxhash

from .errors import StreamingUnavailable
from .extsort import DEFAULT_MEMORY, EXTRA_OVERHEAD, KEY_OVERHEAD
from .indexer import Indexer
from .results import MAX_SAMPLES

_hash = xxhash.xxh3_64_intdigest


@dataclass
class _Range:
    """What one page range gave: its entry keys (sorted), their data, its counts, and
    the page versions they came from."""
    body: int                                  # xxh3-64 of the range's bytes as decoded
    outside: dict[int, int]                    # chain page outside the range -> xxh3-64
    keys: list[bytes]
    data: dict[bytes, bytes]
    scanned: int
    bad: int
    samples: list[str]
    complete: bool                             # no problem met (a later page may fix one)
    size: int = 0                              # bytes counted against memory_limit


@dataclass
class StreamedKeys:
    """A finished streamed build: every entry key of the partition as sorted runs
    (one per range, in page order), their data, and the scan's counts."""
    runs: list[list[bytes]]
    data: dict[bytes, bytes]
    scanned: int
    bad: int
    bad_samples: list[str]
    indexer: Indexer
    redone: int = 0            # ranges decoded again at finish
    streamed: int = 0          # ranges whose streamed entries held
    decodes: int = 0           # range decodes during the transfer
    count: int = field(init=False)

    def __post_init__(self) -> None:
        self.count = sum(map(len, self.runs))


class StreamingIndex:
    """Entry keys of ``partition`` from a file being written at ``path`` (see the
    module doc). ``pages_written`` may be called from any thread; ``step`` and
    ``finish`` from one thread at a time."""

    def __init__(self, indexer: Indexer, partition: int, path: str, page_size: int,
                 page_count: int, span: int, counter: int = 0,
                 memory_limit: int = DEFAULT_MEMORY) -> None:
        from checkpoint.layout import Meta     # lower layer; loaded on use
        self.indexer, self.partition, self.path = indexer, partition, path
        self.ps, self.pcount, self.span = page_size, page_count, max(1, span)
        self.meta = Meta(1, partition, page_size, page_count, counter)
        self.nranges = -(-page_count // self.span) if page_count > 1 else 0
        self.memory_limit = memory_limit
        self._ranges: dict[int, _Range] = {}
        self._users: dict[int, set[int]] = {}   # outside page -> ranges whose chains read it
        self._dirty: set[int] = set()
        self._lock = threading.Lock()
        self._bytes = 0
        self.decodes = 0
        self.abandoned: str | None = None       # why the build stopped holding keys

    # -- notifications (any thread) --------------------------------------------------
    def pages_written(self, first: int, stop: int) -> None:
        """Pages ``first <= i < stop`` changed in the file."""
        if stop <= first or self.abandoned:
            return
        with self._lock:
            lo, hi = first // self.span, (stop - 1) // self.span
            self._dirty.update(range(lo, min(hi, self.nranges - 1) + 1))
            if self._users:
                for i in range(first, stop):
                    users = self._users.get(i)
                    if users:
                        self._dirty.update(users)

    def pending(self) -> int:
        with self._lock:
            return len(self._dirty)

    # -- decoding ------------------------------------------------------------------------
    def step(self) -> bool:
        """Decode one changed range from the file as it is now; False when none is
        waiting (or the build was abandoned)."""
        with self._lock:
            if not self._dirty or self.abandoned:
                return False
            r = min(self._dirty)
            self._dirty.discard(r)
        got = self._decode(r, self.path, strict=False)
        self.decodes += 1
        self._put(r, got)
        return True

    def _put(self, r: int, got: _Range) -> None:
        with self._lock:
            old = self._ranges.pop(r, None)
            if old is not None:
                self._bytes -= old.size
                for i in old.outside:
                    users = self._users.get(i)
                    if users is not None:
                        users.discard(r)
                        if not users:
                            del self._users[i]
            if self.abandoned:
                return
            self._ranges[r] = got
            self._bytes += got.size
            for i in got.outside:
                self._users.setdefault(i, set()).add(r)
            if self._bytes > self.memory_limit:
                self._abandon(f"its entry keys passed the memory limit of {self.memory_limit} bytes")

    def _abandon(self, why: str) -> None:
        self.abandoned = why
        self._ranges.clear()
        self._users.clear()
        self._dirty.clear()
        self._bytes = 0

    def _decode(self, r: int, path: str, *, strict: bool) -> _Range:
        """Range ``r``'s entries from ``path``: its bytes read once and hashed, the
        decoder run on exactly those bytes. ``strict``: a problem raises (the final
        file, already checked page by page); else it marks the range incomplete."""
        from checkpoint.pagefile import iter_live_range   # lower layer; loaded on use
        a, b = r * self.span, min((r + 1) * self.span, self.pcount)
        lo = max(1, a)
        with open(path, "rb", buffering=0) as f:
            body = os.pread(f.fileno(), (b - lo) * self.ps, lo * self.ps)
        outside: dict[int, int] = {}
        state = {"complete": len(body) == (b - lo) * self.ps}

        def seen(i: int, page: bytes) -> None:
            h = _hash(page)
            if outside.setdefault(i, h) != h:      # read twice, changed between: redo
                state["complete"] = False

        problems: list[object] = []
        keys: list[bytes] = []
        data: dict[bytes, bytes] = {}
        samples: list[str] = []
        bad = 0

        def add_with_data(key: bytes, d: bytes) -> None:
            data[key] = d
            keys.append(key)

        def on_bad(pk: bytes, bads: list) -> None:
            nonlocal bad
            bad += len(bads)
            if len(samples) < MAX_SAMPLES:
                samples.extend(f"key {pk!r}: index {x.index.name!r}: {x.reason}" for x in bads)

        scanned = 0
        if lo < b:
            on_error = None if strict else problems.append
            # iter_live_range hands on_error to _batches, where None means raise at the
            # first bad page; its annotation leaves None out
            for batch in iter_live_range(path, self.meta, lo, b, body, seen, on_error,  # type: ignore[arg-type]
                                         columns=True):
                scanned += self.indexer.feed_many(batch, keys.append, add_with_data, on_bad)
        keys.sort()
        size = sum(map(len, keys)) + KEY_OVERHEAD * len(keys) + \
            sum(len(d) + EXTRA_OVERHEAD for d in data.values())
        return _Range(_hash(body), outside, keys, data, scanned, bad, samples[:MAX_SAMPLES],
                      state["complete"] and not problems, size)

    # -- the end ----------------------------------------------------------------------
    def finish(self, path: str | None = None) -> StreamedKeys:
        """Every entry key of the file at ``path`` (default: the file streamed; the
        installed file after the rename): ranges whose page versions are not the
        file's are decoded again from it. Raises StreamingUnavailable when the build
        was abandoned, CorruptPageError for a bad page of the final file."""
        path = path or self.path
        if self.abandoned:
            raise StreamingUnavailable(f"streamed index of partition {self.partition} "
                                       f"not kept: {self.abandoned}")
        redone = streamed = 0
        runs: list[list[bytes]] = []
        data: dict[bytes, bytes] = {}
        scanned = bad = 0
        samples: list[str] = []
        with open(path, "rb", buffering=0) as f:
            fd = f.fileno()
            for r in range(self.nranges):
                got = self._ranges.get(r)
                if got is None or not got.complete or not self._holds(fd, r, got):
                    got = self._decode(r, path, strict=True)
                    redone += 1
                else:
                    streamed += 1
                runs.append(got.keys)
                if got.data:
                    data.update(got.data)
                scanned += got.scanned
                bad += got.bad
                if len(samples) < MAX_SAMPLES:
                    samples.extend(got.samples[:MAX_SAMPLES - len(samples)])
        self._ranges.clear()
        self._users.clear()
        return StreamedKeys(runs, data, scanned, bad, samples, self.indexer, redone, streamed,
                            self.decodes)

    def _holds(self, fd: int, r: int, got: _Range) -> bool:
        """Whether range ``r``'s recorded page versions are the file's."""
        a, b = r * self.span, min((r + 1) * self.span, self.pcount)
        lo = max(1, a)
        if _hash(os.pread(fd, (b - lo) * self.ps, lo * self.ps)) != got.body:
            return False
        return all(_hash(os.pread(fd, self.ps, i * self.ps)) == h for i, h in got.outside.items())


__all__ = ["StreamingIndex", "StreamedKeys", "StreamingUnavailable"]
