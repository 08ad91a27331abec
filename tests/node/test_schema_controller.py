"""The controller against malformed keys in a real etcd (no node processes): a garbage
partition record whose predecessor its map never held is rebuilt from the copies'
reports (the copies with the most updates in sync, epoch and term above anything
before); garbage requests are refused and deleted; a garbage member is no member."""
from __future__ import annotations

import pytest

from node import schema
from node.cluster_map import PartRecord
from node.config import CacheConfig
from node.control import Etcd, View
from node.controller import Controller, part_key

PREFIX = "/ferry/t"
CACHE = CacheConfig("default", partitions=4, backups=1)


def world(etcd: Etcd) -> tuple[Controller, View]:
    etcd.put(f"{PREFIX}/meta", {"caches": [CACHE.to_wire()], "created_by": "a"})
    view = View(etcd, PREFIX, lambda ch: None)
    etcd.put(f"{PREFIX}/controller", {"id": "a", "boot": "b"})
    ctl = Controller("a", PREFIX, etcd, view, {"default": CACHE}, etcd.get(f"{PREFIX}/controller").create)
    for n, counter in (("a", 5), ("b", 9), ("c", 9)):
        etcd.put(f"{PREFIX}/members/{n}", {"address": f"addr-{n}", "boot": "b"})
        etcd.put(f"{PREFIX}/reports/{n}/default/0", ["OWNING", counter])
    return ctl, view


def test_a_garbage_record_nobody_saw_valid_is_rebuilt_from_the_copies_with_the_most_updates(etcd, monkeypatch):
    ctl, view = world(etcd)
    key = part_key(PREFIX, "default", 0)
    etcd.put(key, {"primary": "a", "isr": ["a", "b"], "epoch": "7", "term": 3})
    bad = etcd.get(key)
    view.load()
    assert ctl.decide() == 0                       # the copies first send fresh counters
    assert etcd.get(key).mod == bad.mod
    monkeypatch.setattr(schema, "REBUILD_GRACE_S", 0.0)
    view.load()
    ctl.decide()
    rec = schema.record(key, etcd.get(key))
    assert set(rec.isr) == {"b", "c"} and rec.primary in ("b", "c")   # a reports fewer updates
    assert rec.epoch == rec.term >= bad.mod and not rec.lost


def test_a_garbage_record_with_no_owning_copy_is_left_alone(etcd, monkeypatch):
    ctl, view = world(etcd)
    for n in "abc":
        etcd.delete(f"{PREFIX}/reports/{n}/default/0")
    key = part_key(PREFIX, "default", 0)
    etcd.put(key, [1, 2])
    monkeypatch.setattr(schema, "REBUILD_GRACE_S", 0.0)
    view.load()
    ctl.decide()
    assert etcd.get(key).value == [1, 2]


@pytest.mark.parametrize("req", [["alter_isr"], {"op": "alter_isr", "term": "1"}, {"op": "drop_table"},
                                 {"op": "alter_isr", "term": 1, "add": ["a", "a"]},
                                 {"op": "set_primary", "previous": 42}])
def test_garbage_requests_are_refused_and_deleted(etcd, req):
    ctl, view = world(etcd)
    view.load()
    ctl.decide()                                    # records for every partition, primary a
    rkey = f"{PREFIX}/requests/default/0/a"
    etcd.put(rkey, req)
    before = etcd.get(part_key(PREFIX, "default", 0))
    view.load()
    assert ctl.handle_requests() == 0
    assert etcd.get(rkey) is None
    assert etcd.get(part_key(PREFIX, "default", 0)).mod == before.mod


def test_a_garbage_member_is_no_member_for_the_controller(etcd):
    ctl, view = world(etcd)
    etcd.put(f"{PREFIX}/members/c", {"address": 7})
    view.load()
    assert not ctl._is_member("c") and ctl._is_member("b")
    assert set(ctl._live_members()) == {"a", "b"}
    ctl.decide()
    rec = schema.record("k", etcd.get(part_key(PREFIX, "default", 0)))
    assert "c" not in rec.isr and rec == PartRecord("a", ("a",), 1, False, 1)
