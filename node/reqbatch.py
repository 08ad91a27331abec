"""Group commit of a node's requests to the controller.

Every in-sync change and hand-off a node asks for is a key it puts in etcd
(``P/requests/<cache>/<p>/<node>``). Put one by one, a join or a leave that ends many
moves at once costs one etcd request per copy. Like Kafka's AlterPartition manager
(one request in flight per broker, the changes made meanwhile in the next one), the
requests a node makes while one transaction is being written, or within a short
linger after the first, share one transaction.

Nothing else changes: each request keeps its own key, the controller reads and applies
each as before, and each caller waits for its own answer. A transaction carries at
most ``max_ops`` keys (etcd's ``--max-txn-ops`` is 128) and never the same key twice
(etcd refuses that): a second request for the same key goes in the next transaction,
so the later one replaces the earlier, as two puts in a row would.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

LINGER_S = 0.005          # the first request waits this long for others to join it
MAX_OPS = 100             # keys per transaction (etcd's --max-txn-ops: 128)


@dataclass
class _Pending:
    key: str
    doc: dict[str, object]
    done: threading.Event = field(default_factory=threading.Event)
    rev: int = 0
    error: BaseException | None = None
    finished: bool = False        # written (or failed)
    lead: bool = False            # woken to write for the others


class GroupCommit:
    """``submit(key, doc)`` returns the revision at which the key was put, after the
    transaction that carried it (with any others made meanwhile) succeeded; the
    exception of a failed write is raised to every request it carried.

    ``write(items)`` puts every (key, doc) of ``items`` in one transaction and returns
    its revision. The first caller of a round writes for everyone (no thread of its
    own) until its own request is written; then the next waiting caller takes over,
    so no caller writes for others for ever."""

    def __init__(self, write: Callable[[list[tuple[str, dict[str, object]]]], int],
                 linger: float = LINGER_S, max_ops: int = MAX_OPS) -> None:
        self._write = write
        self.linger = linger
        self.max_ops = max_ops
        self._lock = threading.Lock()
        self._pending: list[_Pending] = []
        self._writing = False
        # figures: transactions written and requests carried (metrics, the scale bench)
        self.txns = 0
        self.requests = 0

    def submit(self, key: str, doc: dict[str, object]) -> int:
        me = _Pending(key, doc)
        with self._lock:
            self._pending.append(me)
            lead = not self._writing
            if lead:
                self._writing = True
        if lead:
            if self.linger > 0:
                time.sleep(self.linger)
            self._drain(me)
        else:
            me.done.wait()
            if not me.finished:           # handed the writing: ours is not written yet
                self._drain(me)
        if me.error is not None:
            raise me.error
        return me.rev

    def _take(self) -> list[_Pending]:
        """(lock held) The next transaction's requests: in order, no key twice."""
        batch: list[_Pending] = []
        keys: set[str] = set()
        rest: list[_Pending] = []
        for p in self._pending:
            if len(batch) < self.max_ops and p.key not in keys:
                batch.append(p)
                keys.add(p.key)
            else:
                rest.append(p)
        self._pending = rest
        return batch

    def _drain(self, me: _Pending) -> None:
        while True:
            with self._lock:
                if me.finished:
                    if self._pending:     # the next waiting caller writes from here
                        nxt = self._pending[0]
                        nxt.lead = True
                        nxt.done.set()
                    else:
                        self._writing = False
                    return
                batch = self._take()
            try:
                rev = self._write([(p.key, p.doc) for p in batch])
            except BaseException as e:      # noqa: B902 (handed to every waiter, then re-raised by each)
                for p in batch:
                    p.error = e
            else:
                for p in batch:
                    p.rev = rev
            with self._lock:
                self.txns += 1
                self.requests += len(batch)
                for p in batch:
                    p.finished = True
            for p in batch:
                if p is not me:
                    p.done.set()


__all__ = ["GroupCommit", "LINGER_S", "MAX_OPS"]
