"""Drivers run a scenario's processes: :class:`ClusterDriver` (ferry nodes) and
:class:`FileMoveDriver` (the mover's supplier and demander)."""
from __future__ import annotations

from .base import Driver
from .cluster import ClusterDriver
from .filemove import FileMoveDriver

__all__ = ["Driver", "ClusterDriver", "FileMoveDriver"]
