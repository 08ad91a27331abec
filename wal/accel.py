"""Which frame path ``Wal.append`` uses: the C accelerator (``wal/_accel.c``) or Python.

The accelerator is optional: it is built with the package when a C compiler and the
Python headers are there (``pyproject.toml``, ``optional = true``), and the pure-Python
path, which writes the same bytes, runs whenever it is missing, disabled, or the file
layer is not the real one (tests' fault-injecting layers must see every write).

``FERRY_WAL_ACCEL=0`` in the environment turns it off for logs opened from then on
(A/B benchmarks, tests of the pure path).
"""
from __future__ import annotations

import os
from typing import Callable, Protocol

FrameWrite = Callable[[int, bytes, int, int, int, int], "tuple[int, int, int]"]


class _Accel(Protocol):
    """What this module uses of ``wal._accel`` (all of it: ``wal/_accel.pyi``)."""

    @property
    def frame_write(self) -> FrameWrite: ...

    def hardware(self) -> bool: ...


_accel: _Accel | None
try:
    from . import _accel as _built    # optional C extension
    _accel = _built
except ImportError:           # not built (no compiler): the pure-Python path runs
    _accel = None

ENV = "FERRY_WAL_ACCEL"


def enabled() -> bool:
    """True when the accelerator is built and not turned off by ``FERRY_WAL_ACCEL=0``."""
    return _accel is not None and \
        os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "no", "false")


def frame_writer(real_layer: bool) -> FrameWrite | None:
    """``_accel.frame_write`` for a log on the real file layer when enabled, else None."""
    return _accel.frame_write if _accel is not None and real_layer and enabled() else None


def status() -> str:
    """One word for tools and benchmarks: ``c-sse4.2``, ``c-table``, ``python-disabled``
    (``FERRY_WAL_ACCEL=0``) or ``python-not-built``."""
    if _accel is None:
        return "python-not-built"
    if not enabled():
        return "python-disabled"
    return "c-sse4.2" if _accel.hardware() else "c-table"
