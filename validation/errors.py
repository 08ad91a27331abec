"""Errors of the validation package (all are :class:`faults.FerryError`)."""
from __future__ import annotations

import re

import faults
from faults import FerryError


class ValidationError(FerryError):
    """The validation job could not run: a data folder or the expected file is
    unusable, or Spark failed. Divergent data is NOT an error: it is a result."""


class LayoutError(ValidationError):
    """A folder given to ``ferry validate`` is not a node data folder."""


class ExpectedFileError(ValidationError):
    """The ``--expected`` file cannot be read or lacks the columns it needs."""


class ClusterUnreachable(ValidationError):
    """No node (or etcd endpoint) of the cluster answered."""


class WrongSecret(ValidationError):
    """The cluster refused the secret the validator holds."""


class CertificateRefused(ValidationError):
    """Mutual TLS with the cluster failed: a node refused the validator's certificate
    (another CA's, say), the validator refused the node's, or the certificate is not
    one a live validator can use."""


class UnknownCache(ValidationError):
    """A cache that the cluster does not have."""


class OutOfDiskError(ValidationError, faults.OutOfDiskError):
    """No room for the HTML report or the Parquet export."""


# "org.apache.spark.SparkException: " and the like, before the message itself
_JAVA_CLASS = re.compile(r"^:?\s*(?:[A-Za-z_$][\w$]*\.)+[A-Za-z_$][\w$]*(?:Exception|Error)\s*:\s*")
_NOISE = ("at ", "... ", "An error occurred while calling", "== ", "JVM stacktrace:",
          "Driver stacktrace:", "Traceback ")
MAX_DETAIL = 400


def short_error(exc: BaseException) -> str:
    """A Spark (Py4J) error as one line: its first meaningful line and, when there is
    one, its innermost cause. str() of such an error carries the whole Java stack (165
    lines for an unreadable expected file), which buried the one line that matters."""
    lines = [ln.strip() for ln in str(exc).splitlines()]
    useful = [ln for ln in lines if ln and not ln.startswith(_NOISE) and ln != ":"]
    causes = [ln[len("Caused by:"):].strip() for ln in useful if ln.startswith("Caused by:")]
    first = _JAVA_CLASS.sub("", useful[0]) if useful else type(exc).__name__
    out = first[:MAX_DETAIL]
    if causes:
        cause = _JAVA_CLASS.sub("", causes[-1])[:MAX_DETAIL]
        if cause and cause not in first:
            out += f" (cause: {cause})"
    return out
