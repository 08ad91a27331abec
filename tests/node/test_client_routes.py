"""The client routes by pages of the map: a request reads the page of its partition
once, a wrong route reads that page again, and nothing reads the whole map."""
from __future__ import annotations

import pytest

from node import Client
from node.assignment import partition_of
from node.cluster_map import ClusterMap, Member
from node.config import CacheConfig
from node.errors import NotPrimary, Unavailable
from node.rpcapi import Requester
from node.schema import PartRecord

from nodeharness import write_secret

CACHES = {"a": CacheConfig(name="a", partitions=3000, backups=1),
          "b": CacheConfig(name="b", partitions=2000, backups=1)}
NODES = {"n1": "10.0.0.1:1", "n2": "10.0.0.2:1"}


def cluster_map(primary_of: dict[tuple[str, int], str], epoch: int = 10) -> ClusterMap:
    m = ClusterMap(CACHES)
    m.epoch = m.version = epoch
    for i, (n, a) in enumerate(NODES.items()):
        m.members[n] = Member(n, a, order=i + 1)
    for c, cc in CACHES.items():
        for p in range(cc.partitions):
            prim = primary_of.get((c, p), "n1")
            m.parts[c][p] = PartRecord(prim, ("n1", "n2"), epoch, False, epoch)
            m.states[c][p] = {"n1": "OWNING", "n2": "OWNING"}
    return m


class FakeCluster(Requester):
    """Both nodes answer get_map from ``self.map``; a put is taken only by the
    partition's primary in ``self.truth`` (else not_primary)."""

    def __init__(self, m: ClusterMap) -> None:
        self.map = m
        self.truth: dict[tuple[str, int], str] = {}
        self.pages: list[tuple[int, int | None]] = []
        self.puts: list[str] = []
        self.garbage: dict[str, object] | None = None

    def call(self, address, method, /, timeout=None, **args):  # type: ignore[no-untyped-def]
        node = next(n for n, a in NODES.items() if a == address)
        if method == "get_map":
            self.pages.append((args.get("start", 0), args.get("count")))
            if self.garbage is not None:
                return self.garbage
            return self.map.to_wire(args.get("start", 0), min(args.get("count") or ClusterMap.PAGE,
                                                               ClusterMap.PAGE))
        if method == "put":
            c, key = args["cache"], args["key"]
            p = partition_of(key, CACHES[c].partitions)
            if self.truth.get((c, p), "n1") != node:
                raise NotPrimary(f"{node} is not the primary of {c}/{p}")
            self.puts.append(node)
            return 7
        raise AssertionError(method)

    def close(self) -> None:
        pass


@pytest.fixture
def fake_client(tmp_path):
    secret = write_secret(str(tmp_path / "secret"))
    fake = FakeCluster(cluster_map({}))
    c = Client(list(NODES.values()), secret_file=secret, timeout=5.0)
    c.pool = fake  # type: ignore[assignment]
    yield c, fake


def test_a_put_reads_one_page_of_the_map_not_all_of_it(fake_client) -> None:
    c, fake = fake_client
    assert c.put("b", "k1", "v") == 7
    # the first request learns the caches from page 0, then reads its own page
    assert all(count == Client.ROUTE_PAGE for _, count in fake.pages), fake.pages
    assert len(fake.pages) <= 2
    n = len(fake.pages)
    for i in range(50):
        c.put("b", "k1", f"v{i}")
    assert len(fake.pages) == n            # the page is held: no map read per request
    p = partition_of(b"k1", 2000)
    start = (3000 + p) // Client.ROUTE_PAGE * Client.ROUTE_PAGE
    assert (start, Client.ROUTE_PAGE) in fake.pages


def test_a_wrong_route_reads_that_page_again_and_goes_to_the_new_primary(fake_client) -> None:
    c, fake = fake_client
    c.put("a", "key-7", "v")
    p = partition_of(b"key-7", 3000)
    # the primary moves to n2: the node's map says so, the client's page does not yet
    fake.truth[("a", p)] = "n2"
    fake.map = cluster_map({("a", p): "n2"}, epoch=11)
    before = len(fake.pages)
    assert c.put("a", "key-7", "v2") == 7
    assert fake.puts[-1] == "n2"
    page = p // Client.ROUTE_PAGE * Client.ROUTE_PAGE
    assert fake.pages[before:] == [(page, Client.ROUTE_PAGE)]
    assert c.map is not None and c.map.primary("a", p) == "n2" and c.map.epoch == 11


def test_an_older_page_does_not_replace_a_newer_one(fake_client) -> None:
    c, fake = fake_client
    c.put("a", "key-7", "v")
    p = partition_of(b"key-7", 3000)
    fake.map = cluster_map({}, epoch=5)         # a node whose map is behind
    fake.truth[("a", p)] = "n2"
    with pytest.raises(NotPrimary):
        c.timeout = 0.3
        c.put("a", "key-7", "v2")
    assert c.map is not None and c.map.epoch == 10   # the page read at 10 was kept


def test_setting_the_map_to_none_reads_the_page_again(fake_client) -> None:
    c, fake = fake_client
    c.put("a", "key-7", "v")
    n = len(fake.pages)
    c.map = None
    c.put("a", "key-7", "v")
    assert len(fake.pages) == n + 1      # the caches are remembered: one page read


@pytest.mark.parametrize("garbage", [
    {"version": 1, "epoch": 99, "members": [{"id": "n1", "address": "10.0.0.1:1", "order": 1}],
     "caches": [c.to_wire() for c in CACHES.values()], "offsets": {"a": 2990},
     "states": {"a": [{}] * 50}},                                      # past the cache's end
    {"version": 1, "epoch": 99, "members": [{"id": "n1", "address": "10.0.0.1:1", "order": 1}],
     "caches": [CacheConfig(name="a", partitions=7, backups=1).to_wire()]},   # other caches
    {"version": 1, "epoch": 99, "members": [{"id": "n1"}], "caches": []},     # a member without fields
])
def test_a_malformed_page_changes_nothing_held(fake_client, garbage) -> None:
    c, fake = fake_client
    c.put("a", "key-7", "v")
    m = c.map
    assert m is not None
    sizes = {name: len(m.states[name]) for name in CACHES}
    fake.garbage = garbage
    with pytest.raises(Unavailable, match="malformed map"):
        c._load_page(0)            # both nodes answer garbage
    assert c.map is m and m.epoch == 10
    assert {name: len(m.states[name]) for name in CACHES} == sizes
    assert set(m.members) == {"n1", "n2"}
