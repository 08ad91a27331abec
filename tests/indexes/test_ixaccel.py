"""The C fast path of the rebuild (indexes/_ixaccel.c via indexes/accel.py) against the
pure-Python path: the same entries, in the same order, and the same bad-value reports,
for random documents (valid, invalid, truncated, unusual) and random definitions."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from array import array
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpoint.decode import LiveColumns
from indexes import accel
from indexes.definitions import IndexDefinition
from indexes.indexer import Indexer

try:
    import importlib
    BUILT: ModuleType | None = importlib.import_module("indexes._ixaccel")
except ImportError:  # pragma: no cover - depends on the build
    BUILT = None

needs_accel = pytest.mark.skipif(BUILT is None, reason="indexes._ixaccel is not built "
                                 "(python -c 'from setuptools import setup; setup()' build_ext --inplace)")

NAMES = ["city", "n", "é", "a b", "x"]


def run(defs: list[IndexDefinition], items: list, mod: ModuleType | None,
        max_key: int = 511) -> tuple[int, list, list, bool]:
    """feed_many of ``items`` with ``mod`` as the accelerator (None: pure Python)."""
    saved = accel.module
    accel.module = mod
    try:
        ix = Indexer(defs, {d.name: i + 1 for i, d in enumerate(defs)}, "json", max_key)
        keys: list[bytes] = []            # list.append: the C side's PyList_Append
        with_data: list[tuple[bytes, bytes]] = []
        bad: list = []
        n = ix.feed_many(items, keys.append, lambda k, d: with_data.append((k, d)),
                         lambda pk, b: bad.append((pk, [(x.index.name, x.reason) for x in b])))
        # the write path (Indexer.entries) with the same accelerator
        entries = []
        for pk, raw in items:
            e, b = ix.entries(pk, raw)
            entries.append(([(x.index.name, x.key, x.data, x.head, type(x.value), x.value)
                             for x in e], [(x.index.name, x.reason) for x in b]))
        return n, [(k, b"") for k in keys] + with_data, bad, ix.accelerated, entries
    finally:
        accel.module = saved


def columns(items: list) -> LiveColumns:
    """``items`` as the page decoder's LiveColumns: keys and values in one buffer,
    every third value in the spill (as an overflow chain's value is)."""
    data, spill, recs = bytearray(b"pad"), bytearray(), array("q")
    for i, (pk, raw) in enumerate(items):
        k0 = len(data)
        data += pk
        if i % 3 == 2:
            recs.extend([k0, len(pk), ~len(spill), len(raw)])
            spill += raw
        else:
            recs.extend([k0, len(pk), len(data), len(raw)])
            data += raw
    return LiveColumns(bytes(data), bytes(spill), recs.tobytes())


def run_columns(defs: list[IndexDefinition], items: list, mod: ModuleType | None,
                max_key: int = 511) -> tuple[int, list, list]:
    """feed_many of ``items`` handed over as LiveColumns."""
    saved = accel.module
    accel.module = mod
    try:
        ix = Indexer(defs, {d.name: i + 1 for i, d in enumerate(defs)}, "json", max_key)
        keys: list[bytes] = []
        with_data: list[tuple[bytes, bytes]] = []
        bad: list = []
        n = ix.feed_many(columns(items), keys.append, lambda k, d: with_data.append((k, d)),
                         lambda pk, b: bad.append((pk, [(x.index.name, x.reason) for x in b])))
        return n, [(k, b"") for k in keys] + with_data, bad
    finally:
        accel.module = saved


def same(defs: list[IndexDefinition], items: list, max_key: int = 511) -> None:
    want = run(defs, items, None, max_key)
    got = run(defs, items, BUILT, max_key)
    assert got[3] == (all(len(d.path) == 1 for d in defs) and bool(defs))
    assert got[:3] == want[:3]
    # the same pairs in buffers (the decoder's LiveColumns), both ways
    assert columns(items).pairs() == [tuple(x) for x in items]
    assert run_columns(defs, items, BUILT, max_key) == want[:3]
    assert run_columns(defs, items, None, max_key) == want[:3]
    # the write path: the same entries (values of the same type, -0.0 stays -0.0)
    # and reasons both ways, and the same set as feed_many (it shares no cache)
    assert repr(got[4]) == repr(want[4])
    entries = [(k, d) for e, _b in want[4] for _n, k, d, *_ in e]
    bads = [(pk, b) for (pk, _raw), (_e, b) in zip(items, want[4]) if b]
    assert sorted(entries) == sorted(got[1]) and bads == got[2]


# -- random JSON text ----------------------------------------------------------------
WS = st.sampled_from(["", "", "", " ", "\n", "\t ", "\r\n  "])
NUMBER_TEXT = st.one_of(
    st.integers(-(1 << 70), 1 << 70).map(str),
    st.integers(-(10 ** 19), 10 ** 19).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["0", "-0", "0.0", "-0.0", "1e5", "1E+5", "1e-5", "2.5E-3", "1e400",
                     "-1e400", "1e-400", "9007199254740993", "-9223372036854775808",
                     "18446744073709551615", "18446744073709551616", "123456789012345678",
                     "1234567890123456789", "0.1e1", "1.0", "5e0",
                     "01", "1.", ".5", "-", "+1", "1e", "1e+", "--1", "0x10", "NaN",
                     "Infinity", "1.5e308", "4.9e-324"]))
PLAIN_TEXT = st.text(st.characters(blacklist_categories=["Cs"]), max_size=12)
STRING_TEXT = st.one_of(
    PLAIN_TEXT.map(lambda s: json.dumps(s, ensure_ascii=False)),
    PLAIN_TEXT.map(json.dumps),                          # \uXXXX escapes
    st.text(max_size=8).map(lambda s: json.dumps(s)),    # lone surrogates as escapes
    st.sampled_from(['"Oslo"', '"ci\\u0074y"', '"a\\"b"', '"\\/"', '"\\x"', '"\\u12"',
                     '"tab\there"', '"\\ud800"', '"\\ud83d\\ude00"', '""', '"' + "y" * 250 + '"',
                     '"' + "é" * 101 + '"', '"' + "z" * 200 + '"']))
SCALAR_TEXT = st.one_of(STRING_TEXT, NUMBER_TEXT,
                        st.sampled_from(["true", "false", "null", "tru", "nul", "True"]))
KEY_TEXT = st.one_of(st.sampled_from(NAMES).map(lambda k: json.dumps(k, ensure_ascii=False)),
                     st.sampled_from(NAMES).map(json.dumps),
                     st.sampled_from(['"ci\\u0074y"', '"c\\u0069ty"', '"\\n"', '"city "']),
                     PLAIN_TEXT.map(json.dumps))


def container(children):
    def obj(pairs_ws):
        return "{" + ",".join(f"{w1}{k}{w2}:{w3}{v}" for k, v, w1, w2, w3 in pairs_ws) + "}"
    pair = st.tuples(KEY_TEXT, children, WS, WS, WS)
    return st.one_of(st.lists(pair, max_size=5).map(obj),
                     st.lists(children, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]"))


VALUE_TEXT = st.recursive(SCALAR_TEXT, container, max_leaves=12)
TOP_PAIR = st.tuples(KEY_TEXT, VALUE_TEXT, WS, WS, WS)
DOC_TEXT = st.one_of(
    st.tuples(WS, st.lists(TOP_PAIR, max_size=6), WS).map(
        lambda t: t[0] + "{" + ",".join(f"{a}{k}{b}:{c}{v}" for k, v, a, b, c in t[1]) + "}" + t[2]),
    VALUE_TEXT)


PLAIN_SCALAR = st.one_of(
    st.text(st.characters(blacklist_categories=["Cs", "Cc"], blacklist_characters='"\\'),
            max_size=30).map(lambda s: json.dumps(s, ensure_ascii=False)),
    st.integers(-(10 ** 18) + 1, 10 ** 18 - 1).map(str),
    st.integers(-(1 << 60), 1 << 60).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["true", "false", "null", '"Oslo"', "0", "-0", "1.5", "1e3", "-2E-2"]))


VALID_TEXT = st.recursive(st.one_of(PLAIN_SCALAR, PLAIN_TEXT.map(json.dumps)), container,
                          max_leaves=8)


@st.composite
def raw_docs(draw) -> bytes:
    """Mostly objects holding the wanted names with plain values (what the C side
    takes), mixed with anything; then sometimes broken."""
    if draw(st.integers(0, 4)) == 0:
        raw = draw(DOC_TEXT).encode("utf-8", "surrogatepass")
    else:
        # per name: 80% a plain scalar, 15% any valid value, 5% anything
        kinds = [PLAIN_SCALAR] * 16 + [VALID_TEXT] * 3 + [VALUE_TEXT]
        pairs = [(json.dumps(k, ensure_ascii=False), draw(kinds[draw(st.integers(0, 19))]))
                 for k in NAMES if draw(st.integers(0, 19)) < 19]
        plain_key = PLAIN_TEXT.map(lambda k: json.dumps(k, ensure_ascii=False))
        pairs += draw(st.lists(st.tuples(st.one_of(plain_key, plain_key, KEY_TEXT), VALID_TEXT),
                               max_size=3))
        pairs = draw(st.permutations(pairs))
        if pairs and draw(st.booleans()):           # a duplicate key: the last wins
            pairs.append((pairs[0][0], draw(PLAIN_SCALAR)))
        sep = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " :\t")]))
        raw = ("{" + sep[0].join(f"{k}{sep[1]}{v}" for k, v in pairs) + "}").encode(
            "utf-8", "surrogatepass")
    how = draw(st.sampled_from(["as is"] * 12 + ["truncate", "insert", "replace", "bom", "tail",
                                                  "pad", "pad"]))
    if how == "truncate" and raw:
        raw = raw[:draw(st.integers(0, len(raw) - 1))]
    elif how in ("insert", "replace") and raw:
        i = draw(st.integers(0, len(raw) - 1))
        b = draw(st.sampled_from([b"\x00", b"\x1f", b"\x7f", b"\x80", b"\xc0\x80", b"\xed\xa0\x80",
                                  b"\xf4\x90\x80\x80", b"\xff", b"\xe2\x82", b"\xf0\x9f\x98\x80",
                                  b",", b"}", b"]", b'"', b"\\", b" ", b"{", b":"]))
        raw = raw[:i] + b + raw[i + (how == "replace"):]
    elif how == "bom":
        raw = b"\xef\xbb\xbf" + raw
    elif how == "tail":
        raw += draw(st.sampled_from([b"x", b" ", b"}", b",", b"\x00", b" {}"]))
    elif how == "pad" and raw.startswith(b"{") and len(raw) > 2:
        # a long plain string first, so the 16-byte scan runs over it
        pad = draw(st.sampled_from([b"p" * 40, b"q" * 33 + "\u00e9".encode() * 9,
                                    b"r" * 47 + b'\\"', b"s" * 20 + b"\x01", b"t" * 18 + b"\xed\xa0\x80"]))
        raw = b'{"pad": "' + pad + b'", ' + raw[1:]
    return raw


@st.composite
def plain_docs(draw) -> bytes:
    """Objects the C side takes whole when the types fit: every name, plain values."""
    pairs = [(json.dumps(k, ensure_ascii=False), draw(PLAIN_SCALAR)) for k in NAMES]
    pairs += draw(st.lists(st.tuples(PLAIN_TEXT.map(lambda k: json.dumps(k, ensure_ascii=False)),
                                     VALID_TEXT), max_size=2))
    pairs = draw(st.permutations(pairs))
    if draw(st.booleans()):
        pairs.insert(0, ('"pad"', '"' + "x" * draw(st.integers(0, 100)) + '"'))
    return ("{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}").encode()


TYPE = st.sampled_from([None, None, None, None, None, None, None, "int", "number", "str", "bool", "bytes"])
DEFS = st.lists(st.tuples(st.sampled_from(NAMES), TYPE), min_size=1,
                max_size=3).map(lambda xs: [IndexDefinition(f"i{j}", (f,), type=t)
                                            for j, (f, t) in enumerate(xs)])
PK = st.one_of(st.binary(min_size=0, max_size=8), st.binary(min_size=0, max_size=8),
               st.binary(min_size=30, max_size=60))


@needs_accel
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(defs=DEFS, items=st.lists(st.tuples(PK, st.one_of(raw_docs(), plain_docs())), min_size=1,
                                  max_size=8),
       max_key=st.sampled_from([511, 511, 511, 64]))
def test_c_and_python_paths_agree_on_random_documents(defs, items, max_key) -> None:
    same(defs, items, max_key)


@needs_accel
@settings(max_examples=100, deadline=None)
@given(doc=st.recursive(st.none() | st.booleans() | st.integers(-(1 << 66), 1 << 66)
                        | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
                        lambda c: st.lists(c, max_size=3)
                        | st.dictionaries(st.sampled_from(NAMES) | st.text(max_size=3), c, max_size=4),
                        max_leaves=10),
       ascii_=st.booleans(), defs=DEFS)
def test_c_and_python_paths_agree_on_documents_json_writes(doc, ascii_, defs) -> None:
    raw = json.dumps(doc, ensure_ascii=ascii_).encode("utf-8", "surrogatepass")
    same(defs, [(b"k", raw), (b"k2", raw + b" ")])


@needs_accel
def test_tricky_documents() -> None:
    """Hand-picked cases: duplicate keys (last wins), an escaped key spelling a wanted
    name, numbers at the edges of what the C side takes, nesting past its depth."""
    defs = [IndexDefinition("c", "city"), IndexDefinition("n", "n", type="number"),
            IndexDefinition("i", "n", type="int")]
    deep = b'{"city": "x", "d": ' + b"[" * 200 + b"]" * 200 + b"}"
    docs = [b'{"city": "Oslo", "n": 1, "city": "Lima"}', b'{"ci\\u0074y": "Pune", "n": 2}',
            b'{"city": "Kyiv", "n": 123456789012345678}', b'{"city": "K", "n": 1234567890123456789}',
            b'{"city": "K", "n": -0}', b'{"city": "K", "n": -0.0}', b'{"city": "K", "n": 1e400}',
            b'{"city": "K", "n": 18446744073709551616}', b'{"city": "K", "n": 9007199254740993}',
            b'{"city": "K", "n": 1, "big": 1' + b"0" * 5000 + b"}", deep,
            b'{"city": "' + b"y" * 200 + b'", "n": 0.5}', b'{"city": "' + b"y" * 201 + b'", "n": 1}',
            b'{"city": "\\u00e9", "n": 1}', b'{"city": "\xc3\xa9", "n": 1}', b'{"city": "\xed\xa0\x80"}',
            b'{"city": null, "n": true}', b'{"city": [], "n": {}}', b'{}', b'[]', b'', b' ',
            b'{"city": "a", "n": 1} x', b'\xef\xbb\xbf{"city": "a"}', b'{"city": "a", "x": "\\ud800"}']
    same(defs, [(b"pk%d" % i, d) for i, d in enumerate(docs)])
    same(defs, [(b"p" * 500, d) for d in docs])                  # keys past max_key


@needs_accel
def test_items_that_are_not_pairs_of_bytes_fail_as_in_python() -> None:
    defs = [IndexDefinition("c", "city")]
    good = (b"k", b'{"city": "a"}')
    assert run(defs, [good, (bytearray(b"k2"), memoryview(b'{"city": "b"}'))], BUILT)[:3] == \
        run(defs, [good, (bytearray(b"k2"), memoryview(b'{"city": "b"}'))], None)[:3]
    assert run(defs, (x for x in [good, good]), BUILT)[0] == 2             # any iterable
    for bad in ([good, (b"k",)], [good, 5]):
        with pytest.raises((ValueError, TypeError)) as c_err:
            run(defs, bad, BUILT)
        with pytest.raises((ValueError, TypeError)) as py_err:
            run(defs, bad, None)
        assert type(c_err.value) is type(py_err.value)


@needs_accel
def test_add_errors_propagate() -> None:
    saved = accel.module
    accel.module = BUILT
    try:
        ix = Indexer([IndexDefinition("c", "city")], {"c": 1}, "json", 511)

        def add(k: bytes) -> None:
            raise RuntimeError("full")
        with pytest.raises(RuntimeError, match="full"):
            ix.feed_many([(b"k", b'{"city": "a"}')], add, lambda k, d: None, lambda pk, b: None)
    finally:
        accel.module = saved


@needs_accel
def test_scanner_finds_last_duplicate_and_refuses_invalid_json() -> None:
    assert BUILT.scan(b'{"a": 1, "b": [1, {"a": 2}], "a": "x"}', (b"a", b"b", b"z")) == \
        ((1, 0, b"x"), (7, 0, b""), (0, 0, b""))
    for raw in (b'{"a": 01}', b'{"a": 1,}', b'{"a" 1}', b'{"a": "\x01"}', b'{"a": tru}',
                b'{"a": [1 2]}', b'{"a": 1}}', b'{"a": "\\q"}', b'{"a": "\xc0\x80"}'):
        assert BUILT.scan(raw, (b"a",)) is None, raw


def test_nested_paths_and_msgpack_stay_on_the_python_path() -> None:
    ix = Indexer([IndexDefinition("c", "a.b")], {"c": 1}, "json", 511)
    assert not ix.accelerated
    ix = Indexer([IndexDefinition("c", "city")], {"c": 1}, "msgpack", 511)
    assert not ix.accelerated


@pytest.mark.parametrize("word", ["0", "off", "No", "FALSE", " false "])
def test_off_switch(word: str, py_env: dict, python: str) -> None:
    env = dict(py_env, FERRY_INDEX_ACCEL=word)
    out = subprocess.run([python, "-c", "from indexes import accel; print(accel.name())"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == "None"


@needs_accel
def test_on_by_default_and_abi_checked(py_env: dict, python: str, monkeypatch) -> None:
    env = {k: v for k, v in py_env.items() if k != accel.ACCEL_ENV}
    out = subprocess.run([python, "-c", "from indexes import accel; print(accel.name())"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == "c"
    fake = ModuleType("indexes._ixaccel")
    fake.ABI_VERSION = 999  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "indexes._ixaccel", fake)
    monkeypatch.delenv(accel.ACCEL_ENV, raising=False)
    assert accel.load() is None
    assert os.environ.get(accel.ACCEL_ENV) is None


@needs_accel
def test_plain_documents_never_reach_the_python_path(monkeypatch) -> None:
    """The common values are done in C (else the tests above compare Python with itself)."""
    defs = [IndexDefinition("c", "city"), IndexDefinition("n", "n", type="number"),
            IndexDefinition("b", "b"), IndexDefinition("z", "z", type="int")]
    docs = [b'{"city": "Oslo", "n": 1.5, "b": true, "z": -12, "pad": "' + b"x" * 1000 + b'"}',
            b' {"z":0,"n":-3,"b":null,"city":"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80","d":[{}]}\n',
            b'{"city": "", "n": 1e-7, "b": false, "z": 123456789012345678, "s": "\\n\\u00e9"}']
    items = [(b"k%d" % i, d) for i, d in enumerate(docs)]
    want = run(defs, items, None)
    monkeypatch.setattr(Indexer, "feed", lambda *a: pytest.fail(f"fallback for {a[2]!r}"))
    got = run(defs, items, BUILT)
    assert got[:3] == want[:3] and len(got[1]) == 12


def test_more_than_64_definitions_stay_on_the_python_path() -> None:
    defs = [IndexDefinition(f"i{j}", "city") for j in range(65)]
    assert not Indexer(defs, {d.name: i + 1 for i, d in enumerate(defs)}, "json", 511).accelerated


@needs_accel
def test_columns_records_outside_their_buffers_are_refused() -> None:
    """A record that points past its buffer is an error, never a read past it."""
    specs = ((b"city", b"\x00\x01", 0),)
    good = columns([(b"k", b'{"city": "Oslo"}')])
    keys: list[bytes] = []
    assert BUILT is not None
    assert BUILT.feed_columns(good.data, good.spill, good.cols, specs, 511, keys.append,
                              lambda item: None) == 1
    assert keys == [b"\x00\x01" + b"\x30Oslo\x00\x01" + b"k"]
    for rec in ([0, 1 << 40, 3, 2], [3, 1, len(good.data), 1], [3, 1, ~5, 1], [-1, 1, 3, 1]):
        with pytest.raises(ValueError):
            BUILT.feed_columns(good.data, good.spill, array("q", rec).tobytes(), specs, 511,
                               keys.append, lambda item: None)
