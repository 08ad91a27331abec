"""node/schema.py against garbage: every key type the nodes read from etcd, with
values that are not JSON, the wrong JSON type, fields of the wrong type, missing
fields, numbers out of range, names that are not node ids and huge values. Each is
refused with one Malformed carrying the key, the revision and why; the good values
parse into typed records. Also: the map built from garbage keeps going, a malformed
record leaves the partition in ``map.garbage`` for the controller, and each (key,
revision) is logged once. No etcd needed."""
from __future__ import annotations

import base64
import json
import logging

import pytest

from node import schema
from node.cluster_map import PartRecord
from node.config import CacheConfig
from node.control import KV, _kv
from node.mapview import MapBuilder

P = "/ferry"
REV = 77
CACHE = CacheConfig("c", partitions=4, backups=1).to_wire()
HUGE_LIST = [f"n{i}" for i in range(200_000)]
HUGE_TEXT = "x" * 1_000_000
DEEP = b"[" * 100_000 + b"]" * 100_000


def raw(value: bytes | str) -> KV:
    """A KV as the client decodes a raw value read from etcd."""
    b = value.encode() if isinstance(value, str) else value
    item = {"key": base64.b64encode(b"/k").decode(), "value": base64.b64encode(b).decode(),
            "mod_revision": str(REV), "create_revision": "5", "lease": "0"}
    return _kv(item)[1]


def js(value: object) -> KV:
    return raw(json.dumps(value))


NOT_JSON = [raw(b"{not json"), raw(b"\xff\xfe garbage"), raw(b""), raw(DEEP), raw(b'{"a": 1} trailing')]

GOOD_META = {"caches": [CACHE], "created_by": "n1", "secret_salt": "ab", "secret_check": "cd",
             "initial_members": ["n2", "n1"]}
GOOD_MEMBER = {"address": "127.0.0.1:7001", "transfer": "127.0.0.1:7101", "boot": "b1", "leaving": False}
GOOD_RECORD = {"primary": "n1", "isr": ["n1", "n2"], "epoch": 4, "lost": False, "term": 2}

# (key type, parser, good value, [bad JSON values])
TABLE = [
    ("meta", schema.meta, GOOD_META, [
        [], "meta", 7, None,                                                   # wrong JSON type
        {**GOOD_META, "caches": "default"},                                    # the measured case
        {**GOOD_META, "caches": []}, {k: v for k, v in GOOD_META.items() if k != "caches"},
        {**GOOD_META, "caches": [{**CACHE, "partitions": "4"}]},
        {**GOOD_META, "caches": [{**CACHE, "partitions": 0}]},
        {**GOOD_META, "caches": [{**CACHE, "partitions": 10**30}]},
        {**GOOD_META, "caches": [{**CACHE, "backups": 9}]},
        {**GOOD_META, "caches": [{**CACHE, "backups": True}]},
        {**GOOD_META, "caches": [{k: v for k, v in CACHE.items() if k != "name"}]},
        {**GOOD_META, "caches": [{**CACHE, "name": "a/b"}]},
        {**GOOD_META, "caches": [CACHE, CACHE]},
        {**GOOD_META, "caches": [{**CACHE, "indexes": [{"name": "x"}]}]},
        {**GOOD_META, "caches": [{**CACHE, "indexes": [{"name": "x", "field": "f", "unique": "yes"}]}]},
        {**GOOD_META, "created_by": 5}, {**GOOD_META, "created_by": "../n1"},
        {**GOOD_META, "initial_members": "n1"}, {**GOOD_META, "initial_members": ["n1", "n1"]},
        {**GOOD_META, "initial_members": [""]}, {**GOOD_META, "secret_check": HUGE_TEXT},
        {**GOOD_META, "caches": [CACHE] * 2000},
    ]),
    ("member", schema.member, GOOD_MEMBER, [
        [], "n1", 1, None, {}, {**GOOD_MEMBER, "address": 7001}, {**GOOD_MEMBER, "address": ""},
        {**GOOD_MEMBER, "leaving": "no"}, {**GOOD_MEMBER, "boot": ["b"]}, {**GOOD_MEMBER, "transfer": None},
        {**GOOD_MEMBER, "address": HUGE_TEXT},
    ]),
    ("report entry", schema.report_entry, ["OWNING", 12], [
        {"caches": []}, "OWNING", None, [], ["OWNING"], ["OWNING", 1, 2], ["BOGUS", 1], [1, 1],
        ["OWNING", "12"], ["OWNING", -1], ["OWNING", 2**64], ["OWNING", 1.5], ["OWNING", True],
        ["EVICTED", 0],
    ]),
    ("partition record", schema.record, GOOD_RECORD, [
        [1, 2], "n1", 3, None,
        {**GOOD_RECORD, "epoch": "7"},                                         # the measured case
        {**GOOD_RECORD, "epoch": -1}, {**GOOD_RECORD, "epoch": 2**64}, {**GOOD_RECORD, "epoch": 4.0},
        {**GOOD_RECORD, "term": None}, {**GOOD_RECORD, "term": 9},             # term past epoch
        {**GOOD_RECORD, "isr": "n1"}, {**GOOD_RECORD, "isr": [1]}, {**GOOD_RECORD, "isr": ["n1", "n1"]},
        {**GOOD_RECORD, "isr": ["n2"]},                                        # primary not in sync
        {**GOOD_RECORD, "primary": 1}, {**GOOD_RECORD, "primary": "n1/../x"},
        {**GOOD_RECORD, "lost": "false"}, {**GOOD_RECORD, "isr": HUGE_LIST},
        {**GOOD_RECORD, "primary": "n" * 65, "isr": ["n" * 65]},
    ]),
    ("pin", schema.pin, ["n2", "n1"], [
        {"to": ["n1"]}, "n1", None, [], [1, 2], ["n1", "n1"], ["n1", ""], HUGE_LIST,
    ]),
    ("election key", schema.controller, {"id": "n1", "boot": "b"}, [
        ["n1"], "n1", None, {}, {"id": 7}, {"id": ""}, {"id": "n1", "boot": 5}, {"id": HUGE_TEXT},
    ]),
    ("request", schema.request, {"op": "alter_isr", "term": 3, "remove": [], "add": ["n2"]}, [
        [], "alter_isr", None, {}, {"op": "delete_everything"}, {"op": "alter_isr"},
        {"op": "alter_isr", "term": "3"}, {"op": "alter_isr", "term": -3},
        {"op": "alter_isr", "term": 3, "add": "n2"}, {"op": "alter_isr", "term": 3, "add": HUGE_LIST},
        {"op": "set_primary", "previous": 5}, {"op": "set_primary", "previous": ""},
    ]),
    ("setting", schema.setting, 1000, [
        None, [1], {"v": 1}, 10**40, HUGE_TEXT,
    ]),
]
CASES = [(name, fn, bad) for name, fn, _, bads in TABLE for bad in [js(b) for b in bads] + NOT_JSON]


@pytest.mark.parametrize("name, parse, good", [(t[0], t[1], t[2]) for t in TABLE], ids=[t[0] for t in TABLE])
def test_good_values_parse(name, parse, good):
    assert parse("/ferry/x", js(good)) is not None or name == "setting"


@pytest.mark.parametrize("name, parse, kv", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_garbage_is_one_malformed_with_key_revision_and_why(name, parse, kv):
    with pytest.raises(schema.Malformed) as err:
        parse("/ferry/some/key", kv)
    e = err.value
    assert e.key == "/ferry/some/key" and e.revision == REV and e.why
    assert len(str(e)) < 400 and "\n" not in str(e), str(e)     # huge values are not echoed


def test_the_typed_records():
    m = schema.meta("k", js(GOOD_META))
    assert m.caches == (CacheConfig("c", 4, 1),) and m.created_by == "n1"
    assert m.initial_members == ("n1", "n2") and m.caches_wire() == [CACHE]
    assert schema.member("k", js(GOOD_MEMBER)) == schema.MemberDoc("127.0.0.1:7001", "127.0.0.1:7101", "b1", False)
    assert schema.report_entry("k", js(["MOVING", 0])) == schema.ReportEntry("MOVING", 0)
    assert schema.record("k", js(GOOD_RECORD)) == PartRecord("n1", ("n1", "n2"), 4, False, 2)
    assert schema.record("k", js({})) == PartRecord()                  # a record with no primary yet
    assert schema.pin("k", js(["n2", "n1"])) == ("n2", "n1")
    assert schema.controller("k", js({"id": "n1"})) == schema.ControllerDoc("n1", "")
    assert schema.request("k", js({"op": "set_primary", "previous": "n1"})) == schema.SetPrimary("n1")
    assert schema.request_at(P, "c/3/n2", js({"op": "alter_isr", "term": 1})) == \
        ("c", 3, "n2", schema.AlterIsr(1, (), ()))
    assert schema.report_doc("k", js({"caches": {"c": {"1": ["OWNING", 3]}, "other": {"x": 1}}}), {"c": 4}) == \
        {("c", 1): schema.ReportEntry("OWNING", 3)}


@pytest.mark.parametrize("rest", ["c/x/n2", "c/-1/n2", "c/01/n2", "c/3", "c/3/n 2", "c/3/n2/extra",
                                  "c/" + "9" * 40 + "/n2"])
def test_a_request_key_that_names_no_partition_or_node_is_malformed(rest):
    with pytest.raises(schema.Malformed, match="requests/"):
        schema.request_at(P, rest, js({"op": "alter_isr", "term": 1}))


@pytest.mark.parametrize("value", [{"caches": []}, {"caches": {"c": ["OWNING"]}}, {"caches": {"c": {"x": ["OWNING", 1]}}},
                                   {"caches": {"c": {"9": ["OWNING", 1]}}}, {"caches": {"c": {"0": "OWNING"}}}, []])
def test_a_whole_report_document_is_checked_entry_by_entry(value):
    with pytest.raises(schema.Malformed):
        schema.report_doc("k", js(value), {"c": 4})


def test_a_key_that_is_not_utf8_is_kept_distinct_and_ignored():
    item = {"key": base64.b64encode(b"/ferry/parts/c/\xff").decode(),
            "value": base64.b64encode(b"{}").decode(), "mod_revision": "3"}
    key, kv = _kv(item)
    assert key == "/ferry/parts/c/\\xff" and kv.value == {}
    b = MapBuilder(P, [CacheConfig("c", 4, 1)])
    b.apply([(key, kv)], 3)          # a partition number that is no number: logged, skipped
    assert b.map.rec_mod["c"] == [0, 0, 0, 0]


# -- the map: garbage never stops a batch, and records are kept for the controller ------------
def kvr(value: object, rev: int) -> KV:
    return KV(value, rev, rev, 0)


def builder() -> MapBuilder:
    b = MapBuilder(P, [CacheConfig("c", 4, 1)])
    b.apply([(f"{P}/members/n1", kvr(GOOD_MEMBER, 1)), (f"{P}/members/n2", kvr(GOOD_MEMBER, 2)),
             (f"{P}/parts/c/0", kvr(GOOD_RECORD, 3)), (f"{P}/reports/n1/c/0", kvr(["OWNING", 5], 4)),
             (f"{P}/controller", kvr({"id": "n1", "boot": "b"}, 5))], 5)
    return b


def test_a_malformed_record_keeps_the_one_it_replaced_for_the_controller():
    b = builder()
    d = b.apply([(f"{P}/parts/c/0", KV(None, 6, 3, 0, "not JSON"))], 6)
    m = b.map
    assert m.parts["c"][0] == PartRecord("n1", ("n1", "n2"), 4, False, 2)     # the last valid one
    assert m.rec_mod["c"][0] == 6                                             # the CAS targets the garbage
    assert m.garbage[("c", 0)].known and m.garbage[("c", 0)].mod == 6
    assert d.garbage == [("c", 0)] and ("c", 0) in d.parts
    b.apply([(f"{P}/parts/c/0", kvr({**GOOD_RECORD, "epoch": "x"}, 7))], 7)      # garbage again
    assert m.garbage[("c", 0)].known and m.parts["c"][0].epoch == 4
    b.apply([(f"{P}/parts/c/0", kvr({**GOOD_RECORD, "epoch": 8}, 8))], 8)         # rewritten
    assert ("c", 0) not in m.garbage and m.parts["c"][0].epoch == 8


def test_a_malformed_record_seen_in_a_load_is_not_known():
    b = MapBuilder(P, [CacheConfig("c", 4, 1)])
    b.apply([(f"{P}/parts/c/1", kvr([1, 2], 9))], 9, snapshot=True)
    assert b.map.parts["c"][1] == PartRecord() and not b.map.garbage[("c", 1)].known
    b = builder()
    b.apply([(f"{P}/parts/c/0", kvr("junk", 9))], 9, snapshot=True)          # a reload after compaction
    assert b.map.parts["c"][0] == PartRecord() and not b.map.garbage[("c", 0)].known


def test_malformed_members_pins_and_election_keys_read_as_absent():
    b = builder()
    b.apply([(f"{P}/members/n2", kvr(["n2"], 6)),
             (f"{P}/controller", kvr(["n1"], 6)), (f"{P}/pins/c/2", kvr("n1", 6)),
             (f"{P}/settings/transfer.rate_limit", kvr(HUGE_TEXT, 6)), (f"{P}/meta", kvr({"caches": "x"}, 6))], 6)
    m = b.map
    assert set(m.members) == {"n1"} and m.controller is None
    assert 2 not in m.pins["c"] and b.settings == {} and m.creator is None


def test_a_malformed_report_keeps_the_state_it_last_held():
    """Read as absent, a garbage report would take its copy out of the in-sync set (and
    a primary dying then would leave the partition without a successor)."""
    b = builder()
    b.apply([(f"{P}/reports/n1/c/0", kvr({"caches": []}, 6)),
             (f"{P}/reports/n2", kvr({"caches": ["c"]}, 6))], 6)
    assert b.map.states["c"][0] == {"n1": "OWNING"} and b.map.counters["c"][0] == {"n1": 5}
    b = MapBuilder(P, [CacheConfig("c", 4, 1)])           # in a load: nothing to keep
    b.apply([(f"{P}/reports/n1/c/0", kvr({"caches": []}, 6))], 6, snapshot=True)
    assert b.map.states["c"][0] == {}


def test_each_malformed_key_and_revision_is_logged_once_without_a_traceback(caplog, monkeypatch):
    monkeypatch.setattr(schema, "_once", schema._Once())
    b = builder()
    caplog.set_level(logging.WARNING)
    for _ in range(3):
        b.apply([(f"{P}/parts/c/2", kvr({"epoch": "7"}, 30))], 30)
    b.apply([(f"{P}/parts/c/2", kvr({"epoch": "8"}, 31))], 31)
    lines = [r for r in caplog.records if "parts/c/2" in r.getMessage()]
    assert len(lines) == 2, [r.getMessage() for r in lines]
    assert "(revision 30)" in lines[0].getMessage() and "epoch" in lines[0].getMessage()
    assert all(r.exc_info is None for r in caplog.records)


def test_the_log_is_rate_limited_across_keys(caplog, monkeypatch):
    monkeypatch.setattr(schema, "_once", schema._Once())
    caplog.set_level(logging.WARNING)
    b = builder()
    b.apply([(f"{P}/pins/c/{p % 4}", kvr("junk", 100 + p)) for p in range(500)], 600)
    lines = [r for r in caplog.records if "malformed key" in r.getMessage()]
    assert len(lines) == schema.LOG_PER_SECOND


def test_rebuild_without_a_known_record_takes_the_copies_with_the_most_updates():
    bad = schema.BadRecord(mod=500, since=100.0, known=False)
    assert schema.rebuild_record("c", 0, bad, {}, 200.0) == (None, False)       # nobody to lead
    assert schema.rebuild_record("c", 0, bad, {"n1": 5}, 100.5) == (None, True)  # reports first
    rec, later = schema.rebuild_record("c", 0, bad, {"n1": 5, "n2": 9, "n3": 9}, 200.0)
    assert not later and rec is not None
    assert set(rec.isr) == {"n2", "n3"} and rec.primary in ("n2", "n3")
    assert rec.epoch == rec.term == 500          # above every term an earlier record had
