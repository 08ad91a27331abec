"""The Replication tables of node/context.py: each operation runs under the table's
own lock, and concurrent users (the supplier's threads, the watch thread, the
reconcile loop) never lose a change."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from node.context import Admissions, Copies, Fences, Handoffs, LastApplied, SnapshotUse

KEY = ("default", 3)


def _copies() -> Copies:
    t = Copies()
    t.add(KEY, "n2", "a2")
    return t


def _fences() -> Fences:
    t = Fences()
    t.set(KEY, 5.0)
    return t


def _use() -> SnapshotUse:
    t = SnapshotUse()
    t.opened(KEY)
    return t


def _admissions() -> Admissions:
    t = Admissions()
    t.begin(KEY, "n2")
    return t


OPS: list[tuple[str, Callable[[], Any], Callable[[Any], object]]] = [
    ("copies.add", Copies, lambda t: t.add(KEY, "n3", "a3")),
    ("copies.of", _copies, lambda t: t.of(KEY)),
    ("copies.has", _copies, lambda t: t.has(KEY, "n2")),
    ("copies.discard", _copies, lambda t: t.discard(KEY, "n2")),
    ("copies.drop", _copies, lambda t: t.drop(KEY)),
    ("copies.keep_members", _copies, lambda t: t.keep_members({"n1"})),
    ("copies.any", _copies, lambda t: t.any()),
    ("fenced.set", Fences, lambda t: t.set(KEY, 1.0)),
    ("fenced.until", _fences, lambda t: t.until(KEY)),
    ("fenced.lift", _fences, lambda t: t.lift(KEY)),
    ("fenced.in", _fences, lambda t: KEY in t),
    ("in_use.opened", SnapshotUse, lambda t: t.opened(KEY)),
    ("in_use.closed", _use, lambda t: t.closed(KEY)),
    ("in_use.count", _use, lambda t: t.count(KEY)),
    ("in_use.any", _use, lambda t: t.any()),
    ("last_applied.touch", LastApplied, lambda t: t.touch(KEY, 1.0)),
    ("last_applied.items", LastApplied, lambda t: t.items()),
    ("handoffs.begin", Handoffs, lambda t: t.begin(KEY)),
    ("handoffs.end", Handoffs, lambda t: t.end(KEY)),
    ("handoffs.in", Handoffs, lambda t: KEY in t),
    ("admissions.begin", Admissions, lambda t: t.begin(KEY, "n2")),
    ("admissions.admitting", _admissions, lambda t: t.admitting(KEY)),
    ("admissions.spoil", _admissions, lambda t: t.spoil(KEY)),
    ("admissions.take_spoiled", _admissions, lambda t: t.take_spoiled(KEY)),
    ("admissions.end", _admissions, lambda t: t.end(KEY)),
    ("admissions.snapshot", _admissions, lambda t: t.snapshot()),
]


@pytest.mark.parametrize("name,make,op", OPS, ids=[o[0] for o in OPS])
def test_each_operation_takes_the_tables_lock(name: str, make: Callable[[], Any],
                                              op: Callable[[Any], object]) -> None:
    table = make()
    lock = table._lock
    done = threading.Event()

    def run() -> None:
        op(table)
        done.set()
    with lock:
        t = threading.Thread(target=run, daemon=True)
        t.start()
        assert not done.wait(0.05), f"{name} ran without the table's lock"
    assert done.wait(5.0)
    t.join()


def test_tables_do_what_they_say() -> None:
    c = Copies()
    c.add(KEY, "n2", "a2")
    c.add(KEY, "n3", "a3")
    assert c.of(KEY) == {"n2": "a2", "n3": "a3"} and c.has(KEY, "n3") and c.any()
    c.of(KEY).clear()                                # a copy: the table keeps its own
    c.keep_members({"n2"})
    assert c.of(KEY) == {"n2": "a2"}
    c.discard(KEY, "n2")
    assert not c.any() and c.of(KEY) == {}
    c.add(KEY, "n2", "a2")
    c.drop(KEY)
    assert not c.has(KEY, "n2")

    f = Fences()
    f.set(KEY, 10.0)
    assert KEY in f and f.until(KEY) == 10.0
    assert not f.lift(KEY, 11.0) and KEY in f      # another fence's deadline: kept
    assert f.lift(KEY, 10.0) and KEY not in f and not f.lift(KEY)

    h = Handoffs()
    assert h.begin(KEY) and not h.begin(KEY) and KEY in h
    h.end(KEY)
    assert KEY not in h

    a = Admissions()
    assert a.begin(KEY, "n2") is None and a.begin(KEY, "n3") == "n2"
    a.spoil(KEY)
    assert a.snapshot() == ({KEY: "n2"}, {KEY})
    assert a.take_spoiled(KEY) and not a.take_spoiled(KEY)
    a.end(KEY)
    assert a.snapshot() == ({}, set()) and a.admitting(KEY) is None
    a.spoil(KEY)                                     # no admission: nothing to spoil
    assert a.snapshot() == ({}, set())


def test_snapshot_use_counted_by_many_threads() -> None:
    """The supplier's session threads open and close snapshots of one partition at
    once; an eviction reads the count meanwhile and at the end finds 0."""
    use = SnapshotUse()
    start = threading.Barrier(8)
    seen: list[int] = []

    def session() -> None:
        start.wait()
        for _ in range(2000):
            use.opened(KEY)
            seen.append(use.count(KEY))
            use.closed(KEY)
    threads = [threading.Thread(target=session) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert use.count(KEY) == 0 and not use.any()
    assert min(seen) >= 1                            # open while its own session holds it


def test_copies_changed_while_others_read() -> None:
    """Registrations (primary, under p's lock), departures (the reconcile loop) and
    the watch thread's drop run at once with readers: no reader meets a table in
    the middle of a change and no registration of a member is lost."""
    c = Copies()
    stop = threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                c.any()
                for k in range(8):
                    c.of(("default", k))
                c.keep_members({f"n{i}" for i in range(50)})
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            errors.append(e)
    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in readers:
        t.start()
    for i in range(50):
        for k in range(8):
            c.add(("default", k), f"n{i}", f"a{i}")
            c.add(("default", k), f"gone{i}", "x")
    stop.set()
    for t in readers:
        t.join()
    assert not errors
    c.keep_members({f"n{i}" for i in range(50)})
    assert all(c.of(("default", k)) == {f"n{i}": f"a{i}" for i in range(50)} for k in range(8))


# -- MoveTable: the moves in progress -------------------------------------------------

def test_move_table_starts_one_move_per_partition_within_the_admitted_count() -> None:
    from node.context import MoveTable
    from node.move.progress import Move
    t = MoveTable()
    seen: list[int] = []

    def admit(n: int) -> bool:
        assert t.lock.locked()          # decided under the table's lock
        seen.append(n)
        return n < 2

    a = t.start(("c", 1), admit, lambda: Move("c", 1, mode="files"))
    assert a is not None and t.get(("c", 1)) is a and ("c", 1) in t and len(t) == 1
    assert t.start(("c", 1), admit, lambda: Move("c", 1, mode="files")) is None   # already moving
    assert t.start(("c", 2), admit, lambda: Move("c", 2, mode="files")) is not None
    assert t.start(("c", 3), admit, lambda: Move("c", 3, mode="files")) is None   # not admitted
    assert seen == [0, 1, 2]
    assert {k for k, _ in t.items()} == {("c", 1), ("c", 2)} and len(t.moves()) == 2
    t.end(("c", 1))
    t.end(("c", 1))                      # ending twice is harmless
    assert ("c", 1) not in t and len(t) == 1 and bool(t)


def test_move_table_concurrent_starts_never_pass_the_limit() -> None:
    from node.context import MoveTable
    from node.move.progress import Move
    t = MoveTable()
    barrier = threading.Barrier(8)
    started: list[int] = []

    def worker(i: int) -> None:
        barrier.wait()
        for p in range(i * 100, i * 100 + 100):
            if t.start(("c", p), lambda n: n < 5, lambda p=p: Move("c", p, mode="files")) is not None:
                started.append(p)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(started) == 5 and len(t) == 5
