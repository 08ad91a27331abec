"""Errors of the validation package (all are :class:`faults.FerryError`)."""
from __future__ import annotations

from faults import errors as _faults_errors
from faults.errors import FerryError


class ValidationError(FerryError):
    """The validation job could not run: a data folder or the expected file is
    unusable, or Spark failed. Divergent data is NOT an error: it is a result."""


class LayoutError(ValidationError):
    """A folder given to ``ferry validate`` is not a node data folder."""


class ExpectedFileError(ValidationError):
    """The ``--expected`` file cannot be read or lacks the columns it needs."""


class OutOfDiskError(ValidationError, _faults_errors.OutOfDiskError):
    """No room for the HTML report or the Parquet export."""
