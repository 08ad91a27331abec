"""node/backoff.py: the wait after each failure doubles up to the cap, with equal
jitter (half fixed, half random); a success forgets the key."""
from __future__ import annotations

import pytest

from node.backoff import Backoff

from test_isr_admission import primary  # noqa: F401  (the fixture)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_waits_double_up_to_the_cap_with_equal_jitter() -> None:
    clock = Clock()
    lo = Backoff(0.25, 4.0, rand=lambda: 0.0, clock=clock)
    hi = Backoff(0.25, 4.0, rand=lambda: 0.999999, clock=clock)
    assert [round(lo.failed("k"), 3) for _ in range(7)] == [0.125, 0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    assert [round(hi.failed("k"), 3) for _ in range(7)] == [0.25, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert lo.failures("k") == 7 and lo.failures("other") == 0


def test_a_key_is_ready_again_after_its_wait_and_forgotten_on_success() -> None:
    clock = Clock()
    b = Backoff(1.0, 8.0, rand=lambda: 0.5, clock=clock)
    assert b.ready("k")
    wait = b.failed("k")                       # 0.5 + 0.25
    assert wait == pytest.approx(0.75) and not b.ready("k") and b.ready("other")
    clock.t += 0.74
    assert not b.ready("k")
    clock.t += 0.02
    assert b.ready("k") and len(b) == 1
    b.succeeded("k")
    assert len(b) == 0 and b.failures("k") == 0
    assert b.failed("k") == pytest.approx(0.75)  # from the start again


def test_a_failure_in_another_state_starts_over_and_a_new_state_is_ready_at_once() -> None:
    """The token is the state a failure happened in (a partition's record and the
    node's lease): a key whose state changed is ready at once, and counts anew."""
    clock = Clock()
    b = Backoff(1.0, 8.0, rand=lambda: 1.0, clock=clock)
    for _ in range(3):
        b.failed("k", ("n2", 5, 0xA))
    assert b.failures("k") == 3 and not b.ready("k", ("n2", 5, 0xA))
    assert b.ready("k", ("n2", 6, 0xA))          # a new epoch: at once, forgotten
    assert b.failures("k") == 0
    assert b.failed("k", ("n2", 6, 0xB)) == pytest.approx(1.0)
    assert b.failed("k", ("n2", 6, 0xC)) == pytest.approx(1.0)   # another lease: 1st again


def test_many_failures_do_not_overflow() -> None:
    b = Backoff(0.1, 30.0, rand=lambda: 1.0)
    for _ in range(2000):
        w = b.failed("k")
    assert w == pytest.approx(30.0)


@pytest.mark.parametrize("base, cap", [(0, 1), (-1, 1), (2, 1)])
def test_a_bad_range_is_refused(base: float, cap: float) -> None:
    with pytest.raises(ValueError):
        Backoff(base, cap)


# -- the reconcile loop's in-sync joins back off ----------------------------------------------
def test_a_failed_in_sync_join_is_not_asked_again_until_its_wait_is_over(primary, monkeypatch) -> None:
    """This node holds an OWNING copy outside the in-sync set: the reconcile loop asks
    the primary to admit it. The primary does not answer: the next passes do not ask
    again until the back-off's wait is over (before, every pass asked at once)."""
    import time as _time

    from node.cluster_map import PartRecord
    from node.errors import Unavailable
    from node.reconcile import Reconciler
    from test_isr_admission import BACKUP, CACHE, EPOCH, P, TERM

    class Control:
        def put_report(self) -> None:
            pass

    calls: list[str] = []

    def call(addr: str, method: str, **kw: object) -> object:
        calls.append(method)
        raise Unavailable("the primary does not answer")

    monkeypatch.setattr(primary.ctx.pool, "call", call)
    with primary.ctx.map.lock:
        primary.ctx.map.map.parts[CACHE][P] = PartRecord(BACKUP, (BACKUP,), EPOCH, False, TERM)
    rec = Reconciler(primary.ctx, Control(), object())          # type: ignore[arg-type]
    clock = [1000.0]
    rec.backoff._clock = lambda: clock[0]
    rec.backoff._rand = lambda: 1.0                               # the longest wait: base

    def settle() -> None:
        deadline = _time.monotonic() + 5
        while rec._isr_joins and _time.monotonic() < deadline:
            _time.sleep(0.01)

    try:
        assert rec._one(CACHE, P) is False                        # the join goes out
        settle()
        assert calls == ["join_isr"] and rec.backoff.failures((CACHE, P)) == 1
        for _ in range(5):                                        # passes within the wait
            assert rec._one(CACHE, P) is True
        settle()
        assert calls == ["join_isr"]
        clock[0] += 0.26                                          # RETRY_BASE_S passed
        assert rec._one(CACHE, P) is False
        settle()
        assert calls == ["join_isr"] * 2 and rec.backoff.failures((CACHE, P)) == 2
        clock[0] += 0.26                                          # not the doubled wait yet
        assert rec._one(CACHE, P) is True
    finally:
        rec._pool.shutdown(wait=True)

