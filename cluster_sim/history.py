"""Every client operation of a run, as a history a linearizability checker can read.

Each operation is recorded at its invocation and at its completion (``time.monotonic``
both): the process that issued it (a writer ``w0``, a reader, the final read check
``final-n2``), the key, what it wrote (None: a remove) or read, and how it ended:

- ``ok``: it returned (a write was acknowledged, a read returned its value);
- ``fail``: it certainly had no effect: a read that raised (a read changes nothing), or
  a write whose error says ``refused`` (:data:`node.errors.REFUSED`: the node did not
  apply it, and the client reports ``refused`` only when no attempt may have applied it);
- ``info``: a write whose outcome is unknown: its error says ``unknown`` (replication
  failed after the primary applied it, a reply lost after the request left ...), or
  the error is not the node's own (a timeout of the harness, a crashed process). It may
  have taken effect, at any time after its invocation, or never.

:func:`cluster_sim.linearizable.check` reads it: ``fail`` operations are left out,
``info`` ones may take effect at any point after their invocation.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace

OK, FAIL, INFO = "ok", "fail", "info"
READ, WRITE = "read", "write"


@dataclass(frozen=True)
class Operation:
    process: str
    kind: str                      # READ | WRITE
    key: bytes
    value: bytes | None            # written (None: remove) or read (None: absent)
    call: float                    # time.monotonic() of the invocation
    ret: float | None = None       # of the completion; None: unknown (never completed)
    status: str = OK               # OK | FAIL | INFO
    via: str = ""                  # the node whose view routed it
    error: str = ""


def status_of(kind: str, exc: BaseException) -> str:
    """How an operation that raised ``exc`` ended (see the module doc)."""
    if kind == READ:
        return FAIL
    return FAIL if getattr(exc, "outcome", None) == "refused" else INFO


@dataclass
class History:
    ops: list[Operation] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def invoke(self, process: str, kind: str, key: bytes, value: bytes | None = None,
               via: str = "") -> int:
        """Record the invocation now; returns the handle :meth:`ok` / :meth:`failed` take."""
        op = Operation(process, kind, key, value, time.monotonic(), via=via)
        with self._lock:
            self.ops.append(op)
            return len(self.ops) - 1

    def ok(self, handle: int, value: bytes | None = None) -> None:
        """It returned (``value``: what a read returned)."""
        now = time.monotonic()
        with self._lock:
            op = self.ops[handle]
            self.ops[handle] = replace(op, ret=now, status=OK,
                                       value=value if op.kind == READ else op.value)

    def failed(self, handle: int, exc: BaseException) -> None:
        now = time.monotonic()
        with self._lock:
            op = self.ops[handle]
            st = status_of(op.kind, exc)
            self.ops[handle] = replace(op, ret=now if st != INFO else None, status=st,
                                       error=f"{type(exc).__name__}: {str(exc)[:200]}")

    def via(self, handle: int, node: str) -> None:
        with self._lock:
            self.ops[handle] = replace(self.ops[handle], via=node)

    def snapshot(self) -> list[Operation]:
        """Every operation so far; one still running counts as unknown (``info``)."""
        with self._lock:
            return [op if op.ret is not None or op.status == INFO else replace(op, status=INFO)
                    for op in self.ops]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for op in self.snapshot():
            k = f"{op.kind} {op.status}"
            out[k] = out.get(k, 0) + 1
        return out


__all__ = ["History", "Operation", "status_of", "OK", "FAIL", "INFO", "READ", "WRITE"]
