"""node.mapview.map_from_keys: the map from the control plane's keys, no etcd needed.
Malformed values (a table of them) are skipped and logged, never fatal."""
from __future__ import annotations

import pytest

from node.config import CacheConfig
from node.control import KV
from node.mapview import map_from_keys

P = "/ferry"
CACHES = [CacheConfig(name="c", partitions=4)]


def kv(value, create=1):
    return KV(value, create, create, 0)


def test_members_reports_records_pins_settings_and_requests():
    kvs = {
        f"{P}/members/n1": kv({"address": "127.0.0.1:1", "boot": "b1", "transfer": "127.0.0.1:9"}, 5),
        f"{P}/members/n2": kv({"address": "127.0.0.1:2", "leaving": True}, 7),
        f"{P}/reports/n1": kv({"boot": "b1", "caches": {"c": {"0": ["OWNING", 12], "3": ["MOVING", 0]}}}),
        f"{P}/parts/c/0": kv({"primary": "n1", "isr": ["n1", "n2"], "epoch": 4, "term": 2}),
        f"{P}/pins/c/1": kv(["n2", "n1"]),
        f"{P}/controller": kv({"id": "n1", "boot": "b1"}),
        f"{P}/settings/transfer.rate_limit": kv(1000),
        f"{P}/requests/c/0/n2": kv({"op": "alter_isr"}),
        "/other/members/x": kv({"address": "elsewhere"}),
    }
    m, settings, requests = map_from_keys(kvs, 42, P, CACHES)
    assert m.epoch == 42 and m.version == 7
    assert set(m.members) == {"n1", "n2"} and m.members["n2"].leaving
    assert m.members["n1"].transfer == "127.0.0.1:9"
    assert m.states["c"][0] == {"n1": "OWNING"} and m.counters["c"][0]["n1"] == 12
    assert m.states["c"][3] == {"n1": "MOVING"}
    rec = m.parts["c"][0]
    assert (rec.primary, rec.isr, rec.epoch, rec.term) == ("n1", ("n1", "n2"), 4, 2)
    assert m.pins["c"][1] == ["n2", "n1"]
    assert m.controller == "n1"
    assert settings == {"transfer.rate_limit": 1000}
    assert requests == {f"{P}/requests/c/0/n2"}


@pytest.mark.parametrize("key, value", [
    (f"{P}/reports/n1", {"caches": {"c": {"x": ["OWNING", 1]}}}),       # partition not a number
    (f"{P}/reports/n1", {"caches": {"c": ["OWNING"]}}),                 # partitions not an object
    (f"{P}/reports/n1", {"caches": "everything"}),                      # caches not an object
    (f"{P}/reports/n1", {"caches": {"c": {"0": ["OWNING"]}}}),          # no counter
    (f"{P}/reports/n1", {"caches": {"c": {"0": ["OWNING", "many"]}}}),  # counter not a number
    (f"{P}/parts/c/zero", {"primary": "n1"}),                          # partition not a number
    (f"{P}/parts/c/99", {"primary": "n1"}),                            # out of range
    (f"{P}/pins/c/x", ["n1"]),
    (f"{P}/members/n1", "not an object"),
    (f"{P}/controller", {"id": 7}),
    (f"{P}/parts/c/0", None),                                          # not JSON
])
def test_a_malformed_key_is_skipped_and_the_rest_is_kept(key, value):
    kvs = {key: kv(value), f"{P}/members/n9": kv({"address": "127.0.0.1:9"}, 3),
           f"{P}/parts/c/2": kv({"primary": "n9", "isr": ["n9"], "epoch": 1, "term": 1})}
    m, _, _ = map_from_keys(kvs, 1, P, CACHES)
    assert "n9" in m.members and m.parts["c"][2].primary == "n9"
    assert m.controller is None
    assert all(not m.states["c"][p] for p in range(4))
