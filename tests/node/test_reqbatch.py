"""Group commit of a node's requests to the controller (node/reqbatch.py)."""
from __future__ import annotations

import threading
import time

import pytest

from node.reqbatch import GroupCommit


def _run(gc: GroupCommit, items: list[tuple[str, dict[str, object]]]) -> list[int | BaseException]:
    """Submit every item from its own thread, all at once; their results in order."""
    out: list[int | BaseException] = [0] * len(items)
    go = threading.Barrier(len(items))

    def one(i: int) -> None:
        go.wait()
        try:
            out[i] = gc.submit(*items[i])
        except BaseException as e:      # noqa: B902 (the test looks at it)
            out[i] = e
    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(items))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    assert not any(t.is_alive() for t in ts), "a caller never returned"
    return out


def test_requests_made_together_share_one_transaction() -> None:
    written: list[list[str]] = []

    def write(items: list[tuple[str, dict[str, object]]]) -> int:
        written.append([k for k, _ in items])
        return 100 + len(written)
    gc = GroupCommit(write, linger=0.05)
    revs = _run(gc, [(f"k{i}", {"i": i}) for i in range(20)])
    assert len(written) == 1 and sorted(written[0]) == sorted(f"k{i}" for i in range(20))
    assert revs == [101] * 20
    assert (gc.txns, gc.requests) == (1, 20)


def test_a_transaction_never_carries_more_than_max_ops_or_one_key_twice() -> None:
    written: list[list[str]] = []

    def write(items: list[tuple[str, dict[str, object]]]) -> int:
        written.append([k for k, _ in items])
        return len(written)
    gc = GroupCommit(write, linger=0.05, max_ops=4)
    items: list[tuple[str, dict[str, object]]] = [(f"k{i}", {}) for i in range(9)] + [("k0", {"again": 1})]
    revs = _run(gc, items)
    assert all(len(w) <= 4 and len(set(w)) == len(w) for w in written)
    assert sorted(k for w in written for k in w) == sorted(k for k, _ in items)
    assert len(written) == 3
    # each caller got the revision of the transaction that carried its key
    for (k, _), rev in zip(items, revs, strict=True):
        assert isinstance(rev, int) and k in written[rev - 1]


def test_a_failed_write_fails_every_request_it_carried_and_the_next_ones_go_on() -> None:
    calls = []

    def write(items: list[tuple[str, dict[str, object]]]) -> int:
        calls.append(len(items))
        if len(calls) == 1:
            raise OSError("etcd unreachable")
        return 7
    gc = GroupCommit(write, linger=0.05)
    out = _run(gc, [(f"k{i}", {}) for i in range(5)])
    assert all(isinstance(o, OSError) for o in out)
    assert gc.submit("later", {}) == 7          # nothing left stuck


def test_a_caller_writes_for_others_only_until_its_own_request_is_written() -> None:
    """Requests that keep arriving while one is written are taken over by a waiting
    caller: the first caller returns after its own transaction."""
    first_back = threading.Event()
    started = threading.Event()
    calls = []

    def write(items: list[tuple[str, dict[str, object]]]) -> int:
        calls.append([k for k, _ in items])
        started.set()
        time.sleep(0.05)
        return len(calls)
    gc = GroupCommit(write, linger=0.0)

    def first() -> None:
        gc.submit("first", {})
        first_back.set()
    t = threading.Thread(target=first)
    t.start()
    assert started.wait(5)
    later = [threading.Thread(target=gc.submit, args=(f"k{i}", {})) for i in range(3)]
    for x in later:
        x.start()
    assert first_back.wait(1.0)                 # back once "first" is written ...
    for x in later + [t]:
        x.join(5)
    assert calls[0] == ["first"] and sorted(k for c in calls[1:] for k in c) == ["k0", "k1", "k2"]


def test_requests_of_one_node_go_to_etcd_in_one_transaction(etcd) -> None:
    """On a real etcd: concurrent requests are put at one revision, each under its key."""
    lease = etcd.grant(30)[0]
    gc = GroupCommit(lambda items: etcd.txn([], [(k, d, lease) for k, d in items])[1], linger=0.05)
    keys = [f"/t/requests/c/{p}/n1" for p in range(30)]
    revs = _run(gc, [(k, {"op": "alter_isr", "p": i}) for i, k in enumerate(keys)])
    assert len(set(revs)) == 1 and gc.txns == 1
    for i, k in enumerate(keys):
        kv = etcd.get(k)
        assert kv is not None and kv.mod == revs[0] and kv.lease == lease
        assert kv.value == {"op": "alter_isr", "p": i}


@pytest.mark.parametrize("n", [1, 2])
def test_a_lone_request_is_written_at_once_without_waiting_for_others(n: int) -> None:
    written = []
    gc = GroupCommit(lambda items: written.append(items) or 1, linger=0.0)
    for i in range(n):
        assert gc.submit(f"k{i}", {}) == 1
    assert len(written) == n
