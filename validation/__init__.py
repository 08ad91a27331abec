"""Spark (PySpark) validation of partition files after rebalancing.

Public face:

- :func:`validate` ``(dirs, *, master="local[*]", expected=None, spark=None, ...)``
  -> the ``--json`` dict (``passed``, ``partitions_checked``, ``entries``,
  ``divergent``, ``corrupt_pages``, ``expected``, ``seconds``);
- :func:`list_folders` / :class:`PartitionFile`: the node data folder layout;
- :class:`LiveSettings`: what live validation of a running cluster needs (``validate(
  [], live=LiveSettings(...))``; docs/validation.md);
- :class:`ValidationError` (and ``LayoutError``, ``ExpectedFileError``, and for live
  mode ``ClusterUnreachable``, ``WrongSecret``, ``UnknownCache``);
- :mod:`validation.session` (``start``, ``stop_gateway``: a Spark session for callers
  that drive validation themselves, e.g. the demo and the benchmarks);
- the Spark data source ``validation.source.FerryDataSource`` (format ``ferry``);
- ``validation.ship.build_zip``: the decoder zip for cluster executors.

Importing this package does not import pyspark; :func:`validate` does.
Usage and the JSON schema: docs/validation.md.
"""
from __future__ import annotations

from typing import Any

from .errors import (ClusterUnreachable, ExpectedFileError, LayoutError, UnknownCache,
                     ValidationError, WrongSecret)
from .layout import PartitionFile, list_folders
from .live import LiveSettings


def validate(dirs: list[str], **kwargs: Any) -> dict:
    """See :func:`validation.job.validate` (imported here lazily: it needs pyspark)."""
    from .job import validate as _validate

    return _validate(dirs, **kwargs)


__all__ = ["validate", "list_folders", "PartitionFile", "ValidationError", "LayoutError",
           "ExpectedFileError", "LiveSettings", "ClusterUnreachable", "WrongSecret", "UnknownCache"]
