"""The linearizability checker (cluster_sim/linearizable.py) on hand-made histories --
linearizable ones and the three patterns an independent test found (a stale read from a
deposed primary, a read of a write that was never acknowledged and later lost, a write
applied twice) -- and property tests: a sequential history with random overlaps is
linearizable; on small histories the checker agrees with brute force over every order."""
from __future__ import annotations

import itertools
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_sim.history import FAIL, INFO, OK, READ, WRITE, History, Operation, status_of
from cluster_sim.linearizable import check, describe, linearizable, minimal, prepare


def w(p: str, value: str | None, call: float, ret: float | None, status: str = OK, key: bytes = b"k") -> Operation:
    return Operation(p, WRITE, key, None if value is None else value.encode(), call, ret, status)


def r(p: str, value: str | None, call: float, ret: float, key: bytes = b"k") -> Operation:
    return Operation(p, READ, key, None if value is None else value.encode(), call, ret, OK)


def ok(ops: list[Operation]) -> bool:
    return check(ops).ok


# -- linearizable -------------------------------------------------------------------------------
def test_sequential_and_overlapping_histories_are_linearizable() -> None:
    assert ok([])
    assert ok([r("a", None, 0, 1)])                                # absent at first
    assert ok([w("a", "1", 0, 1), r("b", "1", 2, 3), w("a", "2", 4, 5), r("b", "2", 6, 7)])
    # a read overlapping a write may see either value
    assert ok([w("a", "1", 0, 1), w("a", "2", 2, 5), r("b", "1", 3, 4), r("c", "2", 3, 6)])
    # two overlapping reads may see old then new, new then old only if they overlap the write
    assert ok([w("a", "1", 0, 1), w("a", "2", 2, 10), r("b", "2", 3, 4), r("c", "1", 2.5, 5)])
    assert ok([w("a", None, 0, 1), r("b", None, 2, 3)])           # a remove


def test_unknown_and_failed_writes() -> None:
    # an unknown write may take effect late (after other operations) ...
    assert ok([w("a", "1", 0, 1), w("a", "2", 2, None, INFO), r("b", "1", 3, 4), r("b", "2", 5, 6)])
    # ... or never
    assert ok([w("a", "1", 0, 1), w("a", "2", 2, None, INFO), r("b", "1", 30, 31)])
    # a failed write never took effect: reading it is a violation
    assert not ok([w("a", "1", 0, 1), w("a", "2", 2, 3, FAIL), r("b", "2", 4, 5)])
    # a read that did not return observed nothing
    assert ok([w("a", "1", 0, 1), Operation("b", READ, b"k", b"zzz", 2, None, INFO)])


def test_keys_are_checked_separately() -> None:
    res = check([w("a", "1", 0, 1, key=b"x"), w("a", "2", 0, 1, key=b"y"), r("b", "1", 2, 3, key=b"x"),
                 r("b", "1", 2, 3, key=b"y")])
    assert not res.ok and [f.key for f in res.failures] == [b"y"] and res.keys == 2


# -- the three patterns ----------------------------------------------------------------------------
def test_a_stale_read_from_a_deposed_primary() -> None:
    """The new primary acknowledged 2; a read through the cut-off old primary, after
    that, still returns 1."""
    h = [w("w0", "1", 0, 1), w("w0", "2", 5, 6), r("r0", "1", 7, 8)]
    res = check(h)
    assert not res.ok
    assert [o.value for o in res.failures[0].minimal] == [b"1", b"2", b"1"]


def test_a_read_of_a_write_that_was_never_acknowledged_and_then_lost() -> None:
    """1 acknowledged; 2 applied by the primary, replication failed (unknown); a reader
    of that primary saw 2; after the failover the register is 1 again."""
    h = [w("w0", "1", 0, 1), w("w0", "2", 2, None, INFO), r("r0", "2", 3, 4), r("r1", "1", 10, 11)]
    assert not ok(h)
    # the same without the reader of the old primary is fine: 2 just never happened
    assert ok([h[0], h[1], h[3]])


def test_a_write_applied_twice() -> None:
    """The client's put of 1 failed after the primary applied it, and the retry
    applied it again after another client's 2."""
    h = [w("a", "1", 0, 10), w("b", "2", 3, 4), r("c", "1", 1, 2), r("c", "2", 5, 6), r("c", "1", 7, 8)]
    res = check(h)
    assert not res.ok
    lines = describe(res.failures[0])
    assert "not linearizable" in lines[0] and len(lines) == 1 + len(res.failures[0].minimal)


def test_minimal_drops_what_does_not_matter() -> None:
    noise = [r(f"n{i}", "1", 0.1 * i + 0.05, 0.1 * i + 0.08) for i in range(1, 8)]
    h = [w("w0", "1", 0, 0.01), *noise, w("w0", "2", 5, 6), r("r0", "1", 7, 8),
         w("w0", "3", 9, 10), r("r0", "3", 11, 12)]
    m = minimal(h)
    assert [(o.kind, o.value) for o in m] == [(WRITE, b"1"), (WRITE, b"2"), (READ, b"1")]
    assert not check(m).ok


def test_status_of_follows_the_outcome() -> None:
    class E(Exception):
        outcome = "refused"

    class U(Exception):
        outcome = "unknown"
    assert status_of(WRITE, E()) == FAIL and status_of(WRITE, U()) == INFO
    assert status_of(WRITE, TimeoutError()) == INFO and status_of(READ, U()) == FAIL
    h = History()
    a = h.invoke("w0", WRITE, b"k", b"1")
    b = h.invoke("r0", READ, b"k")
    h.ok(a)
    h.ok(b, b"1")
    c = h.invoke("w0", WRITE, b"k", b"2")
    h.failed(c, U())
    d = h.invoke("w0", WRITE, b"k", b"3")           # still running at the snapshot
    ops = h.snapshot()
    assert [o.status for o in ops] == [OK, OK, INFO, INFO] and ops[1].value == b"1"
    assert ops[2].ret is None and d == 3
    assert check(ops).ok


# -- properties -------------------------------------------------------------------------------
@st.composite
def sequential_with_overlaps(draw: st.DrawFn) -> list[Operation]:
    """Operations applied one at a time (each at its own instant, with the value a
    register would give), then each interval widened at random around its instant,
    some writes left with an unknown outcome and some failed writes added."""
    n = draw(st.integers(1, 14))
    state: bytes | None = None
    ops = []
    for i in range(n):
        t = float(i)
        before = draw(st.floats(0, 3))
        after = draw(st.floats(0, 3))
        if draw(st.booleans()):
            v = None if draw(st.integers(0, 5)) == 0 else b"v%d" % i
            state = v
            unknown = draw(st.integers(0, 4)) == 0
            ops.append(Operation(f"p{i % 3}", WRITE, b"k", v, t - before, None if unknown else t + after,
                                 INFO if unknown else OK))
        else:
            ops.append(Operation(f"p{i % 3}", READ, b"k", state, t - before, t + after, OK))
        if draw(st.integers(0, 6)) == 0:            # a refused write: never took effect
            ops.append(Operation("f", WRITE, b"k", b"never%d" % i, t - before, t + after, FAIL))
    return ops


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequential_with_overlaps())
def test_a_sequential_history_with_random_overlaps_is_linearizable(ops: list[Operation]) -> None:
    assert check(ops).ok


@settings(max_examples=200, deadline=None)
@given(sequential_with_overlaps(), st.data())
def test_a_read_of_a_value_never_written_is_not(ops: list[Operation], data: st.DataObject) -> None:
    reads = [i for i, o in enumerate(ops) if o.kind == READ]
    if not reads:
        return
    i = data.draw(st.sampled_from(reads))
    bad = list(ops)
    bad[i] = Operation(ops[i].process, READ, b"k", b"never-written", ops[i].call, ops[i].ret, OK)
    res = check(bad)
    assert not res.ok and any(o.value == b"never-written" for o in res.failures[0].minimal)


def brute_force(ops: list[Operation]) -> bool:
    """Every order of the (prepared) operations that respects real time; an unknown
    write may also be left out."""
    ops = prepare(ops)
    unknown = [i for i, o in enumerate(ops) if o.status == INFO]
    for drop in itertools.chain.from_iterable(itertools.combinations(unknown, k) for k in range(len(unknown) + 1)):
        keep = [o for i, o in enumerate(ops) if i not in drop]
        for order in itertools.permutations(keep):
            if any(order[j].ret is not None and order[j].ret < order[i].call
                   for i in range(len(order)) for j in range(i + 1, len(order))):
                continue
            state = None
            good = True
            for o in order:
                if o.kind == WRITE:
                    state = o.value
                elif o.value != state:
                    good = False
                    break
            if good:
                return True
    return False


@st.composite
def small_histories(draw: st.DrawFn) -> list[Operation]:
    n = draw(st.integers(1, 5))
    ops = []
    for i in range(n):
        call = draw(st.integers(0, 8))
        dur = draw(st.integers(0, 4))
        if draw(st.booleans()):
            unknown = draw(st.integers(0, 3)) == 0
            ops.append(Operation("p", WRITE, b"k", draw(st.sampled_from([None, b"a", b"b"])), float(call),
                                 None if unknown else float(call + dur) + 0.5, INFO if unknown else OK))
        else:
            ops.append(Operation("p", READ, b"k", draw(st.sampled_from([None, b"a", b"b"])), float(call),
                                 float(call + dur) + 0.5, OK))
    return ops


@settings(max_examples=400, deadline=None)
@given(small_histories())
def test_the_search_agrees_with_brute_force(ops: list[Operation]) -> None:
    got, _ = linearizable(prepare(ops))
    assert got == brute_force(ops), ops


def test_many_concurrent_unknown_writes_stay_fast() -> None:
    """Twelve writes of unknown outcome all in flight, reads between: memoization keeps
    the search to (subsets x states), not orderings."""
    h = [w("a", "0", 0, 1)] + [w(f"u{i}", f"x{i}", 2 + i * 0.01, None, INFO) for i in range(12)]
    h += [r("r", f"x{i}", 10 + i, 10.5 + i) for i in range(0, 12, 2)]
    res = check(h)
    assert res.ok and res.seconds < 5
    assert math.isinf(prepare(h)[1].ret)
