"""Foreground protection (node/admission.py, node/acklatency.py): the AIMD controller fed
synthetic latencies, the latency window with a fake clock, the levers it sets, and the
settings that tune it. Deterministic: no threads, no sleeps."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import pytest

from node.acklatency import MIN_SAMPLES, LatencyReport, LatencyWindow
from node.admission import (AUTO_FACTOR, AUTO_MIN_S, FALLBACK_TARGET_S, REF_RECV_BPS,
                            REPLAY_MIN_RPS, REPLAY_OVER_INGEST, RESTART_IDLE_S, START_LOADED, Admission, Aimd,
                            max_moves, target_of, worst)
from node.cluster_map import ClusterMap
from node.config import NodeConfig, validate
from node.context import Events, MapHolder, MoveTable, Replication
from node.errors import ConfigError
from node.metrics import Metrics
from node.move import Move
from node.settings import parse
from transfer import Limits

CFG = NodeConfig(id="n1", data="/tmp/x")


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


# -- the controller ---------------------------------------------------------------------
def test_additive_increase_within_target_up_to_the_maximum():
    a = Aimd(1, 8, increase_per_s=4.0)
    a.level = 2.0
    a.update(0.5, 0.0)                 # the first update only sets the clock
    assert a.update(0.5, 0.25) == pytest.approx(3.0)
    assert a.update(1.0, 0.5) == pytest.approx(4.0)      # at the target is within it
    for i in range(10):
        a.update(0.9, 0.75 + i * 0.25)
    assert a.level == 8


def test_multiplicative_decrease_once_per_window():
    a = Aimd(1, 8, hold_s=0.5)
    a.update(0.5, 0.0)
    assert a.update(2.0, 0.1) == 4          # halves at once
    assert a.update(2.0, 0.2) == 4          # the same slow window: no second cut
    assert a.update(2.0, 0.6) == 2          # a new window still slow: halves again
    assert a.update(3.0, 1.2) == 1
    # below the minimum of moves only the rate falls, down to the floor (lo / 16)
    assert a.update(3.0, 1.8) == 0.5
    for i in range(10):
        a.update(3.0, 2.4 + i * 0.6)
    assert a.level == a.floor == pytest.approx(1 / 16)


def test_below_the_minimum_the_level_grows_by_a_factor_then_by_whole_moves():
    """A paced level (below min_moves) must not jump to full rate in one tick: it grows
    by e^(low_growth_per_s x dt) until it reaches min_moves, then additively."""
    a = Aimd(1, 8, increase_per_s=4.0, low_growth_per_s=1.0)
    a.level = 0.125
    a.update(0.5, 0.0)
    assert a.update(0.5, 0.5) == pytest.approx(0.125 * math.exp(0.5))
    t = 0.5
    while a.level < 1.0:
        t += 0.1
        a.update(0.5, t)
    assert t == pytest.approx(0.5 + 1.6, abs=0.15)     # ln(8) - 0.5 = 1.58 s
    assert a.level == 1.0                               # capped at lo, then whole moves
    assert a.update(0.5, t + 0.25) == pytest.approx(2.0)


def test_no_foreground_writes_means_full_speed():
    a = Aimd(1, 8, increase_per_s=4.0, quiet_s=1.0)
    a.update(5.0, 0.0)
    assert a.level == 4
    assert a.update(None, 0.25) == 5        # one window without writes: maybe stalled
    assert a.update(None, 1.0) == 8         # quiet for quiet_s: nothing to protect


def test_start_of_a_rebalance_is_one_paced_move_and_bounds_clamp():
    a = Aimd(1, 8)
    a.start()
    assert a.level == 0.25                  # START_LOADED x lo
    a.update(None, 50.0)                    # no writes seen: the maximum at once
    assert a.level == 8
    a.bounds(2, 3)
    assert (a.lo, a.hi, a.level) == (2, 3, 3)
    a.bounds(5, 3)                          # hi below lo: lo wins; a level below lo
    assert (a.lo, a.hi, a.level) == (5, 5, 3)   # paces the rate of lo moves
    a.level = 0.01
    a.bounds(1, 8)                          # the floor, not lo, bounds the level
    assert a.level == pytest.approx(1 / 16)


def test_converges_to_the_level_the_latency_allows():
    """A plant whose p99 grows with the level: 10 ms idle + 4 ms per running move, target
    30 ms (5 moves allowed). The controller settles around it, never below min."""
    a = Aimd(1, 16, increase_per_s=4.0, hold_s=0.5)
    levels = []
    t = 0.0
    for _ in range(400):                     # 40 s of 0.1 s ticks
        p99 = 0.010 + 0.004 * int(a.level)
        a.update(p99 / 0.030, t)
        levels.append(a.level)
        t += 0.1
    tail = levels[200:]
    assert min(tail) >= 1 and max(tail) <= 7      # a sawtooth: one level of overshoot
    assert 2.5 <= sum(tail) / len(tail) <= 5.5


# -- targets and the worst node --------------------------------------------------------
def test_target_is_explicit_or_derived_from_the_idle_baseline():
    r = LatencyReport(0.030, 50, 0.010)
    assert target_of(CFG, r) == pytest.approx(AUTO_FACTOR * 0.010)
    assert target_of(CFG, LatencyReport(0.030, 50, 0.001)) == AUTO_MIN_S
    assert target_of(CFG, LatencyReport(0.030, 50, None)) == FALLBACK_TARGET_S
    assert target_of(replace(CFG, latency_target_ms=20.0), r) == pytest.approx(0.020)


def test_worst_node_is_the_one_furthest_above_its_target():
    reports = {"n1": LatencyReport(0.030, 50, 0.010),     # 2.0x its target of 15 ms
               "n2": LatencyReport(0.040, 50, 0.040),     # 0.67x
               "n3": LatencyReport(None, 0, 0.010)}       # no writes: not judged
    s = worst(CFG, reports)
    assert s is not None and s.node == "n1" and s.ratio == pytest.approx(2.0)
    assert worst(CFG, {"n3": LatencyReport(None, 0, None)}) is None


def test_report_round_trips_and_refuses_garbage():
    r = LatencyReport(0.0123, 40, None)
    assert LatencyReport.from_wire(r.to_wire()) == r
    for bad in ("x", {"p99_ms": "1"}, {"samples": -1}, {"baseline_ms": True}):
        with pytest.raises(ValueError):
            LatencyReport.from_wire(bad)


# -- the window -------------------------------------------------------------------------
def test_window_p99_forgets_old_samples():
    clock = Clock()
    w = LatencyWindow(window_s=0.5, clock=clock)
    assert w.p99() == (None, 0)
    for i in range(MIN_SAMPLES - 1):
        w.add(0.001)
    w.add(0.002)
    assert w.p99() == (0.002, MIN_SAMPLES)          # few samples: the slowest one
    for i in range(91):
        w.add(0.001)
    w.add(0.5)                               # 1 in 100: the p99 by nearest rank
    p99, n = w.p99()
    assert n == 100 and p99 == 0.5
    clock.t += 0.6
    assert w.p99() == (None, 0)


def test_baseline_moves_only_while_idle_and_once_per_window():
    clock = Clock()
    w = LatencyWindow(window_s=0.5, clock=clock)
    for _ in range(MIN_SAMPLES - 1):
        w.add(0.010)
    assert w.report(busy=False).baseline_s is None     # too few writes for a baseline
    for _ in range(20):
        w.add(0.010)
    assert w.report(busy=True).baseline_s is None
    assert w.report(busy=False).baseline_s == pytest.approx(0.010)
    for _ in range(200):
        w.add(0.100)
    assert w.report(busy=False).baseline_s == pytest.approx(0.010)   # same window
    clock.t += 0.51
    for _ in range(20):
        w.add(0.020)
    assert w.report(busy=False).baseline_s == pytest.approx(0.010 + 0.2 * 0.010)


# -- the levers -------------------------------------------------------------------------
@dataclass
class FakeCtx:
    """What Admission reads of the node's context (no map or pool: no peers here)."""
    cfg: NodeConfig
    id: str = "n1"
    metrics: Metrics = field(default_factory=Metrics)
    moves: MoveTable = field(default_factory=MoveTable)
    repl: Replication = field(default_factory=Replication)
    events: Events = field(default_factory=Events)
    map: MapHolder = field(default_factory=lambda: MapHolder(ClusterMap({c.name: c for c in CFG.caches})))
    wakes: int = 0

    def wake(self) -> None:
        self.wakes += 1


def admission(cfg: NodeConfig = CFG) -> tuple[Admission, FakeCtx, Limits]:
    ctx = FakeCtx(cfg)
    lim = Limits(cfg.transfer_concurrency, None)
    return Admission(ctx, lim, clock=Clock()), ctx, lim   # type: ignore[arg-type]


def test_levers_follow_the_level_and_replay_never_drops_below_its_ingest():
    adm, ctx, lim = admission()
    assert max_moves(CFG) == 8 and adm.move_limit() == 8
    assert adm.replay_limit() == 0 and adm.transfer_limits() == (4, None)
    adm.peak_recv_bps = 400e6
    adm.peak_replay_rps = 10_000
    adm.aimd.level = 2.0
    slots, rate = adm.transfer_limits()
    # two moves of four receive slots: half the peak, whatever max_moves (8) is
    assert slots == 2 and rate == pytest.approx(200e6)
    assert adm.move_limit() == 2
    assert adm.replay_limit() == max(REPLAY_MIN_RPS, 2500)
    mv = Move("default", 3, mode="files")
    mv.fig.ingest_rate = 3000.0                 # writes into p faster than 2,500/s
    ctx.moves.running[("default", 3)] = mv
    assert adm.replay_limit() == int(REPLAY_OVER_INGEST * 3000)
    adm._apply()
    assert lim.slots.limit == 2 and lim.bucket.rate == pytest.approx(200e6)
    adm.aimd.level = 5.0                         # past the receive slots: not paced
    assert adm.transfer_limits() == (4, None)


def test_protection_off_restores_the_configured_limits():
    adm, ctx, lim = admission()
    adm.aimd.level = 1.0
    off = replace(CFG, rebalance_protect=False, replay_rate_limit=700, transfer_rate_limit=50_000_000)
    ctx.cfg = off
    adm.config_changed(off)
    assert adm.move_limit() == 8 and adm.replay_limit() == 700
    assert adm.transfer_limits() == (4, 50e6)
    assert lim.slots.limit == 4 and lim.bucket.rate == 50e6


def test_a_rebalance_starts_paced_and_the_first_tick_decides():
    adm, ctx, lim = admission()
    clock = adm.clock
    assert isinstance(clock, Clock)
    for _ in range(50):
        ctx.metrics.acks.add(0.002)
    adm.tick()                               # writes seen, within the fallback target
    assert adm.signal is not None and adm.move_limit() == 8
    assert adm.admit(0) and adm.move_limit() == 1
    assert not adm.admit(1)
    slots, rate = adm.transfer_limits()      # one move, paced: no rate measured yet
    assert slots == 1 and rate == pytest.approx(REF_RECV_BPS * START_LOADED / 4)
    ctx.moves.running[("default", 1)] = Move("default", 1, mode="files")
    adm.started()
    adm.tick()                               # within target: grows from there, not at once
    assert adm.aimd.level == pytest.approx(START_LOADED)
    assert lim.slots.limit == 1 and lim.bucket.rate == pytest.approx(rate)
    clock.t += 0.5
    adm.tick()
    assert adm.aimd.level == pytest.approx(START_LOADED * math.exp(0.5))
    # the peak receive rate is learnt only while no limit is in force
    assert adm.peak_recv_bps == 0


def test_moves_one_after_another_keep_the_level_and_an_idle_pause_starts_over():
    """A series of short moves that run one at a time is one rebalance: the next move
    keeps the level the latency allowed, so the level can grow past one move. After a
    pause longer than RESTART_IDLE_S a move starts paced again."""
    adm, ctx, lim = admission()
    clock = adm.clock
    assert isinstance(clock, Clock)
    for _ in range(50):
        ctx.metrics.acks.add(0.002)          # writes, within target
    assert adm.admit(0) and adm.move_limit() == 1
    key = ("default", 1)
    grown = []
    for step in range(30):                   # 30 moves of 0.1 s each, back to back
        ctx.moves.running[key] = Move("default", 1, mode="files")
        adm.started()
        adm.tick()
        clock.t += 0.1
        adm.tick()
        del ctx.moves.running[key]           # the move ends ...
        clock.t += 0.01
        assert adm.admit(0)                  # ... and the next one starts at once
        grown.append(adm.move_limit())
    assert grown[-1] >= 2, grown             # more than one move at once by now
    assert grown == sorted(grown), grown     # never back to one paced move
    clock.t += RESTART_IDLE_S + 0.2          # a pause: a new rebalance
    assert adm.admit(0) and adm.move_limit() == 1
    assert adm.aimd.level == pytest.approx(START_LOADED)


def test_an_idle_rebalance_goes_to_full_speed_at_its_first_tick():
    adm, ctx, lim = admission()
    assert adm.admit(0) and adm.move_limit() == 1
    ctx.moves.running[("default", 1)] = Move("default", 1, mode="files")
    adm.tick()                               # no writes anywhere: nothing to protect
    assert adm.move_limit() == 8 and adm.transfer_limits() == (4, None)
    assert lim.slots.limit == 4 and lim.bucket.rate is None


def test_ticks_cut_the_limit_when_writes_slow_down():
    adm, ctx, _ = admission(replace(CFG, latency_target_ms=10.0))
    clock = adm.clock
    assert isinstance(clock, Clock)
    ctx.moves.running[("default", 1)] = Move("default", 1, mode="files")
    for _ in range(50):
        ctx.metrics.acks.add(0.040)
    adm.tick()
    assert adm.move_limit() == 4
    s = adm.status()
    assert s["latency_ms"] == pytest.approx(40.0) and s["target_ms"] == 10.0 and s["move_limit"] == 4
    text = ctx.metrics.render()
    assert "ferry_node_rebalance_move_limit 4.0" in text
    assert "ferry_node_rebalance_level 4.0" in text
    assert "ferry_node_rebalance_latency_seconds 0.04" in text


# -- settings ---------------------------------------------------------------------------
def test_settings_parse_and_validate():
    assert parse("rebalance.protect", "off") is False
    assert parse("rebalance.protect", "ON") is True
    assert parse("rebalance.latency_target_ms", "25") == 25.0
    assert parse("rebalance.max_moves", "3") == 3
    for name, raw, words in (("rebalance.protect", "maybe", "not on/off"),
                             ("rebalance.latency_target_ms", "-1", "latency_target_ms"),
                             ("rebalance.min_moves", "0", "rebalance.min_moves must be"),
                             ("rebalance.max_moves", "1.5", "not (an integer|a whole number)")):
        with pytest.raises(ConfigError, match=words):
            parse(name, raw)
    with pytest.raises(ConfigError, match="at least rebalance.min_moves"):
        validate(replace(CFG, rebalance_min_moves=4, rebalance_max_moves=2))


def test_status_shows_the_limit_and_the_latency_it_reacts_to():
    from node.status import render
    doc = {"topology_version": 1, "epoch": 1, "controller": "n1", "nodes": [], "partitions": [],
           "moves": [], "lost": [],
           "admission": [{"node": "n4", "protect": True, "level": 2.0, "move_limit": 2, "max_moves": 8,
                          "transfers": 2, "transfer_rate_limit": 120_000_000, "replay_rate_limit": 5000,
                          "latency_ms": 41.5, "target_ms": 21.0, "latency_node": "n2",
                          "own_p99_ms": None, "baseline_ms": None},
                         {"node": "n1", "protect": False, "level": 8, "move_limit": 8, "max_moves": 8,
                          "transfers": 4, "transfer_rate_limit": 0, "replay_rate_limit": 0,
                          "latency_ms": None, "target_ms": None, "latency_node": None,
                          "own_p99_ms": 9.1, "baseline_ms": 8.0}]}
    text = render(doc, color=False, width=160)
    assert "Foreground protection" in text
    n4 = next(line.split() for line in text.splitlines() if line.split()[:1] == ["n4"])
    assert n4 == ["n4", "on", "2/8", "2", "120", "5000", "41.5", "(n2)", "21.0", "-"]
    n1 = next(line.split() for line in text.splitlines() if line.split()[:1] == ["n1"])
    assert n1 == ["n1", "off", "8/8", "4", "-", "-", "-", "-", "8.0"]
