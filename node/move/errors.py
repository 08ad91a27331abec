"""The move engine's errors: both mean "this attempt is over", of the node's hierarchy."""
from __future__ import annotations

from ..errors import Unavailable


class MoveRestart(Unavailable):
    """The move must start over (gap in the buffered updates, counter behind)."""


class FilesImpossible(Unavailable):
    """The owners' files cannot be installed here (other page size): use messages."""
