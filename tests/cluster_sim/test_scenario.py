"""Scenarios load from built-ins, TOML and JSON; bad input is refused naming the field;
the workload is a function of the seed; the model says what a key may hold."""
from __future__ import annotations

import json

import pytest

from cluster_sim import BUILTINS, CrashPlan, Model, ScenarioError, generate, load_scenario
from cluster_sim.workload import Op

TOML = """
name = "mine"
nodes = ["a", "b"]
roles = {supplier = "a", demander = "c"}
[[caches]]
partitions = 4
backups = 1
[workload]
ops = 50
distribution = "zipf"
value_size = [10, 20]
[[events]]
at = 10
action = "join"
node = "c"
[crash]
point = "demander.mid_receive"
side = "demander"
nth = 2
"""


def test_builtins_load_and_have_the_required_names() -> None:
    for name in ("join", "leave", "kill-restart", "join-under-load", "file-move"):
        s = load_scenario(name)
        assert s.name == name and s.roles
    assert set(BUILTINS) >= {"join", "leave", "kill-restart", "join-under-load", "file-move"}


def test_toml_and_json_files(tmp_path) -> None:
    p = tmp_path / "s.toml"
    p.write_text(TOML)
    s = load_scenario(str(p))
    assert s.nodes == ("a", "b") and s.all_nodes() == ["a", "b", "c"]
    assert s.caches[0].partitions == 4 and s.workload.value_size == (10, 20)
    assert s.crash == CrashPlan("demander.mid_receive", "demander", 2) and s.target() == "c"
    assert s.crash.spec(7) == "demander.mid_receive:2"
    j = tmp_path / "s.json"
    j.write_text(json.dumps({"name": "j", "driver": "file-move", "nodes": ["supplier"],
                             "roles": {"supplier": "supplier"}}))
    assert load_scenario(str(j)).driver == "file-move"


@pytest.mark.parametrize("edit, match", [
    (lambda t: t.replace('ops = 50', 'ops = 50\nbogus = 1'), "unknown key.*bogus"),
    (lambda t: t.replace('"demander.mid_receive"', '"demander.nowhere"'), "crash point .*unknown"),
    (lambda t: t.replace('side = "demander"', 'side = "fourth"'), "crash side"),
    (lambda t: t.replace('"zipf"', '"gauss"'), "distribution"),
    (lambda t: t.replace('action = "join"', 'action = "explode"'), "event action"),
    (lambda t: t.replace('nth = 2', 'nth = 0'), "nth must be >= 1"),
    (lambda t: t.replace('demander = "c"', 'demander = "zz"'), "not a node"),
    (lambda t: t.replace('name = "mine"', 'name = "mine"\nnodes = ['), "cannot parse"),
])
def test_bad_scenarios_are_refused_with_the_field(tmp_path, edit, match) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(edit(TOML))
    with pytest.raises(ScenarioError, match=match):
        load_scenario(str(p))


def test_unknown_name_lists_builtins() -> None:
    with pytest.raises(ScenarioError, match="built-ins: .*file-move"):
        load_scenario("no-such-scenario")


def test_crash_side_the_scenario_lacks() -> None:
    s = load_scenario("file-move").with_crash(CrashPlan("wal.before_sync", side="third"))
    with pytest.raises(ScenarioError, match="no 'third' process"):
        s.target()


def test_workload_is_a_function_of_the_seed() -> None:
    spec = load_scenario("join-under-load").workload
    a, b, c = generate(spec, 5), generate(spec, 5), generate(spec, 6)
    assert a == b and a != c
    assert len(a) == spec.writers and all(len(w) == spec.ops for w in a)
    keys = [{op.key for op in w} for w in a]
    assert not keys[0] & keys[1]                       # writers own disjoint keys
    removes = [op for w in a for op in w if op.value is None]
    assert removes                                     # the workload removes keys too
    for w in a:                                        # a remove only follows a put
        live: set[bytes] = set()
        for op in w:
            if op.value is None:
                assert op.key in live
                live.discard(op.key)
            else:
                live.add(op.key)


def test_model_acknowledged_and_unsure() -> None:
    m = Model()
    m.ack(Op(0, 0, b"k", b"v1"))
    assert m.check(b"k", b"v1") is None
    assert "lost" in m.check(b"k", None)
    m.unsure(Op(0, 1, b"k", b"v2"))                    # in flight at a crash
    assert m.check(b"k", b"v1") is None and m.check(b"k", b"v2") is None
    assert m.check(b"k", b"v3") is not None
    m.ack(Op(0, 2, b"k", None))                        # acknowledged remove settles doubts
    assert m.check(b"k", None) is None
    assert "came back" in m.check(b"k", b"v2")


def test_event_max_wait_is_loaded_and_checked() -> None:
    from cluster_sim.scenario import from_dict
    base = {"name": "x", "nodes": ["n1", "n2"]}
    s = from_dict(base | {"events": [{"at": 5, "action": "kill", "node": "n2"},
                                     {"at": 9, "action": "restart", "node": "n2", "max_wait": 2.5}]})
    assert s.events[1].max_wait == 2.5 and s.events[0].max_wait == 0.0
    with pytest.raises(ScenarioError, match="max_wait"):
        from_dict(base | {"events": [{"at": 5, "action": "kill", "node": "n2", "max_wait": -1}]})
