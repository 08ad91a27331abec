"""Scenarios load from built-ins, TOML and JSON; bad input is refused naming the field;
the workload is a function of the seed; the model says what a key may hold."""
from __future__ import annotations

import json

import pytest

from cluster_sim import BUILTINS, CrashPlan, Model, ScenarioError, generate, load_scenario
from cluster_sim.workload import Op, Receipt

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
    names = ("join", "leave", "kill-restart", "join-under-load", "slow-join", "join-stream-index",
             "pair-catchup")
    for name in names:
        s = load_scenario(name)
        assert s.name == name and s.roles and s.driver == "cluster"
    assert set(BUILTINS) >= set(names)
    # slow-join: one node holds everything, so it supplies every move, slowly
    slow = load_scenario("slow-join")
    assert slow.nodes == ("n1",) and slow.roles["supplier"] == "n1" and slow.transfer_rate > 0
    assert slow.workload.preload > 0 and slow.workload.rate > 0
    assert load_scenario("join-stream-index").stream_index and not load_scenario("join").stream_index
    # pair-catchup: n1 is the only other copy of n2's partitions, so it supplies every delta
    pair = load_scenario("pair-catchup")
    assert pair.nodes == ("n1", "n2") and pair.roles == {"supplier": "n1", "demander": "n2"}


def test_toml_and_json_files(tmp_path) -> None:
    p = tmp_path / "s.toml"
    p.write_text(TOML)
    s = load_scenario(str(p))
    assert s.nodes == ("a", "b") and s.all_nodes() == ["a", "b", "c"]
    assert s.caches[0].partitions == 4 and s.workload.value_size == (10, 20)
    assert s.crash == CrashPlan("demander.mid_receive", "demander", 2) and s.target() == "c"
    assert s.crash.spec(7) == "demander.mid_receive:2"
    j = tmp_path / "s.json"
    j.write_text(json.dumps({"name": "j", "nodes": ["a"], "roles": {"supplier": "a"},
                             "stream_index": True}))
    assert load_scenario(str(j)).stream_index is True


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
    with pytest.raises(ScenarioError, match="built-ins: .*slow-join"):
        load_scenario("no-such-scenario")


def test_crash_side_the_scenario_lacks() -> None:
    s = load_scenario("slow-join").with_crash(CrashPlan("wal.before_sync", side="third"))
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


def test_partition_and_etcd_events_are_loaded_and_checked() -> None:
    from cluster_sim.scenario import from_dict
    base = {"name": "x", "nodes": ["n1", "n2", "n3"], "proxy": True}
    s = from_dict(base | {"control_plane_members": 3, "events": [
        {"at": 5, "action": "isolate", "node": "@controller"},
        {"at": 6, "action": "heal", "min_wait": 10},
        {"at": 7, "action": "flap", "node": "n3", "duration_s": 4, "period_s": 0.5},
        {"at": 8, "action": "cut-control", "node": "n2"},
        {"at": 9, "action": "kill-etcd", "node": "@leader"},
        {"at": 9, "action": "restart-etcd", "node": "etcd3"},
        {"at": 9, "action": "kill-etcd"}]})
    assert s.events[1].node == "" and s.events[1].min_wait == 10
    assert s.all_nodes() == ["n1", "n2", "n3"]          # placeholders are not processes
    assert s.control_faults() and s.budget() > s.settle_timeout
    refused = [
        ({"action": "flap", "node": "n3"}, "duration_s > 0"),
        ({"action": "isolate"}, "needs a node"),
        ({"action": "kill-etcd", "node": "etcd4"}, "etcd member must be one of etcd1, etcd2, etcd3"),
        ({"action": "cut", "node": "@leader"}, "names an etcd member"),
        ({"action": "join", "node": "@controller"}, "names a node for a cut"),
        ({"action": "heal", "node": "@somebody"}, "is not @controller"),
        ({"action": "heal", "min_wait": -1}, "must be >= 0"),
    ]
    for ev, match in refused:
        with pytest.raises(ScenarioError, match=match):
            from_dict(base | {"control_plane_members": 3, "events": [{"at": 1} | ev]})
    with pytest.raises(ScenarioError, match="needs proxy = true"):
        from_dict({"name": "x", "nodes": ["n1"], "events": [{"at": 1, "action": "isolate", "node": "n1"}]})
    with pytest.raises(ScenarioError, match="driver 'file-move' is not one of cluster"):
        from_dict({"name": "x", "driver": "file-move", "nodes": ["supplier"]})
    with pytest.raises(ScenarioError, match="control_plane_members"):
        from_dict(base | {"control_plane_members": 0})
    assert from_dict(base | {"time_budget": 42.0}).budget() == 42.0


def test_fault_builtins_name_their_faults() -> None:
    from cluster_sim.builtins import FAULT_SCENARIOS
    for name in FAULT_SCENARIOS:
        s = load_scenario(name)
        assert s.events and s.budget() < 600
    assert load_scenario("etcd-member-loss").control_plane_members == 3
    assert {e.action for e in load_scenario("control-plane-outage").events} == {"kill-etcd", "restart-etcd"}
    assert load_scenario("long-cut").events[1].min_wait >= 5 * 2.0       # 5 lease TTLs


def test_model_keeps_the_counters_of_acknowledged_writes() -> None:
    from cluster_sim.invariants import counter_conflicts
    from node.assignment import partition_of
    m = Model()
    m.ack(Op(0, 0, b"a", b"1"), Receipt(7, "n1", "n2"))
    m.ack(Op(0, 1, b"a", b"2"), Receipt(8, "n1", "n2"))
    assert counter_conflicts(m, 8) == []
    # another key of the same partition acknowledged at counter 8: two primaries
    other = next(b"k%d" % i for i in range(1000) if partition_of(b"k%d" % i, 8) == partition_of(b"a", 8))
    m.ack(Op(1, 0, other, b"x"), Receipt(8, "n3", "n3"))
    bad = counter_conflicts(m, 8)
    assert len(bad) == 1 and "counter 8" in bad[0] and "acknowledged by n3, routed by n3" in bad[0]
    m.ack(Op(1, 1, b"b", b"y"))                        # no receipt, no counter: not kept
    assert len(m.acks) == 3


def test_initial_members_reach_every_node_started_first(tmp_path) -> None:
    """A scenario with initial_members starts its first nodes as the cluster's initial
    members (each creates its share: nothing moves before the workload)."""
    from cluster_sim.drivers.cluster import ClusterDriver
    from cluster_sim.scenario import from_dict
    s = from_dict({"name": "big", "nodes": ["n1", "n2", "n3"], "initial_members": True,
                   "caches": [{"name": "default", "partitions": 4096, "backups": 1}]})
    assert s.initial_members and s.caches[0].partitions == 4096
    assert from_dict({"name": "small"}).initial_members is False
    d = ClusterDriver.__new__(ClusterDriver)
    d.scenario, d.procs, d.proxies, d.config, d.secret_file, d.dir = s, {}, {}, "c.toml", "secret", str(tmp_path)
    d.ports = {"n1": 1}
    d.trace, d.crash_for, d.prefix = False, (lambda n: None), (lambda n: "")
    d.data_dir = lambda n: str(tmp_path / n)
    d.host = lambda n: "127.0.0.1"
    d.control_plane_for = lambda n: ["http://127.0.0.1:2379"]
    d.net = None
    argv = d._proc("n1").argv
    assert argv[argv.index("--initial-members") + 1] == "n1,n2,n3"


def test_node_toml_carries_the_scenarios_node_settings(tmp_path) -> None:
    """What a scenario sets for every node reaches the node's own config loader."""
    from cluster_sim.drivers.cluster import node_toml
    from node.config import load as load_node_config
    for name, rate, stream in (("join", 0, False), ("slow-join", 256 << 10, False),
                               ("join-stream-index", 0, True)):
        s = load_scenario(name)
        path = tmp_path / f"{name}.toml"
        path.write_text(node_toml(s))
        cfg = load_node_config(str(path), id="n1", data=str(tmp_path / "d"), listen="127.0.0.1:1",
                               control_plane="http://127.0.0.1:2379")
        assert (cfg.transfer_rate_limit, cfg.stream_index) == (rate, stream), name
        assert cfg.caches[0].partitions == s.caches[0].partitions and cfg.checkpoint_interval_s == 1.0
