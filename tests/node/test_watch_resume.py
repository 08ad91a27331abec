"""control.View against a real etcd: a watch that resumes never skips an event.

etcd sends a backlog (a watch started from an old revision) in several responses,
each with the store's current revision in its header. A watcher that resumes from
header + 1 after a stream breaks loses every event between the last one delivered
and the header; the View resumes from the last delivered event's revision + 1."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from node.control import Etcd, View
from node.etcdserver import EtcdCluster

PREFIX = "/ferry/w"
KEYS = 2500          # more revisions than etcd sends in one watch response (1,000)


class OneBatchPerStream(Etcd):
    """Every watch stream delivers its first batch and then breaks, as a stream cut by
    the network or the idle timeout would."""

    streams = 0
    headers_ahead = 0

    def watch(self, prefix, start_revision, stop, idle=3.0):
        type(self).streams += 1
        for rev, evs in super().watch(prefix, start_revision, stop, idle):
            yield rev, evs
            return


@pytest.fixture
def etcd(tmp_path):
    c = EtcdCluster(str(tmp_path / "etcd")).start()
    yield c
    c.stop()


def test_a_resumed_watch_delivers_every_event_of_a_backlog(etcd):
    e = OneBatchPerStream(etcd.endpoints)
    got: dict[str, int] = {}
    deleted: set[str] = set()

    def on_change(events):
        for k, kv in events or ():
            if kv is None:
                deleted.add(k)
            else:
                got[k] = kv.value

    v = View(e, PREFIX, on_change)
    v.load()                                   # at the revision before the backlog
    writer = Etcd(etcd.endpoints)
    with ThreadPoolExecutor(8) as pool:        # one revision per key
        list(pool.map(lambda i: writer.put(f"{PREFIX}/k/{i:05d}", i), range(KEYS)))
    writer.delete(f"{PREFIX}/k/00007")
    head = writer.put(f"{PREFIX}/last", 1)
    v.start()
    deadline = time.monotonic() + 30
    # the watch thread applies a batch (which moves ``revision``) and only then hands it
    # to on_change: wait for the last key's event too, not for the revision alone
    while (v.revision < head or f"{PREFIX}/last" not in got) and time.monotonic() < deadline:
        time.sleep(0.05)
    v.stop()
    assert v.revision == head
    assert OneBatchPerStream.streams >= 2      # the backlog did take several streams
    missing = [i for i in range(KEYS) if i != 7 and f"{PREFIX}/k/{i:05d}" not in v.kvs]
    assert missing == []                       # the copy held is etcd's
    assert all(got[f"{PREFIX}/k/{i:05d}"] == i for i in range(KEYS) if i != 7)   # and so are the events
    assert f"{PREFIX}/k/00007" in deleted and f"{PREFIX}/k/00007" not in v.kvs
    assert len(v.items("k")) == KEYS - 1


def test_a_reload_delivers_only_the_difference(etcd):
    e = Etcd(etcd.endpoints)
    for i in range(5):
        e.put(f"{PREFIX}/k/{i}", i)
    batches: list[list] = []
    v = View(e, PREFIX, batches.append)
    v.load()
    assert sorted(k for k, _ in batches[0]) == [f"{PREFIX}/k/{i}" for i in range(5)]
    e.put(f"{PREFIX}/k/1", 10)
    e.delete(f"{PREFIX}/k/2")
    e.put(f"{PREFIX}/k/9", 9)
    v.load()                                   # as after a compaction: reload and diff
    diff = {k: (kv.value if kv else None) for k, kv in batches[1]}
    assert diff == {f"{PREFIX}/k/1": 10, f"{PREFIX}/k/2": None, f"{PREFIX}/k/9": 9}
    v.load()
    assert batches[2] == []


def test_etcd_errors_leave_as_node_errors(etcd):
    from node.errors import ControlPlaneError, LeaseGone, NodeError
    e = Etcd(etcd.endpoints)
    with pytest.raises(LeaseGone):
        e.put(f"{PREFIX}/x", 1, lease=0x1234567)      # no such lease
    with pytest.raises(ControlPlaneError):
        e.put(f"{PREFIX}/big", "x" * (2 << 20))         # over etcd's request limit
    assert issubclass(LeaseGone, NodeError)


def test_starting_a_running_etcd_again_starts_no_second_process(etcd) -> None:
    """``with EtcdCluster(...) as c: c.start()`` used to start a second etcd on the
    same data dir and ports and leave the first without an owner."""
    first = etcd.members[0].proc
    assert etcd.start() is etcd
    assert etcd.members[0].proc is first and first.poll() is None
    etcd.restart(0)                        # alive: nothing to start
    assert etcd.members[0].proc is first
    etcd.kill(0)
    etcd.restart(0)                        # killed: started again, on the same data
    assert etcd.members[0].proc is not first and etcd.members[0].alive()
    etcd.wait_healthy(10.0)
