"""The key encoding: LMDB's byte order equals the values' natural order."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idx_helpers import rank  # the documented order: null < bools < numbers < str < bytes
from indexes import keycodec as kc

ints = st.integers(min_value=kc.INT_MIN, max_value=kc.INT_MAX)
floats = st.floats(allow_nan=False)
numbers = st.one_of(ints, floats)
texts = st.text(max_size=300)
blobs = st.binary(max_size=300)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts, blobs)




def long_pair(a: object, b: object) -> bool:
    return kc.is_long(kc.encode_value(a)) and kc.is_long(kc.encode_value(b))


@settings(max_examples=200)
@given(numbers, numbers)
def test_numbers_order_ints_and_floats_together(a, b) -> None:
    ea, eb = kc.encode_value(a), kc.encode_value(b)
    assert (ea < eb) == (a < b)
    assert (ea == eb) == (a == b)


@settings(max_examples=150)
@given(scalars, scalars)
def test_mixed_types_follow_the_documented_order(a, b) -> None:
    ea, eb = kc.encode_value(a), kc.encode_value(b)
    if long_pair(a, b) and ea[:kc.LONG_BODY] == eb[:kc.LONG_BODY]:
        return              # long values sharing a prefix are ordered by hash only
    if rank(a) < rank(b):
        assert ea < eb
    elif rank(a) > rank(b):
        assert ea > eb
    else:
        assert ea == eb


@settings(max_examples=150)
@given(scalars, st.binary(max_size=40))
def test_self_delimiting_and_round_trip(v, pk) -> None:
    enc = kc.encode_value(v)
    back, end = kc.decode_value(enc + pk)
    assert end == len(enc)
    if not kc.is_long(enc):
        if isinstance(v, float) and v.is_integer() and abs(v) <= kc.INT_MAX:
            assert back == v and isinstance(back, int)      # 2.0 comes back as 2
        else:
            assert back == v and type(back) is type(v)


@given(texts, texts, st.binary(max_size=20), st.binary(max_size=20))
def test_entry_keys_sort_by_value_then_primary_key(a, b, ka, kb) -> None:
    ea = kc.entry(1, kc.encode_value(a), a, ka, 511)[0]
    eb = kc.entry(1, kc.encode_value(b), b, kb, 511)[0]
    if long_pair(a, b):
        return
    ra, rb = (a.encode("utf-8", "surrogatepass"), ka), (b.encode("utf-8", "surrogatepass"), kb)
    if ra != rb:
        assert (ea < eb) == (ra < rb)


def test_zero_bytes_and_prefixes() -> None:
    vals = ["", "\x00", "\x00\x00", "\x00a", "a", "a\x00", "a\x00\x00", "ab", "b"]
    encs = [kc.encode_value(v) for v in vals]
    assert encs == sorted(encs)


def test_negative_zero_equals_zero_and_big_ints_are_exact() -> None:
    assert kc.encode_value(-0.0) == kc.encode_value(0.0) == kc.encode_value(0)
    big = 2**60
    assert kc.encode_value(big) < kc.encode_value(big + 1) < kc.encode_value(float(2**61))
    assert kc.decode_value(kc.encode_value(2**64 - 1))[0] == 2**64 - 1
    assert kc.encode_value(-math.inf) < kc.encode_value(kc.INT_MIN)
    assert kc.encode_value(math.inf) > kc.encode_value(kc.INT_MAX)


@pytest.mark.parametrize("bad", [math.nan, 2**64, -(2**63) - 1, [1], {"a": 1}, object()])
def test_unencodable_values(bad) -> None:
    with pytest.raises(kc.UnencodableValue):
        kc.encode_value(bad)


def test_long_values_and_long_primary_keys_fit_lmdb() -> None:
    v = "x" * 5000
    pk = b"k" * 600
    enc = kc.encode_value(v)
    assert kc.is_long(enc) and len(enc) <= 1 + kc.LONG_BODY + 2 + kc.HASH_LEN
    assert kc.encode_value(v + "y") != enc                      # the hash tells them apart
    key, data = kc.entry(7, enc, v, pk, 511)
    assert len(key) <= 511 and data
    assert kc.parse_entry(key, data) == (7, v, pk)
    short = kc.entry(7, kc.encode_value("v"), "v", b"pk", 511)
    assert short[1] == b"" and kc.parse_entry(*short) == (7, "v", b"pk")
    # A cut never splits an escaped zero.
    z = "\x00" * 300
    assert kc.decode_value(kc.encode_value(z))[0] == "\x00" * (kc.LONG_BODY // 2)


def test_feed_gives_the_same_entries_as_entries() -> None:
    """The rebuild's hot path (with its encoding cache) and the write path agree."""
    from indexes.definitions import IndexDefinition
    from indexes.indexer import Indexer
    defs = [IndexDefinition("a", "a"), IndexDefinition("b", "b.c", type="int"),
            IndexDefinition("n", "a", type="number")]
    ix = Indexer(defs, {"a": 1, "b": 2, "n": 3}, "json", 511)
    docs = [b'{"a": 1, "b": {"c": 1}}', b'{"a": 1.0, "b": {"c": true}}', b'{"a": true}',
            b'{"a": "1", "b": {"c": 2}}', b'{"a": "%s"}' % (b"x" * 300), b'[1]', b'nope',
            b'{"a": null, "b": {"c": 1.5}}', b'{"a": 1}', b'{"a": true, "b": {"c": 1}}']
    for i, raw in enumerate(docs * 2):
        pk = b"k%d" % i if i % 3 else b"p" * 500
        got: list[tuple[bytes, bytes]] = []
        bad = ix.feed(pk, raw, lambda k: got.append((k, b"")),  # noqa: B023 - called at once
                      lambda k, d: got.append((k, d)))  # noqa: B023 - called at once
        want, wbad = ix.entries(pk, raw)
        assert sorted(got) == sorted((e.key, e.data) for e in want)
        assert [b.reason for b in bad or []] == [b.reason for b in wbad]


def test_feed_many_gives_the_same_entries_and_bad_values_as_feed() -> None:
    """The batch hot path (orjson, top-level fields, shared cache keyed by value and
    type) against feed, on values that collide in a dict (1, 1.0, True), values
    orjson refuses but json takes (ints beyond 64 bits), unhashable fields, long
    primary keys and long values."""
    from indexes.definitions import IndexDefinition
    from indexes.indexer import Indexer
    defs = [IndexDefinition("a", "a"), IndexDefinition("i", "a", type="int"),
            IndexDefinition("s", "s", type="str", on_bad="refuse")]
    docs = [b'{"a": 1, "s": "x"}', b'{"a": 1.0, "s": "x"}', b'{"a": true, "s": "y"}',
            b'{"a": 99999999999999999999999}', b'{"a": [1], "s": {"x": 1}}', b'{"a": {}}',
            b'[1, 2]', b'nope', b'', b'{"a": "%s"}' % (b"z" * 300), b'{"a": -0.0, "s": ""}',
            b'{"a": 0, "s": "\\u0000"}', b'{"a": NaN}', b'{"a": 1e400}', b'"str"']
    items = [((b"k%d" % i) if i % 4 else b"p" * (480 + i % 40), raw)
             for i, raw in enumerate(docs * 3)]
    ref = Indexer(defs, {"a": 1, "i": 2, "s": 3}, "json", 511)
    want: list[tuple[bytes, bytes]] = []
    want_bad = []
    for pk, raw in items:
        bad = ref.feed(pk, raw, lambda k: want.append((k, b"")), lambda k, d: want.append((k, d)))
        if bad:
            want_bad.append((pk, [b.reason for b in bad]))
    ix = Indexer(defs, {"a": 1, "i": 2, "s": 3}, "json", 511)
    got: list[tuple[bytes, bytes]] = []
    got_bad = []
    n = ix.feed_many(items, lambda k: got.append((k, b"")), lambda k, d: got.append((k, d)),
                     lambda pk, bad: got_bad.append((pk, [b.reason for b in bad])))
    assert n == len(items)
    assert got == want and got_bad == want_bad
