"""What happened during a run, in time: events (start, crash, restart, join, cut ...)
and periodic samples (partition states per node, bytes moved, temp-WAL backlog,
acknowledged writes). The report draws the PNG from this; the JSON keeps it."""
from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Mark:
    t: float
    node: str
    kind: str          # start | crash | restart | join | leave | kill | cut | heal | fill | free |
                       # disk full | move refused | declared failed | settled | stop
    detail: str = ""


@dataclass
class Sample:
    t: float
    acked: int
    states: dict[str, dict[str, int]] = field(default_factory=dict)   # node -> state -> count
    bytes_moved: int = 0
    backlog: int = 0            # updates buffered in temp WALs


class Timeline:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.marks: list[Mark] = []
        self.samples: list[Sample] = []
        self._lock = threading.Lock()

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def mark(self, node: str, kind: str, detail: str = "") -> None:
        with self._lock:
            self.marks.append(Mark(self.now(), node, kind, detail))

    def sample(self, **kw: Any) -> None:
        with self._lock:
            self.samples.append(Sample(self.now(), **kw))

    def crashes(self) -> list[Mark]:
        return [m for m in self.marks if m.kind == "crash"]

    def to_dict(self) -> dict[str, Any]:
        return {"marks": [asdict(m) for m in self.marks],
                "samples": [asdict(s) for s in self.samples]}
