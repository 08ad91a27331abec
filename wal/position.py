"""A frame boundary of the log (:class:`Position`), where a read or the writer's open
check can start instead of at a segment's start."""
from __future__ import annotations

from typing import NamedTuple


class Position(NamedTuple):
    """A frame boundary of the log: the frame at byte ``offset`` of segment ``seq``
    (whose first LSN is ``first_lsn``) holds LSN ``lsn`` and continues the CRC chain
    from ``prev_crc``. :meth:`Wal.position` gives the end of the log; ``read_from(lsn,
    at=position)`` starts reading there instead of at its segment's start. A position
    that does not describe this log (its segment gone, past its end, a chain value or
    LSN that the frame there does not continue) raises :class:`PositionMismatch`."""
    seq: int
    first_lsn: int
    offset: int
    prev_crc: int
    lsn: int
