"""Spark (PySpark) validation of partition files after rebalancing.

Public face:

- :func:`validate` ``(dirs, *, master="local[*]", expected=None, spark=None, ...)``
  -> the ``--json`` dict (``passed``, ``partitions_checked``, ``entries``,
  ``divergent``, ``corrupt_pages``, ``expected``, ``seconds``);
- :func:`list_folders` / :class:`PartitionFile`: the node data folder layout;
- :class:`ValidationError` (and ``LayoutError``, ``ExpectedFileError``);
- the Spark data source ``validation.source.FerryDataSource`` (format ``ferry``);
- ``validation.ship.build_zip``: the decoder zip for cluster executors.

Importing this package does not import pyspark; :func:`validate` does.
Usage and the JSON schema: docs/validation.md.
"""
from __future__ import annotations

from typing import Any

from .errors import ExpectedFileError, LayoutError, ValidationError
from .layout import PartitionFile, list_folders


def validate(dirs: list[str], **kwargs: Any) -> dict:
    """See :func:`validation.job.validate` (imported here lazily: it needs pyspark)."""
    from .job import validate as _validate

    return _validate(dirs, **kwargs)


__all__ = ["validate", "list_folders", "PartitionFile", "ValidationError", "LayoutError",
           "ExpectedFileError"]
