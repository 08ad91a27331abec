"""Request ids: a client write that cannot apply twice.

Every write a :class:`node.Client` sends carries a request id ``[client, seq, low]``:
the client's random id, the write's sequence number (the same on every retry of that
write) and the lowest sequence number the client still waits for (every write below it
has returned or been given up). Per partition, each copy keeps what it applied by id
(:class:`RequestTable`); the primary records an id when it applies the write and sends
it with the ``replicate``, so every copy that applied the update knows the id too, and
so does a backup that becomes primary.

A write whose id is already in the table is not applied again: the primary answers
with the counter(s) of its first application, once that update is acknowledged
(node/updates.py). A write whose ``seq`` is below the client's ``low`` (as the table
last heard it) is a late copy of a request the client gave up on: refused
(``superseded``), never applied. Entries below ``low`` are dropped, so a client's
entries are the writes it still waits for.

Bounded: at most ``MAX_CLIENTS`` clients per partition (the least recently seen goes
first) and ``MAX_PER_CLIENT`` entries per client. What it does not cover (docs/node.md,
"Request ids"): the table is in memory (a node that restarts forgets it), and a copy
whose data a move replaced keeps no entry from before the move's last attempt (each
attempt clears the table as it begins: ``UpdatePath.copy_replaced``).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from .errors import BadRequest, Superseded

MAX_CLIENTS = 4096        # per partition; a client that wrote nothing for long goes first
MAX_PER_CLIENT = 1024     # writes one client may have in flight to one partition
MAX_CLIENT_ID = 64        # bytes of a client id


@dataclass(frozen=True)
class RequestId:
    client: str
    seq: int
    low: int

    @classmethod
    def parse(cls, raw: object) -> "RequestId | None":
        """From the wire (``[client, seq, low]`` or None; one already parsed is
        itself), or BadRequest."""
        if raw is None or isinstance(raw, RequestId):
            return raw
        if (not isinstance(raw, (list, tuple)) or len(raw) != 3 or not isinstance(raw[0], str)
                or not 0 < len(raw[0]) <= MAX_CLIENT_ID or not isinstance(raw[1], int)
                or not isinstance(raw[2], int) or not 0 <= raw[2] <= raw[1]):
            raise BadRequest("rid must be [client id (1-64 chars), seq, low] with 0 <= low <= seq")
        return cls(raw[0], raw[1], raw[2])

    def wire(self) -> list[object]:
        return [self.client, self.seq, self.low]


@dataclass
class _Client:
    low: int = 0
    done: dict[int, tuple[int, int]] = field(default_factory=dict)   # seq -> (first, last counter)


class RequestTable:
    """One partition's applied request ids on one copy. Not thread-safe: used under
    the partition lock (the primary's write, the backup's apply)."""

    def __init__(self) -> None:
        self._clients: OrderedDict[str, _Client] = OrderedDict()
        self.moving = False       # last update recorded while p was MOVING here

    def __len__(self) -> int:
        return sum(len(c.done) for c in self._clients.values())

    def seen(self, rid: RequestId) -> tuple[int, int] | None:
        """The counters the write got when it was applied, None when it was not.
        Raises Superseded for a write below the client's ``low``."""
        c = self._clients.get(rid.client)
        if c is None:
            return None
        if rid.seq < c.low and rid.seq not in c.done:
            raise Superseded(f"request {rid.client}#{rid.seq} is older than the oldest one its client "
                             f"still waits for (#{c.low}): a late copy, not applied")
        return c.done.get(rid.seq)

    def record(self, rid: RequestId, first: int, last: int) -> None:
        c = self._clients.pop(rid.client, None) or _Client()
        self._clients[rid.client] = c             # most recently seen last
        if rid.low > c.low:
            c.low = rid.low
            for s in [s for s in c.done if s < c.low]:
                del c.done[s]
        c.done[rid.seq] = (first, last)
        while len(c.done) > MAX_PER_CLIENT:
            del c.done[min(c.done)]
        while len(self._clients) > MAX_CLIENTS:
            self._clients.popitem(last=False)

    def clear(self) -> None:
        self._clients.clear()


class Requests:
    """Every partition's :class:`RequestTable` on this node."""

    def __init__(self) -> None:
        self._tables: dict[tuple[str, int], RequestTable] = {}

    def table(self, cache: str, p: int) -> RequestTable:
        t = self._tables.get((cache, p))
        if t is None:
            t = self._tables.setdefault((cache, p), RequestTable())
        return t

    def record(self, cache: str, p: int, rid: RequestId | None, first: int, last: int, *,
               moving: bool = False) -> None:
        """After applying (or buffering, ``moving``) the update(s) of ``rid``. The
        first update a MOVING copy records clears what the table held: the move
        replaces the copy's data, and entries of updates that were lost with it must
        not answer a retry."""
        if rid is None:
            return
        t = self.table(cache, p)
        if moving and not t.moving:
            t.clear()
        t.moving = moving
        t.record(rid, first, last)

    def forget(self, cache: str, p: int) -> None:
        """The copy's data is no longer what the table describes (a resync)."""
        t = self._tables.get((cache, p))
        if t is not None:
            t.clear()


__all__ = ["RequestId", "RequestTable", "Requests", "MAX_CLIENTS", "MAX_PER_CLIENT"]
