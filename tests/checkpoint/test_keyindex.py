"""The compact key index (checkpoint/keyindex.py): a model test with forced hash
collisions, a table of collision cases, its memory per key, and the whole store run
with a tiny hash so that nearly every key collides."""
from __future__ import annotations

import tempfile
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpoint import PartitionStore, keyindex
from checkpoint.keyindex import KeyIndex

TOP = 1 << 62                # a bit that selects another segment (the top 6 bits do)

HASHES = {
    "constant": lambda k: 5,                                  # every key collides
    "tiny": lambda k: sum(k) % 3,                              # three chains, one segment
    "tiny-segments": lambda k: (len(k) % 2) * TOP | sum(k) % 2,  # two segments, two chains each
    "real": keyindex.key_hash,
}


class Locations:
    """Stands in for the pages: location -> key, as Partition._key_at reads it."""

    def __init__(self) -> None:
        self.keys: dict[int, bytes] = {}
        self.next = 1 << 16          # page 1, slot 0: never 0, the empty marker

    def new(self, key: bytes) -> int:
        loc, self.next = self.next, self.next + 1
        self.keys[loc] = key
        return loc


def _put(idx: KeyIndex, locs: Locations, key: bytes) -> int:
    """What Partition.write does: find, then move or add (the key gets a new location)."""
    pos = idx.find(key)
    loc = locs.new(key)
    if pos < 0:
        idx.add(key, loc)
    else:
        idx.set_at(pos, loc)
    return loc


@pytest.mark.parametrize("name", sorted(HASHES))
@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["put", "get"]), st.binary(min_size=0, max_size=4)),
                    max_size=300))
def test_index_matches_a_dict_under_collisions(name: str, ops) -> None:
    locs = Locations()
    idx = KeyIndex(locs.keys.__getitem__, HASHES[name])
    model: dict[bytes, int] = {}
    for op, key in ops:
        if op == "put":
            model[key] = _put(idx, locs, key)
        else:
            assert idx.get(key) == model.get(key)
    assert len(idx) == len(model)
    assert sorted(idx.locations()) == sorted(model.values())
    for key, loc in model.items():
        assert idx.get(key) == loc


@pytest.mark.parametrize("hash_fn, keys, absent", [
    # same hash, different keys: told apart by reading the key at the location
    (lambda k: 7, [b"a", b"b", b"c"], [b"d", b""]),
    # the empty key and a key whose hash is 0
    (lambda k: 0, [b"", b"\x00", b"\x00\x00"], [b"\x01"]),
    # same slot within a segment, different segments
    (lambda k: (k[0] % 4) * TOP | 1, [b"\x00x", b"\x01x", b"\x04x", b"\x05y"], [b"\x02x"]),
    # the largest hash value
    (lambda k: (1 << 64) - 1, [b"x", b"y"], [b"z"]),
])
def test_collision_table(hash_fn, keys: list[bytes], absent: list[bytes]) -> None:
    locs = Locations()
    idx = KeyIndex(locs.keys.__getitem__, hash_fn)
    first = {k: _put(idx, locs, k) for k in keys}
    for k in keys:
        assert idx.get(k) == first[k]
    for k in absent:
        assert idx.get(k) is None and idx.find(k) == -1
    moved = _put(idx, locs, keys[0])          # moving one key leaves its colliders alone
    assert idx.get(keys[0]) == moved and len(idx) == len(keys)
    for k in keys[1:]:
        assert idx.get(k) == first[k]


def test_location_zero_is_refused() -> None:
    idx = KeyIndex(lambda loc: b"")
    with pytest.raises(ValueError, match="empty-slot"):
        idx.add(b"k", 0)


def test_index_memory_is_about_thirty_bytes_per_key() -> None:
    n = 20_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        idx = KeyIndex(lambda loc: b"never read: all hashes differ")
        for i in range(n):
            idx.add(b"key-%012d" % i, (i + 1) << 16)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(idx) == n
    assert idx.nbytes / n <= 43                 # 16 B per slot, load >= 3/8
    assert used / n <= 48, f"{used / n:.1f} B per key"   # no per-key Python objects


# -- the store with a tiny hash: nearly every key collides ---------------------------

OPS = st.lists(st.tuples(st.sampled_from(["put", "put", "remove", "apply", "ckpt"]),
                         st.integers(0, 40), st.integers(0, 2000)), max_size=120)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_store_with_colliding_hashes_matches_model(ops) -> None:
    mp = pytest.MonkeyPatch()
    mp.setattr(keyindex, "key_hash", lambda k: sum(k) % 5)   # read when a partition opens
    try:
        with tempfile.TemporaryDirectory() as d:
            s = PartitionStore.open(d, page_size=1024, memory_budget=32 * 1024,
                                    checkpoint_interval=None, wal_sync="none")
            s.create_partition(0)
            assert s.parts[0].index._hash(b"k1") < 5      # the tiny hash is in use
            model: dict[bytes, bytes] = {}
            for op, k, size in ops:
                key = b"k%d" % k
                if op == "put":
                    model[key] = bytes([k % 251]) * size     # some values overflow 1 KiB pages
                    s.put(0, key, model[key])
                elif op == "remove":
                    model.pop(key, None)
                    s.remove(0, key)
                elif op == "apply":
                    model[key] = b"applied%d" % size
                    assert s.apply(0, key, model[key], s.counter(0) + 1)
                    assert not s.apply(0, key, b"stale", s.counter(0))   # idempotent
                else:
                    s.checkpoint()
            _check(s, model)
            s.close(checkpoint=False)        # reopen = file scan + WAL replay
            s = PartitionStore.open(d, page_size=1024, memory_budget=32 * 1024,
                                    checkpoint_interval=None, wal_sync="none")
            _check(s, model)
            s.close()
            s = PartitionStore.open(d, page_size=1024, memory_budget=32 * 1024,
                                    checkpoint_interval=None, wal_sync="none")
            _check(s, model)                 # reopen after a checkpoint: file scan only
            s.close()
    finally:
        mp.undo()


def _check(s: PartitionStore, model: dict[bytes, bytes]) -> None:
    for k in range(41):
        key = b"k%d" % k
        assert s.get(0, key) == model.get(key), key
    assert dict(s.scan(0)) == model


@pytest.mark.parametrize("name, hash_fn", [
    # every key in segment 0 (top bits zero); 20 low bits so chains stay short
    ("one segment", lambda k: int.from_bytes(k, "big") * 2654435761 % (1 << 20)),
    ("two segments", lambda k: (k[-1] % 2) << 63 | int.from_bytes(k, "big") * 40503 % (1 << 20)),
    ("real", keyindex.key_hash),
])
def test_split_and_growth_keep_every_key(name: str, hash_fn) -> None:
    """Past SPLIT_SLOTS the one table becomes SEGMENTS tables; skewed hashes crowd a
    few of them, which must then grow rather than overflow."""
    n = keyindex.SPLIT_SLOTS if name != "real" else 4 * keyindex.SPLIT_SLOTS
    locs = Locations()
    idx = KeyIndex(locs.keys.__getitem__, hash_fn)
    model = {}
    for i in range(n):
        key = i.to_bytes(3, "big")
        model[key] = _put(idx, locs, key)
        if i % 1000 == 0:                        # updates in between
            model[key] = _put(idx, locs, key)
    assert len(idx._masks) == keyindex.SEGMENTS and len(idx) == len(model)
    for key in list(model)[::37] + [b"\xff\xff\xff", b"x"]:
        assert idx.get(key) == model.get(key)
    assert sorted(idx.locations()) == sorted(model.values())


@pytest.mark.parametrize("name", sorted(HASHES))
@settings(max_examples=30, deadline=None)
@given(keys=st.lists(st.binary(min_size=0, max_size=4), unique=True, max_size=400),
       cuts=st.lists(st.integers(0, 400), max_size=4), then=st.binary(max_size=4))
def test_add_many_equals_add(name: str, keys: list[bytes], cuts: list[int], then: bytes) -> None:
    """The install scan's bulk add: the same lookups as one add per key, in batches of
    any size (sizing the tables up front, splitting, growing a crowded segment)."""
    locs = Locations()
    idx = KeyIndex(locs.keys.__getitem__, HASHES[name])
    items = [(k, locs.new(k)) for k in keys]
    bounds = sorted({0, len(items), *(min(c, len(items)) for c in cuts)})
    for lo, hi in zip(bounds, bounds[1:]):
        idx.add_many(items[lo:hi])
    idx.add_many([])
    assert len(idx) == len(items)
    for k, loc in items:
        assert idx.get(k) == loc
    model = dict(items)
    model[then] = _put(idx, locs, then)           # a later add or move still works
    assert idx.get(then) == model[then] and len(idx) == len(model)
    assert sorted(idx.locations()) == sorted(model.values())


def test_add_many_sizes_like_add_and_refuses_location_zero() -> None:
    keys = [b"key-%08d" % i for i in range(50_000)]
    one, bulk = KeyIndex(lambda loc: keys[loc - 1]), KeyIndex(lambda loc: keys[loc - 1])
    for i, k in enumerate(keys):
        one.add(k, i + 1)
    bulk.add_many([(k, i + 1) for i, k in enumerate(keys)])
    # the same load limits: never more than the next doubling of add()'s tables
    assert one.nbytes <= bulk.nbytes <= 2 * one.nbytes
    with pytest.raises(ValueError, match="empty-slot"):
        KeyIndex(lambda loc: b"").add_many([(b"a", 1), (b"b", 0)])


def test_add_many_past_the_split_with_skewed_hashes() -> None:
    """Sized for an even spread, the segments a skewed hash crowds must still grow."""
    skewed = lambda k: int.from_bytes(k, "big") * 2654435761 % (1 << 20)   # noqa: E731
    locs = Locations()
    idx = KeyIndex(locs.keys.__getitem__, skewed)
    items = [(i.to_bytes(3, "big"), 0) for i in range(2 * keyindex.SPLIT_SLOTS)]
    items = [(k, locs.new(k)) for k, _ in items]
    idx.add_many(items[:100])
    idx.add_many(items[100:])
    assert len(idx._masks) == keyindex.SEGMENTS and len(idx) == len(items)
    for k, loc in items[::7]:
        assert idx.get(k) == loc
    assert idx.get(b"\xff\xff\xff") is None
