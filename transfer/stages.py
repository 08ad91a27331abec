"""Named stages with a timer each, as CockroachDB names the stages of a snapshot send
(reserve, header, accepted, send, final, applied or error).

The current stage is what logs, errors, progress and metrics report.
"""
from __future__ import annotations

import contextlib
import time
from typing import Iterator

from .errors import TransferError

SUPPLIER_STAGES = ("handshake", "demand", "reserve", "snapshot", "manifest", "accepted",
                   "send", "preimages", "end", "applied")
DEMANDER_STAGES = ("reserve", "connect", "handshake", "demand", "manifest", "accept",
                   "receive", "verify", "install", "applied")


class Stages:
    def __init__(self) -> None:
        self.current = "start"
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str, **ctx: object) -> Iterator[None]:
        """Run a stage; a TransferError raised inside gets the stage (and ctx) filled in."""
        self.current = name
        t0 = time.perf_counter()
        try:
            yield
        except TransferError as e:
            e.where(stage=name, **ctx)  # type: ignore[arg-type]
            raise
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
