"""What a frame loop reports: why it stopped (:class:`Stop`) and where (:class:`BlockState`).

Shared by the loops of both frame versions (``decoder.py``, ``decoder_v1.py``).
"""
from __future__ import annotations

from enum import Enum

RawRecord = tuple[int, int, bytes]       # (lsn, type, payload): what batches hand out


class Stop(Enum):
    END = "end"          # stopped exactly at the end of the buffer
    SHORT = "short"      # a frame header or payload runs past the end of the buffer
    BAD_CRC = "bad_crc"  # a complete frame whose CRC does not match the chain
    BAD_LSN = "bad_lsn"  # a frame with a valid CRC but not the next LSN
    BAD_BODY = "bad_body"  # a valid CRC, but unknown flags or a malformed batch body


class BlockState:
    """Where :func:`iter_block` stopped: offset, chain CRC and next LSN there, and why."""

    __slots__ = ("off", "crc", "lsn", "stop", "frame_end")

    def __init__(self) -> None:
        self.off = 0
        self.crc = 0
        self.lsn = 0
        self.stop = Stop.END
        self.frame_end = 0   # declared end of the frame that stopped the scan
