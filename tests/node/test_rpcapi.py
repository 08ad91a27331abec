"""node/rpcapi.py: the typed requests and replies of the node's RPC methods.

Every method of the table round-trips ``to_wire``/``from_wire`` with the argument map
node/wire.py sends; every request class refuses a missing, an unknown and a mistyped
argument with BadRequest; a node-only method asked by a client is refused; a reply
that does not decode is BadReply, never a KeyError or TypeError; the typed call goes
through ``call`` with the same arguments as before."""
from __future__ import annotations

import dataclasses

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node import rpcapi as api
from node.acklatency import LatencyReport
from node.dedup import RequestId
from node.errors import BadReply, BadRequest
from node.node import CLIENT_METHODS, NODE_CLAIMS

RID = RequestId("c0ffee", 7, 5)

# one request of every method, and the argument map it travels as
SAMPLES: dict[str, tuple[api.Req, dict]] = {
    "ping": (api.Ping(), {}),
    "get_map": (api.GetMap(2048, 2048), {"start": 2048, "count": 2048}),
    "put": (api.Put("default", b"k", b"v", RID), {"cache": "default", "key": b"k", "value": b"v",
                                                  "rid": ["c0ffee", 7, 5]}),
    "put_batch": (api.PutBatch("default", b"a", ((b"a", b"1"), (b"b", b"2")), RID),
                  {"cache": "default", "key": b"a", "items": [[b"a", b"1"], [b"b", b"2"]],
                   "rid": ["c0ffee", 7, 5]}),
    "get": (api.Get("default", b"k"), {"cache": "default", "key": b"k"}),
    "remove": (api.Remove("default", b"k", RID), {"cache": "default", "key": b"k", "rid": ["c0ffee", 7, 5]}),
    "lookup": (api.Lookup("default", "by_city", "oslo"), {"cache": "default", "index": "by_city", "value": "oslo"}),
    "range": (api.Range("default", "by_n", 1, 9, None), {"cache": "default", "index": "by_n", "lo": 1, "hi": 9,
                                                         "limit": None}),
    "moves": (api.Moves(), {}),
    "moves_done": (api.MovesDone(500, 100), {"start": 500, "count": 100}),
    "admission": (api.AdmissionStatus(), {}),
    "metrics": (api.Metrics(), {}),
    "leave": (api.Leave(), {}),
    "replicate": (api.Replicate("default", 3, b"k", None, 11, 10, "n1", 4),
                  {"cache": "default", "p": 3, "key": b"k", "value": None, "counter": 11, "prev": 10,
                   "primary": "n1", "epoch": 4}),
    "replicate_batch": (api.ReplicateBatch("default", 3, ((b"k", b"v", 11), (b"j", None, 12)), 10, "n1", 4, RID),
                        {"cache": "default", "p": 3, "updates": [[b"k", b"v", 11], [b"j", None, 12]], "prev": 10,
                         "primary": "n1", "epoch": 4, "rid": ["c0ffee", 7, 5]}),
    "join_isr": (api.JoinIsr("default", 3, "n2"), {"cache": "default", "p": 3, "node": "n2"}),
    "demand": (api.Demand("default", 3, "n2", "127.0.0.1:7001", 4),
               {"cache": "default", "p": 3, "node": "n2", "address": "127.0.0.1:7001", "epoch": 4}),
    "fetch": (api.Fetch("abc123", 40, 4096), {"session": "abc123", "offset": 40, "max_bytes": 4096}),
    "demand_done": (api.DemandDone("abc123"), {"session": "abc123"}),
    "register": (api.Register("default", 3, "n2", "127.0.0.1:7001", 4),
                 {"cache": "default", "p": 3, "node": "n2", "address": "127.0.0.1:7001", "epoch": 4}),
    "index_want": (api.IndexWant("default", 3, "n2", 1024),
                   {"cache": "default", "p": 3, "node": "n2", "below": 1024}),
    "index_page": (api.IndexPageQuery("default", 3, 17, 2),
                   {"cache": "default", "p": 3, "counter": 17, "page": 2}),
    "handoff": (api.Handoff("default", 3, "n2"), {"cache": "default", "p": 3, "to": "n2"}),
    "unfence": (api.Unfence("default", 3), {"cache": "default", "p": 3}),
    "ack_latency": (api.AckLatency(), {}),
    "holds": (api.HoldsQuery("default", 3), {"cache": "default", "p": 3}),
    "validate_fence": (api.ValidateFence("default", 3, 4), {"cache": "default", "p": 3, "term": 4}),
    "validate_unfence": (api.ValidateUnfence("default", 3, "tok"), {"cache": "default", "p": 3, "token": "tok"}),
    "debug_set": (api.DebugSet("default", 3, b"k", b"TAMPERED"),
                  {"cache": "default", "p": 3, "key": b"k", "value": b"TAMPERED"}),
}

# one well-formed reply of every method, and what it decodes to
REPLIES: dict[str, tuple[object, object]] = {
    "ping": ({"id": "n1", "boot": "b", "epoch": 3, "page_size": 4096, "controller": "n1", "lease_valid": True,
              "settings": {"transfer.rate_limit": 0}},
             api.PingReply("n1", "b", 3, 4096, "n1", True, {"transfer.rate_limit": 0})),
    "get_map": ({"version": 1, "epoch": 2, "caches": [], "members": []},
                api.MapPage({"version": 1, "epoch": 2, "caches": [], "members": []})),
    "put": (12, 12),
    "put_batch": ([3, 5], (3, 5)),
    "get": (None, None),
    "remove": (4, 4),
    "lookup": ([b"a", b"b"], [b"a", b"b"]),
    "range": ([["oslo", b"a"]], [("oslo", b"a")]),
    "moves": ([{"cache": "default", "partition": 1}], [{"cache": "default", "partition": 1}]),
    "moves_done": ([], []),
    "admission": ({"node": "n1"}, {"node": "n1"}),
    "metrics": ("# HELP x\n", "# HELP x\n"),
    "leave": (True, True),
    "replicate": ("applied", "applied"),
    "replicate_batch": ("resync", "resync"),
    "join_isr": ("ok", "ok"),
    "demand": ({"session": "s", "counter": 9, "count": 2, "bytes": 30}, api.Demanded("s", 9, 2, 30)),
    "fetch": ({"entries": [[b"k", b"v", 1], [b"j", None, 2]], "next": 2, "done": True},
              api.Fetched(((b"k", b"v", 1), (b"j", None, 2)), 2, True)),
    "demand_done": (False, False),
    "register": ({"counter": 17}, api.Registered(17)),
    "index_want": (True, True),
    "index_page": ({"header": {"counter": 17, "pages": 3}, "data": b"\x92\x90\x90"},
                   api.IndexPage({"counter": 17, "pages": 3}, b"\x92\x90\x90")),
    "handoff": (17, 17),
    "unfence": (True, True),
    "ack_latency": ({"p99_ms": 1.5, "samples": 20, "baseline_ms": None}, LatencyReport(0.0015, 20, None)),
    "holds": ({"node": "n2", "state": "OWNING", "counter": 5}, api.Holds("n2", "OWNING", 5)),
    "validate_fence": ({"token": "t", "counter": 5, "term": 4, "epoch": 6, "lease_s": 2.0, "isr": ["n1", "n2"],
                        "transfer": {"n1": "h:1", "n2": ""}},
                       api.Fence("t", 5, 4, 6, 2.0, ("n1", "n2"), {"n1": "h:1", "n2": ""})),
    "validate_unfence": (True, True),
    "debug_set": (18, 18),
}


def test_every_method_has_a_sample() -> None:
    assert set(SAMPLES) == set(api.METHODS) == set(REPLIES)
    for name, (req, _) in SAMPLES.items():
        assert req.METHOD == name and type(req) is api.METHODS[name].request


@pytest.mark.parametrize("name", sorted(api.METHODS))
def test_request_round_trips_with_the_same_argument_map(name: str) -> None:
    req, wire = SAMPLES[name]
    assert req.to_wire() == wire
    assert type(req).from_wire(wire) == req
    assert type(req).from_wire(req.to_wire()) == req
    # the decoded arguments are what the handler gets, by name
    assert set(req.kwargs()) == {f.name for f in dataclasses.fields(req)}


@pytest.mark.parametrize("name", sorted(api.METHODS))
def test_reply_decodes_and_encodes_back(name: str) -> None:
    req, _ = SAMPLES[name]
    raw, want = REPLIES[name]
    got = req.reply(raw)
    assert got == want
    # (msgpack sends a tuple as a list)
    assert msgpack.unpackb(msgpack.packb(api.encode_reply(got))) == msgpack.unpackb(msgpack.packb(raw))


def test_optional_arguments_stay_off_the_wire_as_callers_sent_them() -> None:
    assert api.Leave().to_wire() == {}
    assert api.Leave("n3").to_wire() == {"node": "n3"}
    assert api.Get("c", b"k", api.STALE).to_wire() == {"cache": "c", "key": b"k", "consistency": "stale"}
    assert "rid" not in api.Replicate("c", 0, b"k", b"v", 1, 0, "n1", 2).to_wire()
    assert api.Get.from_wire({"cache": "c", "key": "k"}) == api.Get("c", b"k")   # str keys are UTF-8
    assert api.MovesDone.from_wire({}) == api.MovesDone(0, api.MOVES_PAGE)


@pytest.mark.parametrize("name", sorted(api.METHODS))
def test_request_refuses_missing_unknown_and_mistyped_arguments(name: str) -> None:
    cls = api.METHODS[name].request
    _, wire = SAMPLES[name]
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    for field in required:
        args = {k: v for k, v in wire.items() if k != field}
        with pytest.raises(BadRequest, match=f"bad arguments for {name}: missing argument '{field}'"):
            cls.from_wire(args)
    with pytest.raises(BadRequest, match=f"bad arguments for {name}: unknown argument 'bogus'"):
        cls.from_wire({**wire, "bogus": 1})
    with pytest.raises(BadRequest, match="must be a map"):
        cls.from_wire([wire])
    for field in wire:
        if field in ("value", "lo", "hi") and name in ("lookup", "range"):
            continue                          # an index value: any type, the index judges it
        with pytest.raises(BadRequest, match=f"bad arguments for {name}: {field}"):
            cls.from_wire({**wire, field: {"not": "this"}})


def test_messages_say_what_is_wrong() -> None:
    with pytest.raises(BadRequest, match="bad arguments for put: key must be bytes or str, not int"):
        api.Put.from_wire({"cache": "default", "key": 12, "value": b"v"})
    with pytest.raises(BadRequest, match=r"p must be an integer 0\.\.2147483647, not -1"):
        api.Unfence.from_wire({"cache": "default", "p": -1})
    with pytest.raises(BadRequest, match="p must be an integer"):
        api.Unfence.from_wire({"cache": "default", "p": True})
    with pytest.raises(BadRequest, match=r"items\[1\] must be a \[key, value\] pair"):
        api.PutBatch.from_wire({"cache": "default", "key": b"a", "items": [[b"a", b"1"], [b"b"]]})
    with pytest.raises(BadRequest, match="items must be a list of 1..1024"):
        api.PutBatch.from_wire({"cache": "default", "key": b"a", "items": []})
    with pytest.raises(BadRequest, match="consistency must be one of"):
        api.Get.from_wire({"cache": "default", "key": b"a", "consistency": "eventual"})
    with pytest.raises(BadRequest, match="rid must be"):
        api.Put.from_wire({"cache": "default", "key": b"a", "value": b"v", "rid": ["x", 1, 2]})


def test_roles_and_claims_come_from_the_table() -> None:
    assert CLIENT_METHODS == {n for n, m in api.METHODS.items() if "client" in m.roles}
    assert NODE_CLAIMS == {"replicate": "primary", "replicate_batch": "primary", "register": "node",
                           "demand": "node", "join_isr": "node", "handoff": "to",
                           "index_want": "node"}
    for name, m in api.METHODS.items():
        _, wire = SAMPLES[name]
        assert api.decode_request(name, wire, "node") == SAMPLES[name][0]
        if name in CLIENT_METHODS:
            assert api.decode_request(name, wire, "client") == SAMPLES[name][0]
        else:
            # refused before the arguments are even looked at
            with pytest.raises(BadRequest, match=f"method '{name}' is for nodes only"):
                api.decode_request(name, {"garbage": object()}, "client")
    with pytest.raises(BadRequest, match="unknown method 'format_disk'"):
        api.decode_request("format_disk", {}, "node")


GARBAGE = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(api.METHODS)), raw=GARBAGE)
def test_garbage_reply_is_bad_reply_or_decodes(name: str, raw: object) -> None:
    req, _ = SAMPLES[name]
    try:
        req.reply(raw, "127.0.0.1:7001")
    except BadReply as e:
        assert e.code == "bad_reply" and e.outcome == "unknown"
        assert f"127.0.0.1:7001 answered {name} with a malformed reply" in str(e)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(api.METHODS)), args=st.dictionaries(st.text(max_size=10), GARBAGE, max_size=6))
def test_garbage_arguments_are_bad_request_or_decode(name: str, args: dict) -> None:
    cls = api.METHODS[name].request
    try:
        req = cls.from_wire(args)
    except BadRequest as e:
        assert str(e).startswith(f"bad arguments for {name}: ")
        return
    assert cls.from_wire(req.to_wire()) == req


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(sorted(api.METHODS)), field=st.integers(0, 8), bad=GARBAGE)
def test_one_mutated_argument_is_refused_or_still_valid(name: str, field: int, bad: object) -> None:
    cls = api.METHODS[name].request
    _, wire = SAMPLES[name]
    if not wire:
        return
    key = sorted(wire)[field % len(wire)]
    try:
        req = cls.from_wire({**wire, key: bad})
    except BadRequest as e:
        assert f"bad arguments for {name}: {key}" in str(e)
        return
    assert cls.from_wire(req.to_wire()) == req


class Recorder(api.Requester):
    def __init__(self, answer: object) -> None:
        self.answer = answer
        self.sent: list[tuple[str, str, float | None, dict]] = []

    def call(self, address, method, /, timeout=None, **args):
        self.sent.append((address, method, timeout, args))
        return self.answer


def test_request_sends_the_argument_map_and_decodes_the_reply() -> None:
    pool = Recorder({"counter": 17, "extra": "ignored"})
    got = pool.request("h:1", api.Register("default", 3, "n2", "h:2", 4), timeout=5.0)
    assert got.counter == 17
    assert pool.sent == [("h:1", "register", 5.0, {"cache": "default", "p": 3, "node": "n2", "address": "h:2",
                                                   "epoch": 4})]
    with pytest.raises(BadReply, match="h:1 answered register with a malformed reply: missing field 'counter'"):
        Recorder({"count": 17}).request("h:1", api.Register("default", 3, "n2", "h:2", 4))
    with pytest.raises(BadReply, match="counter must be an integer"):
        Recorder({"counter": "17"}).request("h:1", api.Register("default", 3, "n2", "h:2", 4))


def test_fetch_map_turns_a_garbage_map_into_bad_reply() -> None:
    pool = Recorder({"version": 1, "epoch": 2, "caches": [{"no": "name"}], "members": []})
    with pytest.raises(BadReply, match="h:1 answered get_map with a malformed map"):
        api.fetch_map(pool, "h:1")
    with pytest.raises(BadReply, match="get_map with a malformed reply"):
        api.fetch_map(Recorder(["not", "a", "map"]), "h:1")
