"""One move of one partition, as the demander sees it.

- :class:`Move`: the control object, owned by the engine (:mod:`.engine`,
  :mod:`.messages`). Its stage, sink, mode, the direct-path switch, a gap and a cancel
  change only through its methods; the replicate path reads them under p's lock.
- :class:`MoveFigures`: the statistics (bytes, rates, the temp-WAL catch-up figures),
  ``Move.fig``, written by the engine's thread only.
- :class:`MoveProgress`: a read-only snapshot of both (``Move.progress()``): what
  ``cluster status``, ``moves_done``, the metrics and foreground protection read.
- :class:`MemorySink`: the messages mode's buffer of updates replicated to a MOVING
  copy (the files mode puts a temp WAL there).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from .stages import Stage
from .tempwal import TempWalSink

log = logging.getLogger("ferry.node.rebalance")


class MemorySink:
    """Updates replicated to a MOVING copy, kept until catch-up (messages mode)."""

    def __init__(self) -> None:
        self.items: list[tuple[int, bytes, bytes | None]] = []

    def append(self, counter: int, key: bytes, value: bytes | None) -> None:
        self.items.append((counter, key, value))

    def drain(self) -> list[tuple[int, bytes, bytes | None]]:
        out, self.items = self.items, []
        return out

    def backlog(self) -> int:
        return len(self.items)


@dataclass
class MoveFigures:
    """The statistics of one move, written by the engine's thread only."""
    source: str | None = None         # the supplier of the current attempt
    bytes: int = 0
    bytes_total: int = 0
    started: float = field(default_factory=time.monotonic)
    # files mode
    wire: int = 0                     # bytes received over the wire (all attempts)
    wire_before: int = 0
    replayed: int = 0
    replay_rate: float = 0.0          # records/s applied since the replay began
    buffer_started: float = 0.0       # monotonic time the temp WAL of this attempt was created
    replay_started: float = 0.0
    replay_from_disk: int = 0         # replayed records read from disk (the rest: the memory tail)
    replay_cpu: float = 0.0           # CPU seconds of the replaying thread (its wall time is the replay stage)
    ingest_rate: float = 0.0          # records/s into the temp WAL before the replay began
    ingest_replay: float = 0.0        # records/s into the temp WAL during the replay
    snapshot_counter: int = 0
    index_progress: tuple[int, int | None, float | None] | None = None   # done, total, eta
    buffered: int = 0                 # temp-WAL records of the finished attempt
    stage_seconds: dict[str, float] = field(default_factory=dict)
    transfer_stages: dict[str, float] = field(default_factory=dict)   # the transfer's own (files mode)
    index_source: str = ""            # "shipped" (by the supplier), "streamed" (built while
                                      # the file arrived) or "rebuilt"
    # how the file came (files mode): {"mode": "full" | "resume" | "delta", "pages": M,
    # "pages_sent": N (a delta), "delta_refused": why an offered base was not used}
    copy: dict[str, object] = field(default_factory=dict)

    def fresh_attempt(self, now: float) -> None:
        """A new files-mode attempt: its temp WAL starts now, nothing replayed yet."""
        self.replayed = 0
        self.replay_rate = self.ingest_rate = self.ingest_replay = 0.0
        self.buffer_started = now


@dataclass(frozen=True)
class MoveProgress:
    """A move as it was when :meth:`Move.progress` was called: read-only, with its own
    copy of the figures (changing them changes nothing)."""
    cache: str
    p: int
    mode: str
    stage: Stage
    stage_started: float
    buffering: bool                   # a sink takes the replicated updates
    backlog: int                      # updates buffered and not yet applied
    appended: int | None              # records appended to the temp WAL (None: no temp WAL)
    fig: MoveFigures
    at: float = field(default_factory=time.monotonic)

    def eta(self) -> float | None:
        f = self.fig
        elapsed = max(self.at - self.stage_started, 1e-6)
        if self.stage in (Stage.TRANSFER, Stage.INSTALL) and f.bytes_total:
            rate = f.bytes / max(self.at - f.started, 1e-6)
            return round(max(f.bytes_total - f.bytes, 0) / rate, 1) if rate > 0 else None
        if self.stage == Stage.INDEX_REBUILD and f.index_progress and f.index_progress[2] is not None:
            return round(float(f.index_progress[2]), 1)
        if self.stage == Stage.REPLAY and self.buffering and f.replay_rate > 0:
            return round(self.backlog / f.replay_rate, 1)
        if self.stage == Stage.INDEX_REBUILD and f.index_progress and f.index_progress[1]:
            done, total = f.index_progress[0], f.index_progress[1]
            return round((total - done) * elapsed / done, 1) if done else None
        return None

    def ingest_now(self) -> float:
        """Records/s into the temp WAL: during the replay, since it began; before it,
        since the temp WAL was created."""
        f = self.fig
        if self.appended is None or not f.buffer_started:
            return 0.0
        if f.replay_started >= f.buffer_started:
            return f.ingest_replay
        return self.appended / max(self.at - f.buffer_started, 1e-6)

    def catchup(self) -> dict[str, object]:
        """Replay vs ingest (files mode): what the replay had to catch up with.
        ``ingest_rate`` is measured before the replay, where nothing slows the writes
        (backpressure acts only during the replay), per partition - one move replays
        one partition's temp WAL."""
        f = self.fig
        ratio = f.replay_rate / f.ingest_rate if f.ingest_rate > 0 else None
        return {"buffered": self.appended if self.appended is not None else f.buffered,
                "replayed": f.replayed, "replay_rate": round(f.replay_rate, 1),
                "ingest_rate": round(f.ingest_rate, 1),
                "ingest_rate_during_replay": round(f.ingest_replay, 1),
                "replay_cpu_s": round(f.replay_cpu, 3), "replay_from_disk": f.replay_from_disk,
                "replay_over_ingest": round(ratio, 1) if ratio is not None else None}

    def summary(self, me: str) -> dict[str, object]:
        """A finished move, for ``moves_done`` (the demo's per-partition report)."""
        f = self.fig
        out = {"cache": self.cache, "partition": self.p, "from": f.source, "to": me,
               "mode": self.mode, "bytes": f.bytes, "wire_bytes": f.wire,
               "replayed": f.replayed, "seconds_to_owning": round(self.at - f.started, 3),
               "stage_seconds": dict(f.stage_seconds), "finished": time.time()}
        if self.mode == "files":
            out.update(self.catchup())
            out["transfer_stages"] = dict(f.transfer_stages)
            out["index_source"] = f.index_source
            out["copy"] = dict(f.copy)
        return out

    def status(self, me: str) -> dict[str, object]:
        """A running move, for ``moves`` (``ferry cluster status``)."""
        f = self.fig
        elapsed = max(self.at - f.started, 1e-6)
        rate = f.bytes / elapsed
        left = max(f.bytes_total - f.bytes, 0)
        out = {"cache": self.cache, "partition": self.p, "from": f.source, "to": me,
               "mode": self.mode, "stage": self.stage.value, "bytes": f.bytes,
               "bytes_total": f.bytes_total, "rate_bps": round(rate, 1),
               "backlog": self.backlog,
               "eta_s": round(left / rate, 1) if rate > 0 and f.bytes_total else None}
        if self.mode == "files":
            out.update({"eta_s": self.eta(), "wire_bytes": f.wire,
                        "stage_seconds": dict(f.stage_seconds),
                        "seconds": round(elapsed, 2), "copy": dict(f.copy), **self.catchup()})
            if not f.replay_started or f.replay_started < f.buffer_started:
                out["ingest_rate"] = round(self.ingest_now(), 1)   # before the replay: so far
        return out


class Move:
    """One move of p to this node: the control state the engine changes through these
    methods, and its figures (``fig``). Changes of the sink, the mode and the direct
    switch happen under p's lock (the replicate path reads them under it)."""

    def __init__(self, cache: str, p: int, mode: str = "messages", source: str | None = None,
                 on_stage: Callable[[str, float], None] | None = None) -> None:
        self.cache, self.p = cache, p
        self.fig = MoveFigures(source=source)
        self._mode = mode
        self._stage = Stage.PREPARE
        self._stage_started = time.monotonic()
        self._sink: TempWalSink | MemorySink | None = None
        self._cancelled = False
        self._direct = False              # switched to the normal write path (replay done)
        self._gap: str | None = None      # a replicated update did not follow: restart
        self._on_stage = on_stage         # (stage, seconds): metrics

    # -- read by the host ------------------------------------------------------------
    @property
    def mode(self) -> str:
        return self._mode

    @property
    def stage(self) -> Stage:
        return self._stage

    @property
    def sink(self) -> TempWalSink | MemorySink | None:
        return self._sink

    @property
    def direct(self) -> bool:
        return self._direct

    @property
    def gap(self) -> str | None:
        return self._gap

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def source(self) -> str | None:
        return self.fig.source

    def progress(self) -> MoveProgress:
        sink = self._sink
        fig = replace(self.fig, stage_seconds=dict(self.fig.stage_seconds),
                      transfer_stages=dict(self.fig.transfer_stages), copy=dict(self.fig.copy))
        return MoveProgress(self.cache, self.p, self._mode, self._stage, self._stage_started,
                            sink is not None, sink.backlog() if sink is not None else 0,
                            sink.appended if isinstance(sink, TempWalSink) else None, fig)

    def status(self, me: str) -> dict[str, object]:
        return self.progress().status(me)

    def summary(self, me: str) -> dict[str, object]:
        return self.progress().summary(me)

    # -- changed by the host -----------------------------------------------------------
    def cancel(self) -> None:
        """The move is no longer wanted: the engine gives up at its next check."""
        self._cancelled = True

    # -- changed by the engine -----------------------------------------------------------
    def begin(self, stage: Stage | str) -> None:
        stage = Stage(stage)              # a name ("replay") is accepted too
        now = time.monotonic()
        spent = now - self._stage_started
        secs = self.fig.stage_seconds
        secs[self._stage.value] = round(secs.get(self._stage.value, 0.0) + spent, 3)
        if self._on_stage is not None:
            self._on_stage(self._stage.value, spent)
        self._stage, self._stage_started = stage, now
        # DEBUG: a line per stage is most of a joining node's log; the move's stage is
        # in its status, and its OWNING line gives every stage's seconds
        log.debug("stage=%s cache=%s partition=%d move (%s) enters %s", stage, self.cache, self.p,
                  self._mode, stage)

    def use_sink(self, sink: TempWalSink | MemorySink) -> None:
        """(p's lock held) Updates replicated from now on go to ``sink``; a new
        attempt: not on the direct path, no gap."""
        self._sink, self._direct, self._gap = sink, False, None

    def take_sink(self) -> TempWalSink | MemorySink | None:
        """(p's lock held) Stop buffering; the caller closes or deletes what it gets."""
        sink, self._sink = self._sink, None
        return sink

    def to_messages(self) -> TempWalSink | MemorySink | None:
        """(p's lock held) The files cannot be installed here: the next attempts use
        the messages mode. Returns the sink taken away."""
        self._mode = "messages"
        return self.take_sink()

    def go_direct(self) -> None:
        """(p's lock held) The replay is done: replicated updates are applied at once."""
        self._direct = True

    def flag_gap(self, why: str) -> None:
        """(p's lock held) A replicated update did not follow: the move restarts."""
        self._gap = why
