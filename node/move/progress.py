"""One move of one partition, as the demander sees it: :class:`Move` (stage, bytes,
rates, the temp-WAL catch-up figures; what ``cluster status``, ``moves_done`` and the
demo's progress show) and :class:`MemorySink`, the messages mode's
buffer of updates replicated to a MOVING copy (the files mode puts a temp WAL there).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
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
class Move:
    cache: str
    p: int
    mode: str = "messages"
    source: str | None = None
    stage: Stage = Stage.PREPARE
    bytes: int = 0
    bytes_total: int = 0
    started: float = field(default_factory=time.monotonic)
    sink: TempWalSink | MemorySink | None = None
    cancelled: bool = False
    # files mode
    direct: bool = False              # switched to the normal write path (replay done)
    gap: str | None = None            # set when a replicated update did not follow: restart
    wire: int = 0                     # bytes received over the wire (all attempts)
    wire_before: int = 0
    replayed: int = 0
    replay_rate: float = 0.0         # records/s applied since the replay began
    buffer_started: float = 0.0      # monotonic time the temp WAL of this attempt was created
    replay_started: float = 0.0
    replay_from_disk: int = 0        # replayed records read from disk (the rest: the memory tail)
    replay_cpu: float = 0.0          # CPU seconds of the replaying thread (its wall time is the replay stage)
    ingest_rate: float = 0.0         # records/s into the temp WAL before the replay began
    ingest_replay: float = 0.0       # records/s into the temp WAL during the replay
    snapshot_counter: int = 0
    index_progress: tuple[int, int | None, float | None] | None = None   # done, total, eta
    buffered: int = 0                 # temp-WAL records of the finished attempt
    stage_started: float = field(default_factory=time.monotonic)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    transfer_stages: dict[str, float] = field(default_factory=dict)   # the transfer's own (files mode)
    index_source: str = ""            # "streamed" (built while the file arrived) or "rebuilt"
    # how the file came (files mode): {"mode": "full" | "resume" | "delta", "pages": M,
    # "pages_sent": N (a delta), "delta_refused": why an offered base was not used}
    copy: dict[str, object] = field(default_factory=dict)
    on_stage: Callable[[str, float], None] | None = None   # (stage, seconds): metrics

    def begin(self, stage: Stage | str) -> None:
        stage = Stage(stage)              # a name ("replay") is accepted too
        now = time.monotonic()
        spent = now - self.stage_started
        self.stage_seconds[self.stage.value] = round(self.stage_seconds.get(self.stage.value, 0.0) + spent, 3)
        if self.on_stage is not None:
            self.on_stage(self.stage.value, spent)
        self.stage, self.stage_started = stage, now
        log.info("stage=%s cache=%s partition=%d move (%s) enters %s", stage, self.cache, self.p,
                 self.mode, stage)

    def eta(self) -> float | None:
        elapsed = max(time.monotonic() - self.stage_started, 1e-6)
        if self.stage in (Stage.TRANSFER, Stage.INSTALL) and self.bytes_total:
            rate = self.bytes / max(time.monotonic() - self.started, 1e-6)
            return round(max(self.bytes_total - self.bytes, 0) / rate, 1) if rate > 0 else None
        if self.stage == Stage.INDEX_REBUILD and self.index_progress and self.index_progress[2] is not None:
            return round(float(self.index_progress[2]), 1)
        if self.stage == Stage.REPLAY and self.sink is not None and self.replay_rate > 0:
            return round(self.sink.backlog() / self.replay_rate, 1)
        if self.stage == Stage.INDEX_REBUILD and self.index_progress and self.index_progress[1]:
            done, total = self.index_progress[0], self.index_progress[1]
            return round((total - done) * elapsed / done, 1) if done else None
        return None

    def ingest_now(self) -> float:
        """Records/s into the temp WAL: during the replay, since it began; before it,
        since the temp WAL was created."""
        sink = self.sink
        if not isinstance(sink, TempWalSink) or not self.buffer_started:
            return 0.0
        if self.replay_started >= self.buffer_started:
            return self.ingest_replay
        return sink.appended / max(time.monotonic() - self.buffer_started, 1e-6)

    def catchup(self) -> dict[str, object]:
        """Replay vs ingest (files mode): what the replay had to catch up with.
        ``ingest_rate`` is measured before the replay, where nothing slows the writes
        (backpressure acts only during the replay), per partition - one move replays
        one partition's temp WAL."""
        ratio = self.replay_rate / self.ingest_rate if self.ingest_rate > 0 else None
        return {"buffered": self.sink.appended if isinstance(self.sink, TempWalSink) else self.buffered,
                "replayed": self.replayed, "replay_rate": round(self.replay_rate, 1),
                "ingest_rate": round(self.ingest_rate, 1),
                "ingest_rate_during_replay": round(self.ingest_replay, 1),
                "replay_cpu_s": round(self.replay_cpu, 3), "replay_from_disk": self.replay_from_disk,
                "replay_over_ingest": round(ratio, 1) if ratio is not None else None}

    def summary(self, me: str) -> dict[str, object]:
        """A finished move, for ``moves_done`` (the demo's per-partition report)."""
        out = {"cache": self.cache, "partition": self.p, "from": self.source, "to": me,
               "mode": self.mode, "bytes": self.bytes, "wire_bytes": self.wire,
               "replayed": self.replayed, "seconds_to_owning": round(time.monotonic() - self.started, 3),
               "stage_seconds": dict(self.stage_seconds), "finished": time.time()}
        if self.mode == "files":
            out.update(self.catchup())
            out["transfer_stages"] = dict(self.transfer_stages)
            out["index_source"] = self.index_source
            out["copy"] = dict(self.copy)
        return out

    def status(self, me: str) -> dict[str, object]:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = self.bytes / elapsed
        left = max(self.bytes_total - self.bytes, 0)
        out = {"cache": self.cache, "partition": self.p, "from": self.source, "to": me,
               "mode": self.mode, "stage": self.stage.value, "bytes": self.bytes,
               "bytes_total": self.bytes_total, "rate_bps": round(rate, 1),
               "backlog": self.sink.backlog() if self.sink else 0,
               "eta_s": round(left / rate, 1) if rate > 0 and self.bytes_total else None}
        if self.mode == "files":
            out.update({"eta_s": self.eta(), "wire_bytes": self.wire,
                        "stage_seconds": dict(self.stage_seconds),
                        "seconds": round(elapsed, 2), "copy": dict(self.copy), **self.catchup()})
            if not self.replay_started or self.replay_started < self.buffer_started:
                out["ingest_rate"] = round(self.ingest_now(), 1)   # before the replay: so far
        return out
