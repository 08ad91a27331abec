"""Model-based test of apply / lookup / range / rebuild / drop against a dict model."""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from indexes import (IndexDefinition, IndexStore, MemorySource, UniqueViolationError)

from idx_helpers import doc, rank

DEFS = [
    IndexDefinition("age", "age", type="number"),
    IndexDefinition("tag", "meta.tag"),
    IndexDefinition("email", "email", unique=True, type="str"),
]
PARTS = [0, 1, 2]
SHM = "/dev/shm" if os.path.isdir("/dev/shm") else None
keys = st.binary(min_size=0, max_size=3)
tags = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(-3, 3, allow_nan=False),
                 st.sampled_from(["", "a", "b", "a\x00", "é"]), st.just(2.0))
ages = st.one_of(st.integers(0, 5), st.sampled_from([1.5, 2.0, "old"]))
emails = st.sampled_from(["a@x", "b@x", "c@x", "d@x"])


@st.composite
def documents(draw: st.DrawFn) -> dict:
    d: dict = {}
    if draw(st.booleans()):
        d["age"] = draw(ages)
    if draw(st.booleans()):
        d["meta"] = {"tag": draw(tags)}
    if draw(st.booleans()):
        d["email"] = draw(emails)
    return d


def field(d: dict, name: str) -> tuple[bool, object]:
    if name == "age":
        v = d.get("age", KeyError)
        ok = v is not KeyError and type(v) in (int, float)
        return ok, v
    if name == "tag":
        m = d.get("meta")
        return (m is not None and "tag" in m), (m or {}).get("tag")
    v = d.get("email", KeyError)
    return (type(v) is str), v


class IndexMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # tmpfs when there is one: the model checks logic, not fsync latency.
        self.dir = tempfile.mkdtemp(prefix="idx-model-", dir=SHM)
        self.store = IndexStore.open(self.dir, DEFS)
        self.model: dict[int, dict[bytes, dict]] = {p: {} for p in PARTS}
        for p in PARTS:
            self.store.rebuild(p, MemorySource())

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def holder(self, email: object, key: bytes) -> bool:
        return any(k != key and field(d, "email") == (True, email)
                   for p in PARTS for k, d in self.model[p].items())

    @rule(p=st.sampled_from(PARTS), k=keys, d=documents())
    def put(self, p: int, k: bytes, d: dict) -> None:
        old = self.model[p].get(k)
        ok, email = field(d, "email")
        if ok and self.holder(email, k) and field(old or {}, "email") != (True, email):
            with pytest.raises(UniqueViolationError):
                self.store.apply(p, k, doc(**old) if old else None, doc(**d))
            return
        self.store.apply(p, k, doc(**old) if old is not None else None, doc(**d))
        self.model[p][k] = d

    @precondition(lambda self: any(self.model.values()))
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        p = data.draw(st.sampled_from([p for p in PARTS if self.model[p]]))
        k = data.draw(st.sampled_from(sorted(self.model[p])))
        self.store.apply(p, k, doc(**self.model[p].pop(k)), None)

    @rule(p=st.sampled_from(PARTS))
    def rebuild(self, p: int) -> None:
        src = MemorySource({p: {k: doc(**d) for k, d in self.model[p].items()}})
        self.store.rebuild(p, src, memory_limit=2000)      # tiny: forces spilled runs
        assert self.store.verify(p, src).ok

    @rule(p=st.sampled_from(PARTS))
    def drop_then_rebuild(self, p: int) -> None:
        self.store.drop(p)
        assert not self.store.ready(p)
        assert all(pk not in self.model[p] or True for pk in self.store.lookup("age", 1))
        self.rebuild(p)

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = IndexStore.open(self.dir, DEFS)
        assert all(self.store.ready(p) for p in PARTS)

    def expected(self, name: str) -> list[tuple[object, bytes]]:
        rows = [(v, k) for p in PARTS for k, d in self.model[p].items()
                for ok, v in [field(d, name)] if ok]
        return sorted(rows, key=lambda r: (rank(r[0]), r[1]))

    @invariant()
    def lookups_and_ranges_match_the_model(self) -> None:
        for name in ("age", "tag", "email"):
            want = self.expected(name)
            got = self.store.range(name)
            assert [(rank(v), k) for v, k in got] == [(rank(v), k) for v, k in want]
            assert self.store.range(name, limit=2) == got[:2]
            for v in {rank(v): v for v, _ in want}.values():
                assert self.store.lookup(name, v) == sorted(k for w, k in want if rank(w) == rank(v))
        want = self.expected("age")
        got = self.store.range("age", 1, 3)
        assert [k for _, k in got] == [k for v, k in want if 1 <= v < 3]


IndexMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=20, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_index_model = IndexMachine.TestCase


def test_apply_many_is_one_all_or_nothing_commit(tmp_path) -> None:
    with IndexStore.open(str(tmp_path), DEFS) as s:
        s.rebuild(0, MemorySource())
        s.apply_many(0, [(b"a", None, doc(age=1, email="a@x")),
                         (b"b", None, doc(age=1, email="b@x")),
                         (b"a", doc(age=1, email="a@x"), doc(age=2, email="a@x"))])
        assert s.lookup("age", 1) == [b"b"] and s.lookup("age", 2) == [b"a"]
        with pytest.raises(UniqueViolationError):
            s.apply_many(0, [(b"c", None, doc(age=5, email="c@x")),
                             (b"d", None, doc(age=5, email="c@x"))])     # clashes with c
        assert s.lookup("age", 5) == [] and s.lookup("email", "c@x") == []
        # Moving a unique value from one key to another inside one batch is fine.
        s.apply_many(0, [(b"a", doc(age=2, email="a@x"), None),
                         (b"e", None, doc(email="a@x"))])
        assert s.lookup("email", "a@x") == [b"e"]
