"""Bad input: bad documents by policy, long keys, corrupt or truncated LMDB files."""
from __future__ import annotations

import os

import pytest

from indexes import (BadQueryError, BadValueError, IndexCorruptError, IndexDefinition,
                     IndexDefinitionError, IndexStore, MemorySource)

from idx_helpers import doc

# (case, stored value, indexed?) for an index on "age" declared type=int
CASES = [
    ("not JSON", b"{not json", False),
    ("not UTF-8", b"\xff\xfe\x00", False),
    ("empty value", b"", False),
    ("NaN is not JSON", b'{"age": NaN}', False),
    ("a JSON array, not an object", b"[1, 2]", False),
    ("field missing", b'{"other": 1}', False),
    ("field null", b'{"age": null}', False),
    ("wrong type (string)", b'{"age": "old"}', False),
    ("wrong type (bool)", b'{"age": true}', False),
    ("wrong type (list)", b'{"age": [1]}', False),
    ("int beyond 64 bits", b'{"age": 123456789012345678901234567890}', False),
    ("deeply nested", b"[" * 100_000 + b"]" * 100_000, False),
    ("good", b'{"age": 7}', True),
]


@pytest.fixture
def stores(tmp_path):
    opened = {}
    for policy in ("skip", "refuse"):
        s = IndexStore.open(str(tmp_path / policy),
                            [IndexDefinition("age", "age", type="int", on_bad=policy),
                             IndexDefinition("any", "age")])
        s.rebuild(0, MemorySource())
        opened[policy] = s
    yield opened
    for s in opened.values():
        s.close()


@pytest.mark.parametrize("case,raw,indexed", CASES, ids=[c[0] for c in CASES])
def test_bad_documents_follow_the_index_policy(stores, case, raw, indexed) -> None:
    skip, refuse = stores["skip"], stores["refuse"]
    skip.apply(0, b"k", None, raw)                           # never raises
    assert (skip.lookup("age", 7) == [b"k"]) == indexed
    if indexed:
        refuse.apply(0, b"k", None, raw)
        assert refuse.lookup("age", 7) == [b"k"]
        return
    refuse.apply(0, b"k", None, doc(age=3))
    with pytest.raises(BadValueError) as err:
        refuse.apply(0, b"k", doc(age=3), raw)
    assert "'age'" in str(err.value) and "b'k'" in str(err.value)
    assert refuse.lookup("age", 3) == [b"k"]                 # nothing changed
    # The same value in the data never fails a rebuild: skipped and counted.
    for s in (skip, refuse):
        src = MemorySource({1: {b"k": raw, b"ok": doc(age=1)}})
        res = s.rebuild(1, src)
        assert res.bad >= 1 and res.bad_samples and s.lookup("age", 1) == [b"ok"]
        assert s.verify(1, src).ok


def test_long_values_and_primary_keys_are_hashed_not_refused(tmp_path) -> None:
    with IndexStore.open(str(tmp_path), [IndexDefinition("name", "name")]) as s:
        s.rebuild(0, MemorySource())
        long_name, long_pk = "n" * 3000, b"p" * 2000
        s.apply(0, long_pk, None, doc(name="short"))
        s.apply(0, b"k2", None, doc(name=long_name))
        s.apply(0, b"k3", None, doc(name=long_name + "!"))
        assert s.lookup("name", "short") == [long_pk]
        assert s.lookup("name", long_name) == [b"k2"]
        assert dict((k, v) for v, k in s.range("name"))[b"k3"] == long_name + "!"
        s.apply(0, b"k2", doc(name=long_name), None)
        assert s.lookup("name", long_name) == []
        src = MemorySource({0: {long_pk: doc(name="short"), b"k3": doc(name=long_name + "!")}})
        assert s.verify(0, src).ok


def test_bad_queries_and_definitions_are_clear_errors(tmp_path) -> None:
    with pytest.raises(IndexDefinitionError):
        IndexDefinition("bad name!", "a")
    with pytest.raises(IndexDefinitionError):
        IndexDefinition("a", "")
    with pytest.raises(IndexDefinitionError):
        IndexDefinition("a", "a", on_bad="explode")
    with pytest.raises(IndexDefinitionError):
        IndexDefinition.parse("a=b:sometimes")
    assert IndexDefinition.parse("e=user.email:unique:refuse:type=str") == IndexDefinition(
        "e", "user.email", unique=True, on_bad="refuse", type="str")
    with pytest.raises(IndexDefinitionError):
        IndexStore.open(str(tmp_path), [IndexDefinition("a", "a"), IndexDefinition("a", "b")])
    with IndexStore.open(str(tmp_path), [IndexDefinition("a", "a")]) as s:
        with pytest.raises(IndexDefinitionError, match="no index named"):
            s.lookup("nope", 1)
        with pytest.raises(BadQueryError):
            s.lookup("a", [1, 2])


def _garbage(path: str) -> None:
    with open(path, "r+b") as f:
        f.write(os.urandom(os.path.getsize(path)))


def _cut_meta(path: str) -> None:
    os.truncate(path, 5000)


def _cut_half(path: str) -> None:
    os.truncate(path, os.path.getsize(path) // 2)


def _zero_metas(path: str) -> None:
    with open(path, "r+b") as f:
        f.write(bytes(8192))


@pytest.mark.parametrize("corrupt", [_garbage, _cut_meta, _cut_half, _zero_metas])
def test_corrupt_or_truncated_lmdb_is_a_clear_error_and_rebuildable(tmp_path, corrupt) -> None:
    defs = [IndexDefinition("age", "age")]
    src = MemorySource({p: {b"k%d" % i: doc(age=i) for i in range(3000)} for p in (0, 1)})
    path = str(tmp_path / "idx")
    with IndexStore.open(path, defs) as s:
        for p in (0, 1):
            s.rebuild(p, src)
    corrupt(os.path.join(path, "data.mdb"))
    with pytest.raises(IndexCorruptError) as err:
        IndexStore.open(path, defs)
    assert "data.mdb" in str(err.value) and "reset_corrupt" in str(err.value)
    with IndexStore.open(path, defs, reset_corrupt=True) as s:
        assert not s.ready(0) and not s.ready(1)
        assert any(n.startswith("data.mdb.corrupt-") for n in os.listdir(path))
        s.rebuild(0, src)
        assert s.ready(0) and s.verify(0, src).ok and s.lookup("age", 5) == [b"k5"]


def test_msgpack_documents_and_check_before_write(tmp_path) -> None:
    import msgpack
    defs = [IndexDefinition("n", "n", type="int", on_bad="refuse"), IndexDefinition("b", "blob")]
    with IndexStore.open(str(tmp_path), defs, codec="msgpack") as s:
        s.rebuild(0, MemorySource())
        v = msgpack.packb({"n": 5, "blob": b"\x00\x01"})
        s.check(b"k", v)
        s.apply(0, b"k", None, v)
        assert s.lookup("n", 5) == [b"k"] and s.lookup("b", b"\x00\x01") == [b"k"]
        with pytest.raises(BadValueError, match="msgpack"):
            s.check(b"k2", b"\xc1")                       # 0xc1 is never valid msgpack
        with pytest.raises(BadValueError):
            s.check(b"k2", b'{"n": 5}')                  # JSON is not this store's codec
    with IndexStore.open(str(tmp_path)) as s:             # codec and definitions are stored
        assert s.schema.codec == "msgpack" and s.ready(0)
