"""Read-only access to a log directory from any process: :class:`WalReader`."""
from __future__ import annotations

import os

from .errors import WalError
from .reader import DirSource, Follower


class WalReader:
    """Read-only view of a log directory from any process (no lock, no writes)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.path.abspath(os.fspath(path))
        if not os.path.isdir(self.path):
            raise WalError(f"write-ahead log directory {self.path} does not exist")

    def read_from(self, lsn: int | None = None) -> Follower:
        """Records from ``lsn`` to the end as of now (a torn tail is the end); iterate
        it, or call ``.batches()`` for lists of plain tuples (faster)."""
        return Follower(DirSource(self.path), lsn, follow=False)

    def follow(self, lsn: int | None = None, *, timeout: float | None = None) -> Follower:
        """Records from ``lsn`` on, polling for new ones (see :class:`Follower`)."""
        return Follower(DirSource(self.path), lsn, follow=True, timeout=timeout)

    @property
    def first_lsn(self) -> int | None:
        segs = DirSource(self.path).segments()
        return segs[0].first_lsn if segs else None

    def close(self) -> None:
        pass


def follow_dir(path: str | os.PathLike[str], lsn: int | None = None, *,
               timeout: float | None = None) -> Follower:
    """Follow the log in ``path`` from another process: ``Wal.reader(path).follow(lsn)``."""
    return WalReader(path).follow(lsn, timeout=timeout)
