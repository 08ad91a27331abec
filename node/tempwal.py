"""The temp WAL of a moving partition now lives beside the move engine
(:mod:`node.move.tempwal`); this name stays for the node's callers."""
from __future__ import annotations

from .move.tempwal import (CACHE_BYTES, SEGMENT_SIZE, TempRecord, TempWalCursor, TempWalSink,
                           Update, leftovers, remove, tmpwal_dir)

__all__ = ["CACHE_BYTES", "SEGMENT_SIZE", "TempRecord", "TempWalCursor", "TempWalSink", "Update",
           "leftovers", "remove", "tmpwal_dir"]
