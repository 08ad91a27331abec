"""What the move engine needs from its host, as small typed protocols.

The node (:mod:`node.filemove`) hosts the engine; tests host it with fakes. A host
gives it

- a **state store** (:class:`StateStore`): MOVING / OWNING, durable on return, plus a
  partition lock (:data:`PartitionLock`) that the host's replica stream also takes;
- a **replica feed** (:class:`ReplicaFeed`): register with the primary so that every
  later update of p reaches the move's temp WAL before the primary acknowledges it;
- a **supplier locator** (:class:`SupplierLocator`): the primary, the owners to DEMAND
  the file from, and whether their files can be installed here at all;
- **storage** (:class:`PartitionData`): one cache's partitions and indexes
  (``node.storage.CacheData`` in every host: install, counter, apply, index rebuild,
  checkpoint wait go through the node's own storage code).
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Callable, Protocol

from checkpoint import PartitionStore
from indexes import IndexStore

from ..states import State

Updates = list[tuple[bytes, bytes | None, int]]      # (key, value or None, counter)
PartitionLock = Callable[[str, int], AbstractContextManager[object]]


class PartitionData(Protocol):
    """One cache's partitions and indexes; writers of p hold the partition lock."""

    store: PartitionStore
    indexes: IndexStore

    def counter(self, p: int) -> int: ...

    def apply(self, p: int, key: bytes, value: bytes | None, counter: int) -> bool:
        """One update carrying its counter; skipped (False) at or below p's counter."""
        ...

    def apply_many(self, p: int, updates: Updates, *, logged: bool = True) -> int:
        """A batch of :meth:`apply` (one WAL batch, one wait, one index commit)."""
        ...

    def drop(self, p: int) -> None: ...

    def index_rebuilt(self, p: int) -> None:
        """p's index was just made from p's installed file (a move's index stage)."""
        ...

    def create(self, p: int) -> None: ...


class StateStore(Protocol):
    """Durable partition states (``node.states.StateTable`` or a host's own file)."""

    def get(self, cache: str, p: int) -> State | None: ...

    def set(self, cache: str, p: int, new: State, *, reason: str = "") -> State | None: ...


class ReplicaFeed(Protocol):
    def register(self, primary: str, cache: str, p: int) -> int:
        """Have ``primary`` replicate p here from now on: every later update reaches
        ``Move.sink`` (or the direct path) before the primary acknowledges it. Returns
        the primary's counter of p at registration. Called again before OWNING: once it
        returns, every update the primary made is here."""
        ...


class SupplierLocator(Protocol):
    def primary(self, cache: str, p: int) -> tuple[str, str] | None:
        """(name, address) of p's primary; None when no in-sync copy is left (the host
        has marked p LOST). Raises ``node.Unavailable`` when none is known yet."""
        ...

    def suppliers(self, cache: str, p: int) -> list[tuple[str, str]]:
        """(name, file-supplier address) of the copies that may send p's file, in the
        order to try them."""
        ...

    def check_files(self, cache: str, p: int) -> None:
        """Raise ``FilesImpossible`` when the suppliers' files cannot be installed here
        (another page size): the move goes on in the messages mode."""
        ...


class EntrySupply(Protocol):
    """The messages mode's supplier (the primary): entries instead of the file."""

    def demand(self, primary: str, cache: str, p: int) -> tuple[str, int, int]:
        """Register here and snapshot p's entries: (session, counter C, bytes)."""
        ...

    def fetch(self, primary: str, session: str, offset: int, max_bytes: int) -> tuple[list[object], int, bool]:
        """One supply message: (entries as sent, next offset, done)."""
        ...

    def done(self, primary: str, session: str) -> None: ...


class IndexSupply(Protocol):
    """A file supplier's shipped index of p (``[rebalance] index_transfer``): asked for
    before the file is fetched, read page by page after it is installed."""

    def want(self, supplier: str, cache: str, p: int, below: int = 0) -> bool:
        """Ask ``supplier`` to export p's index entries with its next snapshot of p;
        with ``below`` > 0 only if its file of p holds fewer bytes per live entry. True
        when it will."""
        ...

    def page(self, supplier: str, cache: str, p: int, counter: int, page: int
             ) -> tuple[dict[str, object], bytes]:
        """(header, page bytes) of the export at ``counter``; ``node.Unavailable``
        when the supplier holds none."""
        ...


class MoveMetrics(Protocol):
    def inc(self, name: str, amount: float = 1, **labels: str) -> None: ...

    def observe(self, name: str, seconds: float, **labels: str) -> None: ...


class NoMetrics:
    """For hosts without a metrics endpoint (tests)."""

    def inc(self, name: str, amount: float = 1, **labels: str) -> None:
        pass

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        pass
