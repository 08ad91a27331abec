"""The driver that runs a scenario's processes: :class:`ClusterDriver` (``ferry node``
processes and the run's etcd)."""
from __future__ import annotations

from .base import Driver
from .cluster import ClusterDriver

__all__ = ["Driver", "ClusterDriver"]
