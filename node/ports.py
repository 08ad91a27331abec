"""The seams between the node's parts: what each asks of another, and nothing more.

- :class:`IsrControl` is the control plane as the update path and the rebalancer see
  it (in-sync changes and other requests to the controller, the node's report).
- :class:`Leadership` is the update path as the control plane and the rebalancer see
  it (may this node lead p now, and the error to answer when it may not).
- :class:`MoveActions` is the rebalancer as the update path and the reconcile loop see
  it (buffer an update of a MOVING partition, start, resync, take the primary role).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping, Protocol

from .cluster_map import PartRecord
from .errors import NodeError

if TYPE_CHECKING:
    from .move import Move

Handler = Callable[..., object]
Handlers = Mapping[str, Handler]


class IsrControl(Protocol):
    def alter_isr(self, cache: str, p: int, remove: list[str] = ..., add: list[str] = ...) -> PartRecord: ...

    def request(self, cache: str, p: int, doc: dict[str, object],
                done: Callable[[PartRecord], bool], timeout: float = ..., patience: float = ...) -> PartRecord: ...

    def put_report(self) -> None: ...

    def report_changed(self, cache: str, p: int) -> None: ...


class Leadership(Protocol):
    def leads(self, cache: str, p: int, *, write: bool = True) -> bool: ...

    def not_primary(self, cache: str, p: int) -> NodeError: ...

    def require_serving(self) -> None: ...

    def check_epoch(self, cache: str, p: int, epoch: int | None, sender: str, *,
                    demand: bool = False) -> None: ...

    def copy_replaced(self, cache: str, p: int) -> None: ...


class MoveActions(Protocol):
    def start_move(self, cache: str, p: int, why: str) -> bool: ...

    def request_resync(self, cache: str, p: int, why: str) -> None: ...

    def buffer_update(self, mv: "Move", cache: str, p: int, key: bytes, value: bytes | None,
                      counter: int, prev: int, durable: bool = True) -> str: ...

    def backpressure(self, mv: "Move", records: int = 1) -> None: ...

    def take_primary(self, cache: str, p: int, prim: str) -> bool: ...


__all__ = ["IsrControl", "Leadership", "MoveActions", "Handler", "Handlers"]
