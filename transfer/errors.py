"""The transfer package's errors: one subclass of :class:`FerryError` per kind of failure.

Every error carries, where known, the stage of the transfer, the partition and the peer,
so a log line or a CLI one-liner says where it broke without a traceback.
"""
from __future__ import annotations

from typing import Any

from faults import FerryError
from faults import OutOfDiskError as _FaultsOutOfDisk


class TransferError(FerryError):
    """Base of all transfer failures."""

    def __init__(self, message: str, *, stage: str | None = None,
                 partition: int | None = None, peer: str | None = None) -> None:
        self.reason = message
        self.stage = stage
        self.partition = partition
        self.peer = peer
        super().__init__(message)

    def where(self, *, stage: str | None = None, partition: int | None = None,
              peer: str | None = None) -> "TransferError":
        """Fill in the context fields that are still unknown (returns self)."""
        self.stage = self.stage or stage
        self.partition = self.partition if self.partition is not None else partition
        self.peer = self.peer or peer
        return self

    def __str__(self) -> str:
        ctx = [f"{k} {v}" for k, v in (("stage", self.stage), ("partition", self.partition),
                                        ("peer", self.peer)) if v is not None]
        return f"{self.reason} [{', '.join(ctx)}]" if ctx else self.reason


class FrameError(TransferError):
    """A frame broke the protocol (bad magic, version, type, length or checksum).
    ``code`` is the :class:`transfer.frames.ErrorCode` to answer with."""

    def __init__(self, code: int, message: str, **ctx: object) -> None:
        self.code = code
        super().__init__(message, **ctx)  # type: ignore[arg-type]


class PeerClosed(TransferError):
    """The peer closed the connection (cleanly between frames or in the middle of one)."""


class AuthError(TransferError):
    """The handshake failed: wrong secret, replay, or no handshake at all."""


class TlsError(AuthError):
    """A TLS handshake failed, a peer's certificate was refused, or the files do not load.
    ``detail``: what the TLS layer said, without where."""

    def __init__(self, message: str, *, detail: str = "", **ctx: Any) -> None:
        self.detail = detail
        super().__init__(message, **ctx)


class TlsCut(TlsError):
    """The network ended a TLS handshake (reset, closed, timed out): no certificate was
    refused, and trying again may work."""


class RemoteError(TransferError):
    """The peer answered with an ERROR frame."""

    def __init__(self, code: int, message: str, **ctx: object) -> None:
        self.code = code
        super().__init__(message, **ctx)  # type: ignore[arg-type]


class ChecksumError(TransferError):
    """A chunk kept failing its checksum; ``culprit`` is "wire" or "source"."""

    def __init__(self, message: str, culprit: str, **ctx: object) -> None:
        self.culprit = culprit
        super().__init__(message, **ctx)  # type: ignore[arg-type]


class PageCheckError(TransferError):
    """A received page failed the storage's page check after all chunks verified."""


class PeerUnreachable(TransferError):
    """No connection to the peer could be made."""


class BadName(TransferError):
    """A cache or partition name that is not allowed (path tricks, NUL, negatives)."""


class Busy(TransferError):
    """The supplier cannot serve this partition now (e.g. a snapshot of it is open); retry later."""


class NotHeld(TransferError):
    """The supplier does not hold the demanded partition."""


class OutOfDiskError(TransferError, _FaultsOutOfDisk):
    """The demander's file system has no room for the partition."""

    def __init__(self, path: str, needed: int | None = None, detail: str = "") -> None:
        _FaultsOutOfDisk.__init__(self, path, needed, detail)
        msg = Exception.__str__(self)
        self.reason, self.stage, self.partition, self.peer = msg, None, None, None


class UnsafePath(TransferError):
    """A path in a data directory is not what Ferry may use: a symlink, FIFO, socket,
    device, directory or hard link where a regular file or a real directory belongs.
    Refused rather than followed, so a planted link cannot lead reads or writes out of
    the data directory and a FIFO cannot make a transfer wait for ever."""


class SSHError(TransferError):
    """SSH-level failure: host key, authentication, or forwarding refused."""


class BadPage(TransferError):
    """From a storage's ``prepare_install``: page ``page`` of the received file fails
    its check (``reason``); the demander re-requests the page's chunk."""

    def __init__(self, page: int, reason: str) -> None:
        super().__init__(f"page {page}: {reason}")
        self.page, self.reason = page, reason
