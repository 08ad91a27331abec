"""The harness's errors: one base under :class:`faults.FerryError`."""
from __future__ import annotations

from faults import FerryError


class SimError(FerryError):
    """A simulation could not run (not: an invariant failed; that is a result)."""


class ScenarioError(SimError):
    """A scenario file or option is wrong; the message names the field."""


class ProcessError(SimError):
    """A process of the run did not start or did not stop; the message has its log tail."""
