"""Crash points, the file-I/O seam and Ferry's error base.

Public face:
- :func:`crashpoint` (one line at each site), :data:`POINTS` (the only list of names)
- :mod:`faults.fileio` (``layer()``, ``use()``, ``write_all()``, ``atomic_write()``)
- :class:`FerryError`, :class:`OutOfDiskError`, :func:`translate_os_error`
"""
from __future__ import annotations

from . import fileio
from .crash import crashpoint
from .errors import FerryError, OutOfDiskError, is_disk_full, translate_os_error
from .points import POINTS

__all__ = ["crashpoint", "POINTS", "fileio", "FerryError", "OutOfDiskError",
           "is_disk_full", "translate_os_error"]
