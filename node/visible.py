"""What a read of a primary may see: only updates every in-sync copy has applied.

The primary applies an update to its own store first and then replicates it; until
every in-sync copy answered (the acknowledgement), the update may still be lost (a
replication that fails and an in-sync set that cannot shrink: "NOT acknowledged"; a
failover to a copy that lacks it). A read that saw it would have seen a value that may
never have existed.

So per partition the primary keeps the keys with an update not yet acknowledged and,
for each, the last acknowledged value (what the store held before the first such
update: :meth:`Visibility.hold`, under the partition lock, BEFORE the store changes).
A read takes the store's value and then looks here: a held key reads as its
acknowledged value. That order matters: an update is held before it reaches the store
and released only after it is acknowledged, so whatever the read found in the store,
the value it returns was the acknowledged one at some instant during the read.

An acknowledgement releases every held key of the partition (:meth:`release`): every
in-sync copy applied that update, and copies apply in counter order, so they hold every
earlier update too -- including one whose own replication failed. A read therefore
never waits: a key with an update in flight reads as its acknowledged value (the write
has not completed, so it may take effect after the read), and a failed update stays
invisible until a later acknowledgement (or a confirmation, below) covers it.

``confirmed`` is the tenure -- (primary term, control-plane lease) -- in which this
node knows that its whole copy is on every in-sync copy: set by an acknowledged write
or by a confirmation (an empty replicate to the in-sync copies, node/updates.py) in
that tenure. A new primary confirms before it serves its first read: with more than one
backup, the copy that became primary may hold an update another in-sync copy lacks.
So does a node that registered again under a new lease (its old one ended: it may have
been deposed meanwhile, and its map may not show it yet): an in-sync copy that knows a
newer term refuses the confirmation.

Cost on the write path: one store lookup of the old value per key (~2 us against a
write of ~2 ms); nothing on the read path but two dict lookups.
"""
from __future__ import annotations

from typing import Iterable

from .storage import CacheData

PartKey = tuple[str, int]
Tenure = tuple[int, int]          # (primary term, control-plane lease id)


class Visibility:
    """Held keys per partition (changed under the partition lock, read without it:
    single dict operations, atomic under the GIL) and the confirmed term."""

    def __init__(self) -> None:
        self._held: dict[PartKey, dict[bytes, bytes | None]] = {}
        self._confirmed: dict[PartKey, Tenure] = {}
        self._acked: dict[PartKey, int] = {}      # the last acknowledged counter of p

    def hold(self, cache: str, p: int, data: CacheData, keys: Iterable[bytes]) -> None:
        """(p's lock held) Before updates of ``keys`` reach the store: remember what a
        read may see of each (the store's value now, unless the key is already held,
        which keeps the older acknowledged one)."""
        held = self._held.get((cache, p))
        if held is None:
            held = self._held.setdefault((cache, p), {})
        for k in keys:
            if k not in held:
                held[k] = data.get(p, k)

    def release(self, cache: str, p: int, tenure: Tenure, counter: int) -> None:
        """(p's lock held) The update of p at ``counter`` was acknowledged in ``tenure``
        (or the copy was confirmed at ``counter``): every held key of p is now
        acknowledged."""
        self._held.pop((cache, p), None)
        self._confirmed[(cache, p)] = tenure
        self._acked[(cache, p)] = counter

    def acknowledged(self, cache: str, p: int, counter: int, tenure: Tenure) -> bool:
        """Is the update of p at ``counter`` known to be on every in-sync copy, as far
        as this node, primary in ``tenure``, knows?"""
        return self._confirmed.get((cache, p)) == tenure and counter <= self._acked.get((cache, p), -1)

    def read(self, cache: str, p: int, data: CacheData, key: bytes) -> bytes | None:
        """The value a read may return: the store's, unless an update of the key is not
        acknowledged yet. The store is read FIRST (see the module doc)."""
        value = data.get(p, key)
        held = self._held.get((cache, p))
        if held:
            try:
                return held[key]
            except KeyError:
                pass
        return value

    def confirmed(self, cache: str, p: int) -> Tenure | None:
        return self._confirmed.get((cache, p))

    def held(self, cache: str, p: int) -> int:
        """Keys of p with an update not acknowledged (for tests and status)."""
        return len(self._held.get((cache, p), ()))

    def forget(self, cache: str, p: int) -> None:
        """p is no longer led here (or its copy changed): nothing held, not confirmed."""
        self._held.pop((cache, p), None)
        self._confirmed.pop((cache, p), None)
        self._acked.pop((cache, p), None)


__all__ = ["Visibility", "Tenure"]
