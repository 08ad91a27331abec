"""The messages mode (``rebalance.mode = "messages"``, fallback and baseline): each supply
message is applied as ONE batch (one WAL batch, one durability wait, one index commit),
a supplied entry never overwrites a newer update, bad supply messages restart the move,
and a demander killed mid-fetch (and at its other stages) recovers with nothing
acknowledged lost and indexes agreeing with data."""
from __future__ import annotations

import json

import pytest

from node.config import CacheConfig, load
from node.errors import NodeError, Unavailable
from node.move import APPLY_CHUNK, apply_chunked, supply_batch

from nodeharness import NodeProc, offline_check, wait_settled
from test_cluster import Writer, check_model, writes_during
from test_filemove import FILES, leftovers, moved_by_files, start_pair, wait_exit

MESSAGES = FILES.replace('mode = "files"', 'mode = "messages"')


def city(c: str, pad: int = 0) -> bytes:
    return json.dumps({"city": c, "pad": "x" * pad}).encode()


@pytest.fixture
def data(tmp_path):
    from node.storage import CacheData
    cfg = load(None, id="n1", data=str(tmp_path), listen="127.0.0.1:7001")
    cache = CacheConfig.from_wire({"name": "default", "partitions": 4, "backups": 1,
                                   "indexes": [{"name": "by_city", "field": "city", "unique": False}]})
    d = CacheData(cfg, cache)
    d.create(1)
    yield d
    d.close()


def count_calls(d, monkeypatch) -> list[int]:
    """Sizes of the store's apply_many calls (one WAL batch + one durability wait each)
    and of the index's batch commits."""
    calls: list[int] = []
    store_many, index_many = d.store.apply_many, d.indexes.apply_many
    monkeypatch.setattr(d.store, "apply_many", lambda p, ups, **kw: calls.append(len(ups)) or store_many(p, ups, **kw))
    monkeypatch.setattr(d.indexes, "apply_many", lambda p, ch: calls.append(-len(ch)) or index_many(p, ch))
    monkeypatch.setattr(d.store, "apply", lambda *a: pytest.fail("per-entry apply on the batch path"))
    return calls


def test_a_supply_message_is_applied_as_one_batch(data, monkeypatch):
    calls = count_calls(data, monkeypatch)
    entries = [[b"k%05d" % i, None if i % 10 == 9 else city(["oslo", "lima"][i % 2]), i + 1]
               for i in range(APPLY_CHUNK + 100)]
    batch = supply_batch("default", 1, entries, 0, len(entries))
    assert apply_chunked(data, 1, batch) == len(entries)
    # two chunks (2,048 records max): each one store batch and one index commit
    assert calls == [APPLY_CHUNK, -APPLY_CHUNK, 100, -100]
    assert data.counter(1) == len(entries) and data.get(1, b"k00009") is None
    assert data.get(1, b"k00002") == city("oslo")
    assert data.indexes.verify(1, data.store).ok
    calls.clear()
    big = [(b"big%d" % i, city("pune", 60 * 1024), len(entries) + 1 + i) for i in range(100)]
    assert apply_chunked(data, 1, big) == 100
    assert len([c for c in calls if c > 0]) == 2          # 4 MiB per chunk: 100 x 60 KiB in two
    assert len(data.lookup("by_city", "pune")) == 100 and data.indexes.verify(1, data.store).ok


def test_a_supplied_value_never_overwrites_a_newer_update(data):
    """A key written (counter 7) before an older supply batch arrives: the counter rule
    skips every supplied entry at or below the partition's counter."""
    assert data.apply(1, b"a", city("kyiv"), 7)
    batch = supply_batch("default", 1, [[b"a", city("oslo"), 3], [b"b", city("lima"), 5],
                                        [b"c", city("pune"), 8]], 0, 8)
    assert apply_chunked(data, 1, batch) == 1                  # only counter 8
    assert data.get(1, b"a") == city("kyiv") and data.get(1, b"b") is None
    assert data.lookup("by_city", "kyiv") == [b"a"] and data.lookup("by_city", "oslo") == []
    assert data.lookup("by_city", "pune") == [b"c"] and data.counter(1) == 8
    assert data.indexes.verify(1, data.store).ok


@pytest.mark.parametrize("entries, last, needle", [
    ([[b"a", b"{}", 2], [b"b", b"{}", 2]], 0, "not ascending"),
    ([[b"a", b"{}", 3]], 3, "not ascending"),
    ([[b"a", b"{}", 11]], 0, "snapshot at 10"),
    ([[b"a", b"{}"]], 0, "malformed entry"),
    (["junk"], 0, "malformed entry"),
    ([["a", b"{}", 1]], 0, "wrong types"),
    ([[b"a", 5, 1]], 0, "wrong types"),
])
def test_a_bad_supply_message_restarts_the_move_and_applies_nothing(data, entries, last, needle):
    with pytest.raises(Unavailable, match=needle):
        supply_batch("default", 1, entries, last, 10)
    assert data.counter(1) == 0


class OverWriter(Writer):
    """Overwrites existing keys again and again (new value each time): updates of keys
    the supplier is sending while the demander fetches them."""

    def __init__(self, seeds: list[str], secret: str, keys: list[bytes]) -> None:
        super().__init__(seeds, secret)
        self.keys = keys

    def run(self) -> None:
        while not self.stop_flag.is_set():
            self.i += 1
            key = self.keys[self.i * 7 % len(self.keys)]
            # as large as the values it overwrites: partitions keep several supply messages
            value = json.dumps({"gen": self.i, "city": "rome", "pad": "x" * 6000}).encode()
            try:
                self.client.put("default", key, value)
                self.acked[key] = value
                self.acks += 1
                self.unsure.discard(key)
            except NodeError as e:
                self.unsure.add(key)
                self.errors.append(str(e))


@pytest.mark.slow
def test_messages_mode_demander_killed_mid_fetch_and_at_each_stage(tmp_path, nodes):
    """n3 joins in the messages mode and dies mid-fetch (a supply batch applied, more to
    come), then at its other stages; writers keep writing new keys and overwriting the
    keys being supplied. At the end nothing acknowledged is lost, every owner agrees,
    indexes agree with data, and some buffered overwrites were applied after older
    supplied values of the same partition (not overwritten by them)."""
    secret, _, n1, n2 = start_pair(tmp_path, nodes, MESSAGES)
    # ~1.5 MiB per partition: several 512 KiB supply messages per move
    pre = {f"pre-{i}".encode(): city("rome", 6000) for i in range(2000)}
    from node import Client
    with Client([n1.address], secret_file=secret) as c:
        assert c.put_many("default", pre.items(), batch=64) == len(pre)
    w, ow = Writer([n1.address], secret), OverWriter([n1.address], secret, list(pre))
    w.start()
    ow.start()
    # n3 receives at 2 MB/s: each fetch (~1.5 MiB, 3 supply messages) spans about half a
    # second of the overwriter's writes, so some of them are buffered whatever the load
    paced = tmp_path / "n3.toml"
    paced.write_text(MESSAGES.replace("[control_plane]", "[transfer]\nrate_limit = 2000000\n"
                                      "[control_plane]"))
    n3 = NodeProc(str(tmp_path), "n3", secret, config=str(paced))
    nodes.append(n3)
    try:
        writes_during(w, 50)
        for point in ("demander.mid_receive:2", "demander.after_demand:1",
                      "demander.before_owning:1", "demander.after_owning:1"):
            n3.mark_restart()
            n3.start(wait=False, crash=point)
            wait_exit(n3)
            writes_during(w, 20)
            writes_during(ow, 20)
        n3.mark_restart()
        n3.start()
        wait_settled(n1.address, secret, 3, 1)
        writes_during(ow, 30)
    finally:
        w.finish()
        ow.finish()
    log = open(n3.log, errors="replace").read()
    assert moved_by_files(n3) == 0 and "stage=owning" in log
    assert "buffered updates applied after the supplied entries" in log, log[-3000:]
    assert len(w.acked) > 50 and len(ow.acked) > 50, (w.errors[-3:], ow.errors[-3:])
    live = [n for n in nodes if n.alive()]
    check_model(w, [n.address for n in live], secret)
    for n in nodes:
        assert n.stop() in (0, -9), n.tail()
    parts = offline_check([n.data for n in nodes])     # every owner equal, indexes verified
    from node import partition_of
    for model in (w.acked, ow.acked):
        for k, v in model.items():
            if k not in w.unsure and k not in ow.unsure:
                assert parts[partition_of(k, 8)].get(k) == v, k
    for k in pre:
        assert k in parts[partition_of(k, 8)], k
    assert leftovers([n.data for n in nodes]) == []


class _Bucket:
    """A receive rate that records what it is asked to pace instead of sleeping."""

    def __init__(self) -> None:
        self.taken: list[int] = []

    def take(self, n: int) -> float:
        self.taken.append(n)
        return 0.0


def test_the_fetch_holds_a_receive_slot_and_is_paced_by_the_receive_rate(data, tmp_path):
    """Both modes are paced by the same measure: a messages move's fetch holds one of the
    node's receive slots for the whole fetch and takes each supply message's entry bytes
    from the node's receive rate, as a file transfer takes its bytes."""
    import contextlib
    import threading

    from node.move import MoveContext
    from node.move.messages import messages_once
    from node.move.progress import Move
    from node.states import State
    from transfer import Limits

    limits = Limits(max_transfers=1)
    bucket = _Bucket()
    limits.bucket = bucket  # type: ignore[assignment]
    pages = [[[b"k%03d" % (10 * m + i), city("oslo", 100), 10 * m + i + 1] for i in range(10)]
             for m in range(3)]
    held_during_fetch: list[int] = []

    class Supply:
        def demand(self, primary, cache, p):
            return "s1", 30, 30 * 120

        def fetch(self, primary, session, offset, max_bytes):
            held_during_fetch.append(limits.slots.held)
            return pages[offset], offset + 1, offset == len(pages) - 1

        def done(self, primary, session):
            pass

    class States:
        def __init__(self) -> None:
            self.s: dict[tuple[str, int], State] = {}

        def get(self, cache, p):
            return self.s.get((cache, p))

        def set(self, cache, p, state, reason=""):
            self.s[(cache, p)] = state

    class Locator:
        def primary(self, cache, p):
            return "n1", "127.0.0.1:1"

    lock = threading.RLock()

    @contextlib.contextmanager
    def plock(cache, p):
        with lock:
            yield

    states = States()
    ctx = MoveContext(me="n2", data_dir=str(tmp_path), secret=b"", data={"default": data},
                      states=states, plock=plock, feed=None, locator=Locator(),  # type: ignore[arg-type]
                      stopping=threading.Event(), recv_limits=limits)
    mv = Move("default", 1, mode="messages")
    assert messages_once(ctx, mv, data, Supply()) is True
    assert states.get("default", 1) == State.OWNING and data.counter(1) == 30
    assert held_during_fetch == [1, 1, 1] and limits.slots.held == 0
    per_message = [sum(len(k) + len(v) for k, v, _ in page) for page in pages]
    # every supply message's bytes but the last (after which nothing waits) were paced
    assert bucket.taken == per_message[:-1] and mv.fig.bytes == sum(per_message)
