"""Foreground protection: the rebalance yields when the writes of the nodes it touches
slow down (docs/rebalancing.md, "Foreground protection").

An AIMD controller (:class:`Aimd`, TCP's congestion window applied to moves) keeps a
*level* between LOW_FRACTION x ``rebalance.min_moves`` and ``rebalance.max_moves``.
Moves and transfer slots never go below ``rebalance.min_moves``; below it only the
receive rate keeps falling (a single move's bytes are paced). Every TICK_S
while moves run, :class:`Admission` reads the acknowledgement latency
(:mod:`node.acklatency`) of this node and of every node its running moves touch (the
primaries that replicate to the MOVING copies and the suppliers), and compares the
worst windowed p99 with that node's target: ``rebalance.latency_target_ms``, or by
default AUTO_FACTOR x the node's idle baseline. Within target the level grows by
INCREASE_PER_S per second (below ``min_moves``: by a factor e^(LOW_GROWTH_PER_S x
seconds), so a paced level does not jump to full rate in one tick); above it, it halves
(at most once per latency window, so one slow window is not punished twice).

A rebalance starts at START_LOADED x ``min_moves`` (one move, about REF_RECV_BPS / 16
with the defaults: a quarter of one receive slot's share), and the admission thread ticks at once: it asks the nodes the first
move touches for their latency, and with no foreground writes anywhere lifts the level
to the maximum within milliseconds; under writes the level grows from there only while
the latency stays within target. (Measured, docs/benchmarks.md, `bench/rebalance_fg.py`, 8
writers on 2 cores: starting at half speed takes 2.9-3.6x the idle p99
during the join; a receive paced to 40 MB/s 1.7-1.8x.)

What the level sets, and why those levers (a 2-core machine, docs/benchmarks.md):

- moves started at once (``admit``): each move's install scan, index rebuild and
  replay are CPU in this process, which the writers' primaries and backups need;
- transfers received at once and their byte rate (``recv_limits``): the receive's
  disk writes, fsyncs and page checks compete with the write path's WAL fsyncs. A
  messages-mode fetch holds a receive slot and takes its entries' bytes from the same
  rate, so both modes are paced by the same measure (bytes received per second) and
  the cheaper path per byte earns the higher level;
- the temp-WAL replay rate (``replay_limit``), but never below REPLAY_OVER_INGEST x
  the partition's ingest rate nor REPLAY_MIN_RPS: a replay slower than its writes
  would never converge, and a slow replay *costs* writes (backpressure holds each
  acknowledgement of that partition 3 / replay rate per record while it runs).

With no write anywhere for QUIET_S there is nothing to protect and the level is the
maximum: an idle cluster rebalances at full speed.
Move threads also run at a lower CPU priority (MOVE_NICE) while protection is on, so
the scheduler serves the write path first when a core is contended.
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

from transfer import Limits

from .acklatency import WINDOW_S, LatencyReport
from .config import NodeConfig
from .context import NodeContext
from .errors import NodeError
from .metrics import Metrics
from .rpcapi import AckLatency

log = logging.getLogger("ferry.node.admission")

TICK_S = 0.1                 # while moves run: several decisions per latency window
IDLE_TICK_S = WINDOW_S       # otherwise only the baseline and the own window move
INCREASE_PER_S = 4.0         # moves per second of additive increase
DECREASE = 0.5               # multiplicative decrease
QUIET_S = 2 * WINDOW_S       # this long without a write anywhere: full speed
START_LOADED = 0.25          # a rebalance starts at this x min_moves (one move, paced)
# A move that starts this soon after the last one ran belongs to the same rebalance: it
# keeps the level the latency allowed (TCP restarts slow start only after an idle
# period, RFC 2861): were each move of a one-at-a-time series to start over at
# START_LOADED, a level below 2 could never grow past one move.
RESTART_IDLE_S = WINDOW_S
LOW_FRACTION = 1 / 16        # the level's floor, x min_moves (only the rate goes that low)
LOW_GROWTH_PER_S = 1.0       # below min_moves the level grows by e^(this x seconds)
REF_RECV_BPS = 1 << 30       # receive rate the level is a fraction of, until one is measured
AUTO_FACTOR = 1.5            # default target: 1.5 x the idle p99 ...
AUTO_MIN_S = 0.005           # ... but at least 5 ms (a sub-ms idle p99 is noise-bound)
FALLBACK_TARGET_S = 0.050    # a node with no idle baseline yet
REPLAY_OVER_INGEST = 5.0     # the replay's floor, in multiples of its ingest rate
REPLAY_MIN_RPS = 2000        # ... and in records/s
REPLAY_REF_RPS = 20000       # replay rate assumed until one is measured
MIN_RATE_BPS = 4 << 20       # the transfer rate never drops below 4 MiB/s
MOVE_NICE = 10               # CPU priority of move threads while protection is on
POLL_TIMEOUT_S = 0.5
# a peer's report is asked again only when the one held is older than this: a tick
# woken by each move's start (``started``) would otherwise ask every peer again,
# several times per TICK_S while moves start fast; a report is a window of WINDOW_S
REPORT_FRESH_S = TICK_S / 2
MAX_PEERS = 16               # nodes asked per tick (primaries and suppliers of the moves)


class Aimd:
    """The level: additive increase while the latency is within target, multiplicative
    decrease above it. ``ratio`` is latency / target; None means no foreground writes.
    Deterministic: time comes in as ``now``."""

    def __init__(self, lo: float, hi: float, *, increase_per_s: float = INCREASE_PER_S,
                 decrease: float = DECREASE, hold_s: float = WINDOW_S, quiet_s: float = QUIET_S,
                 low_fraction: float = LOW_FRACTION, low_growth_per_s: float = LOW_GROWTH_PER_S) -> None:
        self.lo, self.hi = lo, hi
        self.low_fraction, self.low_growth_per_s = low_fraction, low_growth_per_s
        self.level = hi
        self.increase_per_s, self.decrease, self.hold_s = increase_per_s, decrease, hold_s
        self._last: float | None = None
        self._last_decrease = float("-inf")
        self._last_signal = float("-inf")
        self.quiet_s = quiet_s

    @property
    def floor(self) -> float:
        """The lowest level: below ``lo`` only the rate falls (see the module doc)."""
        return self.lo * self.low_fraction

    def bounds(self, lo: float, hi: float) -> None:
        self.lo, self.hi = lo, max(lo, hi)
        self.level = min(self.hi, max(self.floor, self.level))

    @property
    def moves(self) -> int:
        """Moves (and transfer slots) at this level: whole ones, never below ``lo``."""
        return max(1, int(self.lo), int(self.level))

    def _grow(self, dt: float) -> None:
        if self.level < self.lo:       # paced: grow by a factor, not by whole moves
            self.level = min(self.lo, self.level * math.exp(self.low_growth_per_s * dt))
        else:
            self.level = min(self.hi, self.level + self.increase_per_s * dt)

    def update(self, ratio: float | None, now: float) -> float:
        dt = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        if ratio is not None:
            self._last_signal = now
        if ratio is None and now - self._last_signal >= self.quiet_s:
            self.level = self.hi
        elif ratio is None:
            # a window without writes may be writes stalled, not gone: grow as if
            # within target until it has been quiet for quiet_s
            self._grow(dt)
        elif ratio > 1.0:
            # the window that showed it still holds the slow samples for hold_s
            if now - self._last_decrease >= self.hold_s:
                self.level = max(self.floor, self.level * self.decrease)
                self._last_decrease = now
        else:
            self._grow(dt)
        return self.level

    def start(self) -> None:
        """A rebalance begins: one paced move (START_LOADED x ``lo``), TCP's slow start.
        The next update decides from there (no writes: the maximum at once); the
        time until it does not count as growth."""
        self.level = min(self.level, max(self.floor, self.lo * START_LOADED))
        self._last = None


@dataclass(frozen=True)
class Signal:
    """The latency the controller reacted to: the worst node's p99 against its target."""
    node: str
    p99_s: float
    target_s: float

    @property
    def ratio(self) -> float:
        return self.p99_s / self.target_s


def target_of(cfg: NodeConfig, r: LatencyReport) -> float:
    if cfg.latency_target_ms > 0:
        return cfg.latency_target_ms / 1e3
    if r.baseline_s is None:
        return FALLBACK_TARGET_S
    return max(AUTO_FACTOR * r.baseline_s, AUTO_MIN_S)


def worst(cfg: NodeConfig, reports: dict[str, LatencyReport]) -> Signal | None:
    """The node furthest above (or least below) its target; None without writes."""
    out: Signal | None = None
    for node, r in sorted(reports.items()):
        if r.p99_s is None:
            continue
        s = Signal(node, r.p99_s, target_of(cfg, r))
        if out is None or s.ratio > out.ratio:
            out = s
    return out


def max_moves(cfg: NodeConfig) -> int:
    """Moves at once without protection: ``rebalance.max_moves``, by default twice the
    transfer limit in files mode (index rebuilds and replays overlap transfers)."""
    return cfg.rebalance_max_moves or cfg.transfer_concurrency * (2 if cfg.rebalance_mode == "files" else 1)


def nice_this_thread(value: int = MOVE_NICE) -> None:
    """Lower the calling thread's CPU priority to ``value`` (Linux threads have their
    own nice value; raising it needs no privilege). Background work that must yield
    to the write path: move threads, the index catch-up after an unclean stop."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), value)
    except (OSError, AttributeError):   # not Linux, or a sandbox that forbids it
        pass


class Admission:
    """The node's foreground protection: a thread that measures and sets the levers,
    ``admit`` for the rebalancer, ``replay_limit`` for the move engine."""

    def __init__(self, ctx: NodeContext, recv_limits: Limits,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ctx = ctx
        self.recv = recv_limits
        self.clock = clock
        cfg = ctx.cfg
        self.aimd = Aimd(min(cfg.rebalance_min_moves, max_moves(cfg)), max_moves(cfg))
        self._lock = threading.Lock()
        self.signal: Signal | None = None
        self.peak_recv_bps = 0.0       # measured while no rate limit was in force
        self.peak_replay_rps = 0.0
        self._wire: dict[tuple[str, int], int] = {}
        self._wire_at = clock()
        self._applied: tuple[int, float | None] | None = None
        self._wake = threading.Event()
        self._reports: dict[str, tuple[float, str, LatencyReport]] = {}   # peer -> (when, addr, report)
        self._moving_at: float | None = None    # when a move was last seen running
        ctx.metrics.collectors.append(self._collect)

    # -- what the rest of the node asks ------------------------------------------------
    def protect(self) -> bool:
        return self.ctx.cfg.rebalance_protect

    def move_limit(self) -> int:
        if not self.protect():
            return max_moves(self.ctx.cfg)
        with self._lock:
            return self.aimd.moves

    def admit(self, running: int) -> bool:
        """May one more move start now, with ``running`` moves running?"""
        now = self.clock()
        if running:
            self._moving_at = now
        elif self.protect() and (self._moving_at is None
                                 or now - self._moving_at > RESTART_IDLE_S):
            # a rebalance's first move starts paced whatever is known: a fresh node
            # has not heard the primaries' latency yet. The tick this wakes (once the
            # move is registered: ``started``) asks them, and with no writes anywhere
            # lifts the level to the maximum at once. (The next move of a series keeps
            # the level: RESTART_IDLE_S.)
            with self._lock:
                self.aimd.start()
        return running < self.move_limit()

    def started(self) -> None:
        """A move was registered (the rebalancer, outside its lock): decide now, not
        at the next tick."""
        self._wake.set()

    def replay_limit(self) -> int:
        """Temp-WAL records/s per move (0 = unlimited): the configured cap, and while
        protection holds the level below its maximum, a share of the replay rate seen -
        never below REPLAY_OVER_INGEST x the fastest ingest of a running move."""
        cfg = self.ctx.cfg
        cap = cfg.replay_rate_limit
        with self._lock:
            level, hi = self.aimd.level, self.aimd.hi
        if not cfg.rebalance_protect or level >= hi:
            return cap
        ingest = max((max(mv.fig.ingest_rate, mv.fig.ingest_replay)
                      for mv in (m.progress() for m in self.ctx.moves.moves())),
                     default=0.0)
        ref = self.peak_replay_rps or REPLAY_REF_RPS
        mine = int(max(REPLAY_MIN_RPS, REPLAY_OVER_INGEST * ingest, ref * level / hi))
        return min(cap, mine) if cap else mine

    def transfer_limits(self) -> tuple[int, float | None]:
        """(transfers received at once, bytes/s or None) for the level now."""
        cfg = self.ctx.cfg
        slots, rate = cfg.transfer_concurrency, float(cfg.transfer_rate_limit) or None
        with self._lock:
            level, hi, moves = self.aimd.level, self.aimd.hi, self.aimd.moves
        if cfg.rebalance_protect and level < hi:
            slots = min(slots, moves)
            # a fraction of what the receive slots reach at full speed: ``ref`` is the
            # rate of ``transfer.concurrency`` transfers at once, the level counts moves,
            # so one move at level 1 gets one slot's share (the same share whatever the
            # mode's max_moves: files mode's is twice its slots)
            share = level / max(1, cfg.transfer_concurrency)
            if share < 1.0:
                ref = self.peak_recv_bps or float(REF_RECV_BPS)
                mine = max(float(MIN_RATE_BPS), ref * share)
                rate = mine if rate is None else min(rate, mine)
        return slots, rate

    def busy(self) -> bool:
        """Does a rebalance touch this node now (moves here, MOVING copies registered
        with it as primary, its files being sent)? Its latency then is no baseline."""
        ctx = self.ctx
        return bool(ctx.moves) or ctx.repl.copies.any() or ctx.repl.in_use.any()

    def op_ack_latency(self) -> LatencyReport:
        """RPC ``ack_latency`` (node-only): this node's window, for a demander's controller."""
        return self.ctx.metrics.acks.report(self.busy())

    def config_changed(self, new: NodeConfig) -> None:
        with self._lock:
            self.aimd.bounds(min(new.rebalance_min_moves, max_moves(new)), max_moves(new))
        self._apply()

    def nice_this_thread(self) -> None:
        """A move thread, at its start: lower CPU priority while protection is on."""
        if self.protect():
            nice_this_thread()

    def status(self) -> dict[str, object]:
        """This node's part of ``cluster status`` (``admission`` in --json)."""
        slots, rate = self.transfer_limits()
        sig = self.signal
        own = self.ctx.metrics.acks.report(self.busy())
        with self._lock:
            level = round(self.aimd.level, 2)
        return {"node": self.ctx.id, "protect": self.protect(), "level": level,
                "move_limit": self.move_limit(), "max_moves": max_moves(self.ctx.cfg),
                "transfers": slots, "transfer_rate_limit": int(rate) if rate else 0,
                "replay_rate_limit": self.replay_limit(),
                "latency_ms": round(sig.p99_s * 1e3, 2) if sig else None,
                "target_ms": round(sig.target_s * 1e3, 2) if sig else None,
                "latency_node": sig.node if sig else None,
                "own_p99_ms": own.to_wire()["p99_ms"], "baseline_ms": own.to_wire()["baseline_ms"]}

    # -- the loop -------------------------------------------------------------------
    def start(self) -> None:
        threading.Thread(target=self.run, name="admission", daemon=True).start()

    def run(self) -> None:
        stopping = self.ctx.events.stopping
        while not stopping.is_set():
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the protection's thread goes on after a bad tick
                log.exception("stage=admission tick failed")
            self._wake.wait(TICK_S if self.ctx.moves else IDLE_TICK_S)
            self._wake.clear()

    def stop(self) -> None:
        self._wake.set()

    def tick(self) -> None:
        ctx = self.ctx
        moving = bool(ctx.moves)
        if moving:
            self._moving_at = self.clock()
        reports = {ctx.id: ctx.metrics.acks.report(self.busy())}
        if moving and self.protect():
            reports.update(self._poll_peers())
        self._measure_rates()
        sig = worst(ctx.cfg, reports)
        with self._lock:
            before = self.aimd.level
            self.signal = sig
            # with no move running the level decides nothing (a start sets it anew);
            # not updating it then keeps a start's level until its move is registered
            level = self.aimd.update(sig.ratio if sig else None, self.clock()) if moving else before
        if moving and int(level) != int(before):
            log.info("stage=admission move limit %d -> %d (%s)", int(before), int(level),
                     f"p99 {sig.p99_s * 1e3:.2f} ms on {sig.node}, target {sig.target_s * 1e3:.2f} ms"
                     if sig else "no foreground writes")
        if level > before and moving:
            ctx.wake()                  # more moves may start now
        self._apply()

    def _peers(self) -> dict[str, str]:
        """Nodes the running moves touch: p's primary and the move's supplier."""
        ctx = self.ctx
        out: dict[str, str] = {}
        with ctx.map.lock:
            m = ctx.map.map
            for (cache, p), mv in ctx.moves.items():
                for n in (m.parts[cache][p].primary, mv.source):
                    addr = m.address(n)
                    if n and n != ctx.id and addr and len(out) < MAX_PEERS:
                        out[n] = addr
        return out

    def _poll_peers(self) -> dict[str, LatencyReport]:
        """The latency report of each peer: asked now, unless the one held from the
        same address is at most REPORT_FRESH_S old."""
        out = {}
        now = self.clock()
        held = self._reports
        for node, addr in self._peers().items():
            had = held.get(node)
            if had is not None and had[1] == addr and now - had[0] <= REPORT_FRESH_S:
                out[node] = had[2]
                continue
            try:
                out[node] = self.ctx.pool.request(addr, AckLatency(), timeout=POLL_TIMEOUT_S)
                held[node] = (now, addr, out[node])
            except NodeError as e:   # an old or busy peer (or a malformed reply): judge by the others
                held.pop(node, None)
                log.debug("stage=admission no latency from %s: %s", node, e)
        for node in [n for n, (at, _, _) in held.items() if now - at > REPORT_FRESH_S]:
            del held[node]           # not kept beyond its use: peers come and go
        return out

    def _measure_rates(self) -> None:
        """Receive bytes/s of this node's moves and the best replay rate seen: what
        the throttled limits are fractions of."""
        now = self.clock()
        moves = {k: mv.progress() for k, mv in self.ctx.moves.items()}
        # bytes received: a file transfer's wire bytes, a messages move's entry bytes
        # (both modes are paced by the same receive rate)
        wire = {k: mv.fig.wire if mv.mode == "files" else mv.fig.bytes for k, mv in moves.items()}
        dt = now - self._wire_at
        if dt >= TICK_S / 2:
            delta = sum(max(0, w - self._wire[k]) for k, w in wire.items() if k in self._wire)
            # a rate seen under a limit is the limit: only an unlimited one is the peak
            if delta and (self._applied is None or self._applied[1] is None):
                self.peak_recv_bps = max(self.peak_recv_bps, delta / dt)
            self._wire, self._wire_at = wire, now
        for mv in moves.values():
            if mv.fig.replayed >= 1000:    # a rate over a handful of records says little
                self.peak_replay_rps = max(self.peak_replay_rps, mv.fig.replay_rate)

    def _apply(self) -> None:
        slots, rate = self.transfer_limits()
        if self._applied != (slots, rate):
            self.recv.set_max_transfers(slots)
            self.recv.set_rate(rate)
            self._applied = (slots, rate)

    def _collect(self, m: Metrics) -> None:
        slots, rate = self.transfer_limits()
        own, n = self.ctx.metrics.acks.p99()
        m.set("ferry_node_rebalance_move_limit", self.move_limit())
        with self._lock:
            m.set("ferry_node_rebalance_level", round(self.aimd.level, 3))
        m.set("ferry_node_rebalance_transfer_rate_limit_bps", rate or 0)
        m.set("ferry_node_rebalance_replay_rate_limit", self.replay_limit())
        if own is not None:
            m.set("ferry_node_ack_latency_p99_seconds", own)
        sig = self.signal
        if sig is not None:
            m.set("ferry_node_rebalance_latency_seconds", sig.p99_s)
            m.set("ferry_node_rebalance_latency_target_seconds", sig.target_s)


__all__ = ["Admission", "Aimd", "Signal", "worst", "target_of", "max_moves"]
