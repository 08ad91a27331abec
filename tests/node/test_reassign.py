"""Reassignment plans with real node processes and a real etcd, driven through
``ferry cluster reassign`` and ``ferry cluster drain``: a plan executed to completion
(bounded moves in flight) and verified; a throttled plan sped up live; a plan
cancelled half-way (old owners intact, every acknowledged key readable), then executed
again to completion; a drain; and each refusal (dead or unknown node, unknown cache,
partition out of range, malformed plan). Partitions hold about 1 MB each and the
throttles are a few hundred KB/s, so a move takes seconds: long enough to catch it
half-way."""
from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest
from click.testing import CliRunner

from node import Client
from node.cli import cluster

import nodeharness
from nodeharness import NodeProc, status, wait_settled, write_secret
from test_cluster import CONFIG, Writer, check_model, writes_during

VALUE = 4096
PER_PARTITION = 250           # 4 KiB values: about 1 MB per partition


class Cluster:
    """n1..n3 (8 partitions, backups 1) with about 1 MB in each partition."""

    def __init__(self, tmp_path: Any, nodes: list[NodeProc]) -> None:
        self.tmp = tmp_path
        self.secret = write_secret(str(tmp_path / "secret"))
        self.cfg = tmp_path / "node.toml"
        self.cfg.write_text(CONFIG)
        self.nodes = nodes
        for n in ("n1", "n2", "n3"):
            self.add(n)
        self.settled(3)
        self.cp = ",".join(nodeharness.control_plane())
        with Client([self.nodes[0].address], secret_file=self.secret, timeout=60) as c:
            c.put_many("default", [(f"bulk-{i}", self.bulk(i)) for i in range(8 * PER_PARTITION)])

    @staticmethod
    def bulk(i: int) -> str:
        # not one of the writer's cities: its model checks those index entries exactly
        return json.dumps({"city": "rome", "i": i, "pad": "x" * VALUE})

    def check(self, w: Writer, seeds: list[str] | None = None) -> None:
        """Every acknowledged write of ``w`` (paused meanwhile, if it runs), and every
        10th bulk entry, is readable."""
        seeds = seeds or [n.address for n in self.nodes if n.alive()]
        w.pause()
        try:
            check_model(w, seeds, self.secret)
        finally:
            w.resume()
        with Client(seeds, secret_file=self.secret) as cl:
            for i in range(0, 8 * PER_PARTITION, 10):
                assert cl.get("default", f"bulk-{i}") == self.bulk(i).encode(), i

    def add(self, node_id: str) -> NodeProc:
        n = NodeProc(str(self.tmp), node_id, self.secret, config=str(self.cfg)).start()
        self.nodes.append(n)
        return n

    def node(self, node_id: str) -> NodeProc:
        return next(n for n in self.nodes if n.id == node_id)

    def seed(self) -> str:
        return next(n.address for n in self.nodes if n.alive())

    def settled(self, n: int) -> dict[str, Any]:
        return wait_settled(self.seed(), self.secret, n, 1)

    def status(self) -> dict[str, Any]:
        return status(self.seed(), self.secret)

    def run(self, *args: str, code: int | None = 0) -> Any:
        """``ferry cluster ARGS --control-plane ...``; asserts the exit code."""
        r = CliRunner().invoke(cluster, [*args, "--control-plane", self.cp])
        if code is not None:
            assert r.exit_code == code, (args, r.exit_code, r.output, r.exception)
        return r

    def plan(self, name: str) -> dict[str, Any]:
        r = self.run("reassign", "status", name, "--secret-file", self.secret, "--json", "--sample", "0.5")
        return json.loads(r.stdout)["plans"][0]

    def wait_plan(self, name: str, until: Any, timeout: float = 90.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        doc: dict[str, Any] = {}
        while time.monotonic() < deadline:
            doc = self.plan(name)
            if until(doc):
                return doc
            time.sleep(0.3)
        raise AssertionError(f"plan {name}: {json.dumps(doc)[:3000]}")


@pytest.fixture
def c(tmp_path, nodes) -> Cluster:
    return Cluster(tmp_path, nodes)


def owners_now(doc: dict[str, Any]) -> dict[int, list[str]]:
    """partition -> [primary, other in-sync copies] (the record)."""
    return {p["partition"]: [p["primary"]] + sorted(n for n in p["in_sync"] if n != p["primary"])
            for p in doc["partitions"]}


def holders(doc: dict[str, Any], p: int) -> dict[str, str]:
    return next(x["states"] for x in doc["partitions"] if x["partition"] == p)


def write_plan(path: Any, moves: list[dict[str, Any]]) -> str:
    path.write_text(json.dumps({"version": 1, "moves": moves}))
    return str(path)


def other_than(owners: list[str]) -> str:
    return next(n for n in ("n1", "n2", "n3") if n not in owners)


# -- a plan, start to finish ------------------------------------------------------------------
def test_a_plan_runs_to_completion_one_move_at_a_time_and_verifies(c, tmp_path):
    before = owners_now(c.status())
    # three partitions each get the node that does not hold them, as primary
    picks = sorted(before)[:3]
    moves = [{"cache": "default", "partition": p, "from": before[p], "to": [other_than(before[p]), before[p][0]]}
             for p in picks]
    plan = write_plan(tmp_path / "three.json", moves)
    w = Writer([c.nodes[0].address], c.secret)
    w.start()
    try:
        writes_during(w, 30)
        r = c.run("reassign", "execute", plan, "--max-moves", "1", "--throttle", "400000")
        assert "plan three stored (3 move(s)" in r.output
        most = 0
        doc = c.plan("three")
        deadline = time.monotonic() + 120
        while doc["state"] == "running":
            assert time.monotonic() < deadline, doc
            flying = [mv for mv in doc["moves"] if mv["stage"] in ("moving", "in sync")]
            most = max(most, len(flying))
            for mv in flying:          # what the status says of a move in flight
                assert mv["waits_for"] and mv["started"] and mv["last_progress"], mv
            doc = c.plan("three")
        writes_during(w, 30)
    finally:
        w.finish()
    assert doc["state"] == "done" and doc["counts"]["done"] == 3, doc
    assert most == 1, "at most one of the plan's moves in flight (--max-moves 1)"
    assert all(mv["finished"] >= mv["started"] for mv in doc["moves"])
    r = c.run("reassign", "verify", "three")
    assert "every partition held by its target owners" in r.output
    after = c.settled(3)
    for p in before:
        want = [mv["to"] for mv in moves if mv["partition"] == p]
        got = owners_now(after)[p]
        assert got == ([want[0][0], want[0][1]] if want else before[p]), (p, before[p], got)
    c.check(w)
    # the throttle went back to what it was (unset before: 0, unlimited)
    r = c.run("settings", "get", "transfer.rate_limit", "--json")
    assert json.loads(r.stdout) == {"transfer.rate_limit": 0}
    # the text status of a finished plan
    r = c.run("reassign", "status", "three")
    assert "three done: 3/3 done" in r.output


def test_a_throttled_plan_speeds_up_when_the_throttle_is_raised_live(c, tmp_path):
    before = owners_now(c.status())
    moves = [{"cache": "default", "partition": p, "to": [other_than(before[p]), before[p][0]]} for p in (0, 1)]
    plan = write_plan(tmp_path / "slow.json", moves)
    t0 = time.monotonic()
    c.run("reassign", "execute", plan, "--throttle", "100000")     # 100 KB/s: ~20 s a partition file
    doc = c.wait_plan("slow", lambda d: all(mv["node_stage"] == "transfer" for mv in d["moves"]))
    assert doc["state"] == "running" and all(mv["bytes_total"] > 1_000_000 for mv in doc["moves"]), doc
    assert "throttle 100000 B/s" in c.run("reassign", "status", "slow").output
    time.sleep(max(0.0, 4.0 - (time.monotonic() - t0)))
    assert c.plan("slow")["counts"]["done"] == 0               # held back by the throttle
    t1 = time.monotonic()
    c.run("settings", "set", "transfer.rate_limit", "0")        # lifted live: no restart
    doc = c.wait_plan("slow", lambda d: d["state"] != "running", timeout=60)
    assert doc["state"] == "done" and time.monotonic() - t1 < 10, (time.monotonic() - t1, doc)
    c.run("reassign", "verify", "slow")
    # the operator changed the setting meanwhile: the plan's end leaves their value
    assert json.loads(c.run("settings", "get", "transfer.rate_limit", "--json").stdout) == \
        {"transfer.rate_limit": 0}


# -- cancel ---------------------------------------------------------------------------------
def test_a_plan_cancelled_half_way_keeps_the_old_owners_then_runs_again(c, tmp_path):
    before = owners_now(c.status())
    moves = [{"cache": "default", "partition": p, "from": before[p],
              "to": [other_than(before[p]), before[p][0]]} for p in range(4)]
    plan = write_plan(tmp_path / "half.json", moves)
    w = Writer([c.nodes[0].address], c.secret)
    w.start()
    try:
        writes_during(w, 20)
        c.run("reassign", "execute", plan, "--max-moves", "2", "--throttle", "150000")
        # half-way: two moves fetch their file (buffering the writes to their partitions)
        c.wait_plan("half", lambda d: sum(mv["node_stage"] == "transfer" for mv in d["moves"]) == 2)
        r = c.run("reassign", "cancel", "half")
        assert "plan half cancelled" in r.output and "move(s) stopped" in r.output, r.output
        doc = c.plan("half")
        assert doc["state"] == "cancelled" and doc["counts"]["cancelled"] >= 2, doc
        stopped = [mv["partition"] for mv in doc["moves"] if mv["stage"] == "cancelled"]
        writes_during(w, 30)
        # the old owners of every move not done hold their partition as before, and
        # the copies the cancelled moves had begun are gone
        deadline = time.monotonic() + 60
        while True:
            st = c.status()
            now = owners_now(st)
            ok = all(now[p] == before[p] and set(holders(st, p)) == set(before[p])
                     and set(holders(st, p).values()) == {"OWNING"} for p in stopped)
            if ok or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert ok, {p: (before[p], now[p], holders(st, p)) for p in stopped}
        r = c.run("reassign", "verify", "half", code=1)
        assert "not as planned" in r.output
        c.check(w)                          # nothing acknowledged lost
        # the same plan again: it runs to the end
        r = c.run("reassign", "execute", plan, "--wait", "--secret-file", c.secret, "--timeout", "120")
        assert "half done: 4/4 done" in r.output, r.output
        writes_during(w, 20)
    finally:
        w.finish()
    c.run("reassign", "verify", "half")
    after = owners_now(c.settled(3))
    assert all(after[mv["partition"]] == mv["to"] for mv in moves), after
    c.check(w)


# -- the controller fails mid-plan ---------------------------------------------------------------
@pytest.mark.slow
def test_a_new_controller_carries_on_a_plan_the_old_one_started(c, tmp_path):
    c.add("n4")
    before = owners_now(c.settled(4))
    ctl = c.status()["controller"]
    # two partitions that neither the controller holds nor will hold: they move while it dies
    picks = [p for p, o in before.items() if ctl not in o][:2]
    assert len(picks) == 2, (ctl, before)
    moves = [{"cache": "default", "partition": p, "from": before[p],
              "to": [next(n for n in ("n1", "n2", "n3", "n4") if n not in before[p] + [ctl]), before[p][0]]}
             for p in picks]
    plan = write_plan(tmp_path / "failover.json", moves)
    w = Writer([n.address for n in c.nodes], c.secret)
    w.start()
    try:
        writes_during(w, 20)
        c.run("reassign", "execute", plan, "--max-moves", "1", "--throttle", "100000")
        c.wait_plan("failover", lambda d: any(mv["node_stage"] == "transfer" for mv in d["moves"]))
        c.node(ctl).kill()                          # SIGKILL: its lease ends within 2 s
        deadline = time.monotonic() + 30
        while c.status()["controller"] in (ctl, None):
            assert time.monotonic() < deadline, "no new controller"
            time.sleep(0.3)
        c.run("settings", "set", "transfer.rate_limit", "0")
        doc = c.wait_plan("failover", lambda d: d["state"] != "running", timeout=90)
        assert doc["state"] == "done" and doc["counts"]["done"] == 2, doc
        writes_during(w, 20)
    finally:
        w.finish()
    c.run("reassign", "verify", "failover")
    # the second move (--max-moves 1: after the first was done) and both "done"s were the
    # new controller's; the old one had started only the first
    new = c.status()["controller"]
    log = open(c.node(new).log).read()
    assert f"plan failover: default/{picks[1]} " in log and "started" in log, c.node(new).tail()
    assert log.count("stage=reassign plan failover: default/") >= 3 and "plan failover done" in log
    assert f"plan failover: default/{picks[1]} " not in open(c.node(ctl).log).read()
    after = owners_now(c.settled(3))
    assert all(after[mv["partition"]] == mv["to"] for mv in moves), after
    c.check(w)


# -- drain --------------------------------------------------------------------------------------
def test_drain_moves_every_copy_and_primary_off_a_node(c):
    w = Writer([c.nodes[0].address], c.secret)
    w.start()
    try:
        writes_during(w, 20)
        r = c.run("drain", "n3", "--secret-file", c.secret, "--max-moves", "2", "--timeout", "120")
        assert "draining n3: plan drain-n3" in r.output and "n3 holds nothing" in r.output, r.output
        writes_during(w, 20)
    finally:
        w.finish()
    doc = c.status()
    assert not any("n3" in p["states"] or "n3" in p["in_sync"] for p in doc["partitions"]), doc
    c.run("reassign", "verify", "drain-n3")
    c.check(w, [c.nodes[0].address, c.nodes[1].address])
    # a second drain has nothing to do; the node can be stopped without moving anything
    r = c.run("drain", "n3", "--json")
    assert json.loads(r.stdout)["moves"] == 0
    assert c.node("n3").stop() == 0
    c.check(w, [c.nodes[0].address, c.nodes[1].address])


# -- refusals -----------------------------------------------------------------------------------
def test_plans_that_do_not_fit_the_cluster_are_refused_and_change_nothing(c, tmp_path, nodes):
    n4 = c.add("n4")
    c.settled(4)
    n4.kill()                               # its lease ends within 2 s: n4 is dead
    deadline = time.monotonic() + 20
    while any(n["id"] == "n4" for n in c.status()["nodes"]):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    before = owners_now(c.settled(3))
    cases = [
        ({"partition": 1, "to": ["n1", "n4"]}, "n4 is not a live member"),
        ({"partition": 1, "to": ["n1", "n9"]}, "n9 is not a live member"),
        ({"cache": "nope", "partition": 1, "to": ["n1", "n2"]}, "unknown cache 'nope'"),
        ({"partition": 8, "to": ["n1", "n2"]}, "partitions 0..7, not 8"),
        ({"partition": 1, "to": ["n1"]}, "must name 2 different nodes"),
    ]
    for i, (move, needle) in enumerate(cases):
        plan = write_plan(tmp_path / f"bad{i}.json", [{"cache": "default", "partition": 2, "to": ["n2", "n1"]},
                                                      {"cache": "default", **move}])
        r = c.run("reassign", "execute", plan, code=2)
        assert "plan refused: " in r.output and needle in r.output and "moves[1]" in r.output, r.output
    for raw, needle in [("{not json", "not valid JSON"), ('{"moves": [{"partition": "x"}]}', "partition must be"),
                        ('{"moves": []}', "at least one move"), ("[" * 50 + "]" * 50, "nested")]:
        (tmp_path / "junk.json").write_text(raw)
        r = c.run("reassign", "execute", str(tmp_path / "junk.json"), code=2)
        assert needle in r.output, r.output
    r = c.run("reassign", "generate", "--add", "n4", code=2)
    assert "n4 is not a live member" in r.output
    for verb in ("status", "verify", "cancel"):
        r = c.run("reassign", verb, "nosuch", code=2)
        assert "no plan nosuch" in r.output and "refused" not in r.output, r.output
    r = c.run("reassign", "status", "--json")
    assert json.loads(r.stdout)["plans"] == []           # nothing was stored
    time.sleep(1.0)
    assert owners_now(c.settled(3)) == before            # and nothing moved
    assert not os.path.exists(os.path.join(c.node("n1").data, "plans"))    # no plans folder any more
