"""Compare a partition's index entries with its data.

Both sides are streams in key order: the entries the data gives (the rebuild's scan
and external sort, so the same code decides what "expected" means) and the
partition's entries in LMDB, read in chunks (the store's lock is held per chunk,
not for the whole pass). A merge-join yields entries missing from the index and entries the index has
in excess; a missing and an extra entry of the same (index, primary key) are one
entry pointing to the wrong value.
"""
from __future__ import annotations

import itertools
import os
import shutil
from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol

import lmdb

from . import keycodec
from .extsort import DEFAULT_MEMORY, ExternalSorter
from .lmdbenv import LmdbEnv
from .results import RebuildResult, Reporter
from .scan import SCRATCH, Indexed, scan_partition
from .source import Source

# Entries read per LMDB read transaction (the store's lock is held for one chunk).
_CHUNK = 10_000


class Verifiable(Indexed, Protocol):
    """What verify needs of an index store (:class:`~indexes.IndexStore` is one)."""

    @property
    def env(self) -> LmdbEnv: ...

    def ready(self, partition: int) -> bool: ...


def show(b: bytes) -> str:
    """A primary key for people and JSON: its text when it is printable UTF-8."""
    try:
        s = b.decode("utf-8")
        if s.isprintable():
            return s
    except UnicodeDecodeError:
        pass
    return "hex:" + b.hex()


def _plain(v: object) -> object:
    return show(v) if isinstance(v, bytes) else v


@dataclass(frozen=True)
class EntryRef:
    index: str
    value: object
    key: bytes

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "value": _plain(self.value), "key": show(self.key)}


@dataclass(frozen=True)
class WrongEntry:
    index: str
    key: bytes
    indexed: object          # the value the index maps the key from
    expected: object         # the value the data holds

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "key": show(self.key),
                "indexed": _plain(self.indexed), "expected": _plain(self.expected)}


@dataclass
class VerifyReport:
    partition: int
    ready: bool
    expected: int = 0                # entries the data gives
    indexed: int = 0                 # entries the index holds
    missing: list[EntryRef] = field(default_factory=list)
    extra: list[EntryRef] = field(default_factory=list)
    wrong: list[WrongEntry] = field(default_factory=list)
    missing_count: int = 0
    extra_count: int = 0
    wrong_count: int = 0
    bad: int = 0                     # values the data holds that an index skips by policy
    truncated: bool = False          # more mismatches than max_details: lists are a prefix

    @property
    def ok(self) -> bool:
        return self.ready and not (self.missing_count or self.extra_count or self.wrong_count)

    def to_dict(self) -> dict[str, Any]:
        return {"partition": self.partition, "ok": self.ok, "ready": self.ready,
                "expected": self.expected, "indexed": self.indexed,
                "missing_count": self.missing_count, "extra_count": self.extra_count,
                "wrong_count": self.wrong_count, "bad": self.bad, "truncated": self.truncated,
                "missing": [e.to_dict() for e in self.missing],
                "extra": [e.to_dict() for e in self.extra],
                "wrong": [w.to_dict() for w in self.wrong]}


def stored(store: Verifiable, partition: int) -> Iterator[tuple[bytes, bytes]]:
    """Every stored (entry key, data) of the partition, in key order, read in chunks."""
    env = store.env
    after: bytes | None = None
    while True:
        def chunk(txn: lmdb.Transaction[bytes]) -> list[tuple[bytes, bytes]]:
            items = env.entries.items(txn, partition, after or b"", after=after is not None)  # noqa: B023 - called at once, in this iteration
            return list(itertools.islice(items, _CHUNK))
        got = env.read(chunk)
        if not got:
            return
        yield from got
        after = got[-1][0]


def verify(store: Verifiable, partition: int, source: Source, *,
           memory_limit: int | None = None, max_details: int = 10_000) -> VerifyReport:
    rep = VerifyReport(partition, store.ready(partition))
    names = {i: n for n, i in store.schema.ids.items()}
    scratch = os.path.join(store.env.path, SCRATCH, f"verify-{partition}")
    shutil.rmtree(scratch, ignore_errors=True)
    sorter = ExternalSorter(scratch, memory_limit or DEFAULT_MEMORY)
    scan_res = RebuildResult(partition)
    missing: list[tuple[bytes, bytes]] = []
    extra: list[tuple[bytes, bytes]] = []
    changed: list[tuple[tuple[bytes, bytes], tuple[bytes, bytes]]] = []
    try:
        scan_partition(store, partition, source, sorter, scan_res, Reporter(partition, None),
                       lambda: False)
        rep.bad = scan_res.bad
        exp, act = sorter.sorted(), stored(store, partition)
        e, a = next(exp, None), next(act, None)
        last_e = None
        while e is not None or a is not None:
            if e is not None and e[0] == last_e:       # the source gave a value twice
                e = next(exp, None)
                continue
            if a is None or (e is not None and e[0] < a[0]):
                assert e is not None                   # the loop runs while e or a is left
                rep.expected += 1
                _keep(missing, e, max_details, rep, "missing_count")
                last_e, e = e[0], next(exp, None)
            elif e is None or a[0] < e[0]:
                rep.indexed += 1
                _keep(extra, a, max_details, rep, "extra_count")
                a = next(act, None)
            else:
                rep.expected += 1
                rep.indexed += 1
                if e[1] != a[1]:                        # same hashed key, other contents
                    changed.append((a, e))
                last_e, e, a = e[0], next(exp, None), next(act, None)
    finally:
        sorter.close()
        shutil.rmtree(scratch, ignore_errors=True)
    _classify(rep, names, missing, extra, changed)
    return rep


def _keep(bucket: list[tuple[bytes, bytes]], item: tuple[bytes, bytes], cap: int,
          rep: VerifyReport, kind: str) -> None:
    # Exact counts always; details (and so wrong-pairing) for the first ``cap`` only.
    setattr(rep, kind, getattr(rep, kind) + 1)
    if len(bucket) < cap:
        bucket.append(item)
    else:
        rep.truncated = True


def _classify(rep: VerifyReport, names: dict[int, str], missing: list[tuple[bytes, bytes]],
              extra: list[tuple[bytes, bytes]],
              changed: list[tuple[tuple[bytes, bytes], tuple[bytes, bytes]]]) -> None:
    def ref(item: tuple[bytes, bytes]) -> EntryRef:
        iid, v, pk = keycodec.parse_entry(*item)
        return EntryRef(names.get(iid, f"#{iid}"), v, pk)

    miss = [ref(m) for m in missing]
    by_key: dict[tuple[str, bytes], list[EntryRef]] = {}
    for m in miss:
        by_key.setdefault((m.index, m.key), []).append(m)
    extras: list[EntryRef] = []
    for x in (ref(x) for x in extra):
        pair = by_key.get((x.index, x.key))
        if pair:
            want = pair.pop()
            rep.wrong.append(WrongEntry(x.index, x.key, x.value, want.value))
        else:
            extras.append(x)
    for a, e in changed:
        ra, re_ = ref(a), ref(e)
        rep.wrong.append(WrongEntry(ra.index, ra.key, ra.value, re_.value))
    rep.missing = [m for ms in by_key.values() for m in ms]
    rep.extra = extras
    paired = len(rep.wrong) - len(changed)
    rep.wrong_count = len(rep.wrong)
    rep.missing_count -= paired
    rep.extra_count -= paired
