"""Ferry's segmented write-ahead log: the node WAL and the per-partition temp WAL.

Public face (everything else in the package is private):

- :class:`Wal` -- ``Wal.open(path, *, segment_size=64 MiB, sync="group", first_lsn=1)``
  for the one writer; ``append``, ``append_many``, ``sync``, ``wait_durable``,
  ``read_from``, ``read_batches`` (lists of ``(lsn, type, payload)``: fastest replay),
  ``follow``, ``truncate_before``, ``destroy``, ``close``; ``first_lsn``, ``last_lsn``,
  ``durable_lsn``; ``position`` (the end of the log as a :class:`Position`, from which
  ``read_from(lsn, at=...)`` starts without reading its segment from the start).
- :meth:`Wal.reader` / :class:`WalReader` and :func:`follow_dir`: read-only access from
  any process while the writer appends.
- :class:`Record` (``.lsn``, ``.type``, ``.payload``), :class:`Follower` (iterate it, or
  ``.batches()``).
- Errors: :class:`WalError`, :class:`CorruptRecordError`, :class:`OutOfDiskError`,
  :class:`WalLockedError`, :class:`WalClosedError`, :class:`SegmentNotAFileError`.
- :func:`verify` / :func:`repair` (what ``ferry wal verify|repair`` run).

The on-disk format is in ``format.py`` and ``docs/formats.md``. Modules: ``log.py`` (the
public ``Wal`` and the append hot path), ``writer.py`` (its state, cuts, roll-back,
failure), ``groupcommit.py`` (the sync threads) and ``tickets.py`` (their waiters),
``reader.py`` (reading; ``position.py``: where a read may start), ``decoder.py`` (frame loop of format versions 2 and 3),
``tail.py`` (torn tail vs corruption), ``decoder_v1.py`` (version 1, still read), ``blocks.py`` (what the loops
report), ``walreader.py`` (other processes), ``segments.py``, ``recovery.py``,
``cli.py``; ``_accel.c`` (optional C extension: ``append``'s frame and write in one
call, same bytes) and ``accel.py`` (whether it is used; ``FERRY_WAL_ACCEL=0`` turns
it off).
"""
from __future__ import annotations

from .decoder import RawRecord, Record
from .errors import (CorruptRecordError, OutOfDiskError, PositionMismatch, SegmentNotAFileError,
                     WalClosedError, WalError, WalLockedError)
from .log import DEFAULT_SEGMENT_SIZE, MODES, Wal, WalReader, follow_dir
from .position import Position
from .reader import Follower
from .recovery import Report, repair, verify

__all__ = [
    "Wal", "WalReader", "follow_dir", "Follower", "Position", "Record", "RawRecord", "MODES",
    "DEFAULT_SEGMENT_SIZE",
    "WalError", "CorruptRecordError", "OutOfDiskError", "PositionMismatch", "WalLockedError",
    "WalClosedError",
    "SegmentNotAFileError",
    "verify", "repair", "Report",
]
