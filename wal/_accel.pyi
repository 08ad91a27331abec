"""Types of the C accelerator of the WAL's frame path (``wal/_accel.c``)."""
from typing_extensions import Buffer

COPY_MAX: int
NOGIL_MIN: int

def frame_write(fd: int, payload: Buffer, type: int, lsn: int, v: int, m: int, /) -> tuple[int, int, int]:
    """Write one plain frame of ``payload`` to ``fd``; returns the new chain ``(v, m)`` and
    the bytes written (fewer than the whole frame when the caller must finish it)."""

def crc32c(data: Buffer, value: int = 0, /) -> int:
    """CRC32C of ``data`` chained from ``value``, as the ``crc32c`` package computes it."""

def hardware() -> bool:
    """True when the SSE4.2 CRC32C path is in use."""

def _set_hardware(on: object, /) -> bool:
    """Test hook: the SSE4.2 CRC (when the CPU has it) or the table-driven one; returns
    whether the hardware path is now in use."""

def _set_write_cap(cap: int, /) -> None:
    """Test hook: write at most ``cap`` bytes per frame write (0: whole frames)."""
