"""Compact per-partition key index: key -> packed entry location (``page << 16 | slot``).

Why not a dict: a ``dict[bytes, int]`` keeps every key as a bytes object plus a
location int plus its table slot - about 130 bytes per entry for 16-byte keys, which
for a partition ten times the page-memory budget was larger than the budget itself.
The keys are already in the pages, so the index keeps only a 64-bit hash of each key
and its location, in two flat ``array('Q')`` columns of open-addressing tables with
linear probing: 16 bytes per slot, at a load factor of 3/8..3/4, so 21-43 (typically
~28) bytes per key, and no per-key Python object.  A small index is one table (an
empty one costs ~0.4 KiB, so many small partitions stay cheap); past 4096 slots it
is split into 64 segments by the hash's top bits, each growing on its own, so a
growth step needs 1/64 of the index in extra memory, not twice the whole table.

Collisions: a slot matches only if its hash equals the key's AND the key stored at its
location (read through ``key_at``, i.e. page memory) equals the key.  Two keys with
the same 64-bit hash therefore simply occupy two slots of the same probe chain.  The
page read costs nothing extra on the hot paths: a get or an update of an existing key
reads that page anyway, and a new key reads a page only on a full 64-bit collision.

Empty slots have location 0 (page 0 is the meta page, so no entry lives there).  The
index never deletes: a removed key keeps its tombstone entry and its slot.

Bulk path in C (``checkpoint/_keyaccel.c``, optional, off with ``FERRY_PAGE_ACCEL=0``
like every checkpoint accelerator): the open/install scan's per-key work - hashing
(xxh3-64 from the system's xxhash.h, equal to ``xxhash.xxh3_64_intdigest``) and probing
- runs over packed u64 columns, while every sizing decision (reserve, split, grow)
stays here: C stops when a segment is full and this code grows it and calls again.
So the tables are identical with and without it (tests/checkpoint/test_keyaccel.py).
The C hash runs only for the real hash; a custom ``hash_fn`` (tests forcing
collisions) hashes in Python and only the probing, which never hashes, runs in C.
"""
from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Callable, Iterator, Protocol, Sequence, cast

import xxhash

from .accel import ACCEL_ENV, load_accel

if TYPE_CHECKING:
    from typing_extensions import Buffer

SEGMENT_BITS = 6            # 64 independently growing tables, chosen by the hash's top bits
SEGMENTS = 1 << SEGMENT_BITS
MIN_SLOTS = 8               # the first table (power of two): an empty partition costs ~0.4 KiB
SPLIT_SLOTS = 4096          # one table up to this size (64 KiB), then SEGMENTS of them
MAX_LOAD_NUM, MAX_LOAD_DEN = 3, 4
_POS_BITS = 40              # a position is segment << 40 | slot


def key_hash(key: bytes) -> int:
    """The 64-bit hash of a key (tests replace it with a tiny one to force collisions)."""
    return xxhash.xxh3_64_intdigest(key)


_XXH3 = key_hash            # the real hash: what the C path computes
_ACCEL_ABI = 1


# One page of keyscan.iter_page_keys: (page, type, bytes in use, [(slot, key)]).
PageKeys = tuple[int, int, int, "list[tuple[int, bytes]]"]


class KeyAccel(Protocol):
    """``checkpoint._keyaccel`` as this module and the open scan use it (all of it:
    checkpoint/_keyaccel.pyi). Columns are bytes of native u64."""

    @property
    def MAX_LOAD_NUM(self) -> int: ...

    @property
    def MAX_LOAD_DEN(self) -> int: ...

    def hash_items(self, items: list[tuple[bytes, int]], /) -> tuple[bytes, bytes]: ...

    def page_hashes(self, pages: Sequence[PageKeys], /) -> tuple[bytes, bytes]: ...

    # -> (hashes, locations, more pages left)
    def scan_pages(self, pages: Iterator[PageKeys], limit: int, page_size: int, quarter: int,
                   space: array[int], roomy: set[int], free_pages: list[int], /
                   ) -> tuple[bytes, bytes, bool]: ...

    # -> None when all placed, else (index of the next item, the full segment)
    def place(self, src_h: Buffer, src_l: Buffer, start: int, shift: int,
              hashes: list[array[int]], locs: list[array[int]], masks: list[int],
              used: list[int], /) -> tuple[int, int] | None: ...


def _load_accel() -> KeyAccel | None:
    """``checkpoint._keyaccel`` when built, of this ABI version, not switched off, and
    with this module's load limits."""
    mod = load_accel("checkpoint._keyaccel", _ACCEL_ABI, ACCEL_ENV)
    if mod is None or (mod.MAX_LOAD_NUM, mod.MAX_LOAD_DEN) != (MAX_LOAD_NUM, MAX_LOAD_DEN):
        return None
    # the ABI version checked by load_accel is what vouches for these entry points
    return cast(KeyAccel, mod)


_accel = _load_accel()      # read at each bulk call: tests swap it


def accelerator() -> str | None:
    """``"c"`` when the C bulk path runs, else None (pure Python)."""
    return None if _accel is None else "c"


def _zeros(n: int) -> array[int]:
    return array("Q", bytes(8 * n))


class KeyIndex:
    """key -> location; ``key_at(location)`` returns the key stored at a location."""

    def __init__(self, key_at: Callable[[int], bytes | bytearray],
                 hash_fn: Callable[[bytes], int] | None = None) -> None:
        self._key_at = key_at
        self._hash = hash_fn if hash_fn is not None else key_hash   # module global, read now
        # The C hash only stands in for the real one; a lookup then calls xxhash
        # directly (one Python frame less on the read path).
        self._native = self._hash is _XXH3
        if self._native:
            self._hash = xxhash.xxh3_64_intdigest
        # One segment (shift 64: every 64-bit hash >> 64 is 0) until it reaches
        # SPLIT_SLOTS; then SEGMENTS segments chosen by the top SEGMENT_BITS bits.
        self._shift = 64
        self._hashes = [_zeros(MIN_SLOTS)]
        self._locs = [_zeros(MIN_SLOTS)]
        self._masks = [MIN_SLOTS - 1]
        self._used = [0]
        self._len = 0

    def __len__(self) -> int:
        return self._len

    @property
    def nbytes(self) -> int:
        """Bytes held by the tables (the index's whole memory, bar a few object headers)."""
        return 16 * sum(m + 1 for m in self._masks)

    # -- lookups -----------------------------------------------------------------
    def find(self, key: bytes) -> int:
        """The position holding ``key`` (valid until the next :meth:`add`), or -1."""
        h = self._hash(key)
        seg = h >> self._shift
        hashes, locs, mask = self._hashes[seg], self._locs[seg], self._masks[seg]
        i = h & mask
        while True:
            loc = locs[i]
            if loc == 0:
                return -1
            if hashes[i] == h and self._key_at(loc) == key:
                return seg << _POS_BITS | i
            i = (i + 1) & mask

    def get(self, key: bytes) -> int | None:
        """The location of ``key`` or None (:meth:`find` inlined: the read hot path)."""
        h = self._hash(key)
        seg = h >> self._shift
        hashes, locs, mask = self._hashes[seg], self._locs[seg], self._masks[seg]
        i = h & mask
        while True:
            loc = locs[i]
            if loc == 0:
                return None
            if hashes[i] == h and self._key_at(loc) == key:
                return loc
            i = (i + 1) & mask

    def loc_at(self, pos: int) -> int:
        return self._locs[pos >> _POS_BITS][pos & ((1 << _POS_BITS) - 1)]

    def locations(self) -> Iterator[int]:
        return (loc for locs in self._locs for loc in locs if loc)

    # -- changes -----------------------------------------------------------------
    def set_at(self, pos: int, loc: int) -> None:
        """Move the key found at ``pos`` (by :meth:`find`, no add since) to ``loc``."""
        if not loc:
            raise ValueError("location 0 is the empty-slot marker")
        self._locs[pos >> _POS_BITS][pos & ((1 << _POS_BITS) - 1)] = loc

    def add(self, key: bytes, loc: int) -> None:
        """Add a key the caller knows is absent (a just-failed :meth:`find`, or the
        open-time scan, where each key appears once in the file)."""
        if not loc:
            raise ValueError("location 0 is the empty-slot marker")
        h = self._hash(key)
        seg = h >> self._shift
        if (self._used[seg] + 1) * MAX_LOAD_DEN > (self._masks[seg] + 1) * MAX_LOAD_NUM:
            if len(self._masks) == 1 and self._masks[0] + 1 >= SPLIT_SLOTS:
                self._split()
                seg = h >> self._shift
            else:
                self._grow(seg)
        self._place(seg, h, loc)
        self._used[seg] += 1
        self._len += 1

    def add_many(self, items: list[tuple[bytes, int]]) -> None:
        """:meth:`add` for many keys the caller knows are absent and distinct (the
        open/install scan): the tables are sized for all of them first, then each key
        is placed in one inlined loop - about a third of the per-key cost of
        :meth:`add`. Lookups find the same locations either way."""
        if not items:
            return
        acc = _accel
        if acc is not None:
            src_h: bytes | array[int]
            src_l: bytes | array[int]
            if self._native and type(items) is list:
                src_h, src_l = acc.hash_items(items)      # checks the locations too
            else:
                hf = self._hash
                hs = [hf(k) for k, _loc in items]
                ls = [loc for _k, loc in items]
                if min(ls) <= 0:
                    raise ValueError("location 0 is the empty-slot marker")
                src_h, src_l = array("Q", hs), array("Q", ls)
            self._add_columns(acc, src_h, src_l)
            return
        hf = self._hash
        pairs = [(hf(k), loc) for k, loc in items]
        if min(loc for _h, loc in pairs) <= 0:
            raise ValueError("location 0 is the empty-slot marker")
        self._reserve(self._len + len(pairs))
        shift, masks, used = self._shift, self._masks, self._used
        hashes_l, locs_l = self._hashes, self._locs
        for h, loc in pairs:
            seg = h >> shift
            if (used[seg] + 1) * MAX_LOAD_DEN > (masks[seg] + 1) * MAX_LOAD_NUM:
                self._grow(seg)               # a segment above the average share
            mask, locs = masks[seg], locs_l[seg]
            i = h & mask
            while locs[i]:
                i = (i + 1) & mask
            hashes_l[seg][i] = h
            locs[i] = loc
            used[seg] += 1
        self._len += len(pairs)

    def add_page_keys(self, pages: Sequence[PageKeys]) -> None:
        """:meth:`add_many` of the keys of ``pages``, items of ``keyscan.iter_page_keys``
        (``(page, type, used, [(slot, key)])``) at location ``page << 16 | slot``,
        hashed in C when it can be (no per-key tuple built)."""
        acc = _accel
        if acc is not None and self._native and type(pages) is list:
            if pages:
                self._add_columns(acc, *acc.page_hashes(pages))
            return
        self.add_many([(key, page << 16 | slot)
                       for page, _t, _u, keys in pages for slot, key in keys])

    @property
    def hash_fn(self) -> Callable[[bytes], int]:
        """The hash this index files keys under (xxh3-64 unless a test set another)."""
        return self._hash

    def scan_accel(self) -> KeyAccel | None:
        """The C module whose ``scan_pages`` hashes keys for :meth:`add_hashed`, or
        None: no C path, or this index has a custom hash (tests)."""
        return _accel if self._native else None

    def add_hashed(self, hashes: bytes, locations: bytes) -> None:
        """:meth:`add_many` of keys already hashed by a C path (``scan_pages``, or the
        decoder's ``keyscan.scan_key_hashes``): two columns of native u64, hashes
        (xxh3-64) and locations (never 0)."""
        acc = _accel
        if acc is None or not self._native:
            raise RuntimeError("add_hashed needs the C key index path and the real hash")
        self._add_columns(acc, hashes, locations)

    def _add_columns(self, acc: KeyAccel, src_h: bytes | array[int], src_l: bytes | array[int]
                     ) -> None:
        """add_many's placing, in C: the u64 columns of hashes and locations."""
        n = len(src_l) // 8 if isinstance(src_l, bytes) else len(src_l)
        if not n:
            return
        self._reserve(self._len + n)
        self._place_all(acc, src_h, src_l)
        self._len += n

    def _place_all(self, acc: KeyAccel, src_h: bytes | array[int], src_l: bytes | array[int]
                   ) -> None:
        """Place every (hash, location) of the columns (location 0: skipped) in order,
        growing a segment when it is full - the pure-Python loops' exact steps."""
        start = 0
        while True:
            full = acc.place(src_h, src_l, start, self._shift, self._hashes, self._locs,
                             self._masks, self._used)
            if full is None:
                return
            start, seg = full
            self._grow(seg)

    def _reserve(self, total: int) -> None:
        """Grow (and split) so that ``total`` keys spread evenly fit within the load
        limit: the sizes incremental adds would reach, reached in one step each."""
        if len(self._masks) == 1:
            if total * MAX_LOAD_DEN <= (self._masks[0] + 1) * MAX_LOAD_NUM:
                return
            while self._masks[0] + 1 < SPLIT_SLOTS and \
                    total * MAX_LOAD_DEN > (self._masks[0] + 1) * MAX_LOAD_NUM:
                self._grow(0)
            if total * MAX_LOAD_DEN <= (self._masks[0] + 1) * MAX_LOAD_NUM:
                return
            self._split()
        share = -(-total // SEGMENTS)
        for seg in range(SEGMENTS):
            while (share + 1) * MAX_LOAD_DEN > (self._masks[seg] + 1) * MAX_LOAD_NUM:
                self._grow(seg)

    def _place(self, seg: int, h: int, loc: int) -> None:
        locs, mask = self._locs[seg], self._masks[seg]
        i = h & mask
        while locs[i]:
            i = (i + 1) & mask
        self._hashes[seg][i] = h
        locs[i] = loc

    def _split(self) -> None:
        """One full table -> SEGMENTS tables with twice its slots in all."""
        old_h, old_l = self._hashes[0], self._locs[0]
        size = 2 * len(old_l) // SEGMENTS
        self._shift = 64 - SEGMENT_BITS
        self._hashes = [_zeros(size) for _ in range(SEGMENTS)]
        self._locs = [_zeros(size) for _ in range(SEGMENTS)]
        self._masks = [size - 1] * SEGMENTS
        self._used = [0] * SEGMENTS
        acc = _accel
        if acc is not None:
            self._place_all(acc, old_h, old_l)
            return
        for h, loc in zip(old_h, old_l):
            if loc:
                seg = h >> self._shift
                if (self._used[seg] + 1) * MAX_LOAD_DEN > (self._masks[seg] + 1) * MAX_LOAD_NUM:
                    self._grow(seg)           # skewed hashes: most keys in few segments
                self._place(seg, h, loc)
                self._used[seg] += 1

    def _grow(self, seg: int) -> None:
        """Double one segment: the transient is that segment's old + new table, 3/64
        of the index, not the whole index twice over."""
        old_h, old_l = self._hashes[seg], self._locs[seg]
        size = 2 * (self._masks[seg] + 1)
        self._hashes[seg], self._locs[seg], self._masks[seg] = _zeros(size), _zeros(size), size - 1
        acc = _accel
        if acc is not None:                   # one table, half full at most: never stops
            acc.place(old_h, old_l, 0, 64, [self._hashes[seg]], [self._locs[seg]],
                      [size - 1], [0])
            return
        for h, loc in zip(old_h, old_l):
            if loc:
                self._place(seg, h, loc)
