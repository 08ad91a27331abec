"""Partition file transfer: supplier and demander agents, wire protocol, sendfile and
SSH transports, resume, throttling. Knows nothing of nodes or indexes.

Public face:
- :class:`SupplierServer` (serve a storage's partitions), :class:`Demander`
  (``fetch(partition) -> FetchResult``), :class:`Progress`, :class:`FetchResult`
- storage seam: :class:`DirectoryStorage`, :class:`PartitionStoreStorage`,
  :class:`TransferStorage`, :class:`Snapshot`
- :class:`Limits` (node-wide concurrency + bytes/s, changeable), :class:`Priority`,
  :func:`parse_rate`
- :mod:`transfer.auth` (mutual HMAC handshake, ``load_secret``) and
  :mod:`transfer.frames` (versioned checksummed frames, ERROR frames), reusable by
  every Ferry protocol; :mod:`transfer.transport` (``Conn``, ``SocketConn``,
  ``ChannelConn``, ``connect_tcp``)
- :mod:`transfer.tls` (mutual TLS 1.3 with certificates instead of the secret:
  ``TlsFiles``, ``TlsContexts`` reloaded when their files change; ``SupplierServer(tls=)``,
  ``Demander(tls=, tls_peer=)``, ``FetchResult.path``, ``ktls_available``)
- :mod:`transfer.ssh` (``SSHTunnel``: reach a supplier through OpenSSH with paramiko)
- :mod:`transfer.listener` (the accept loop and handshake cap shared with the node's
  RPC server), :mod:`transfer.safefs` (opening files in data directories without
  following planted links or waiting on FIFOs)
- :mod:`transfer.splice` (the demander's zero-copy receive, socket -> pipe -> file;
  ``Demander(splice=False)`` forces the copying path, ``FetchResult.spliced`` tells)
- :func:`partial_paths` (the temp file and resume journal an unfinished fetch leaves)
- errors: :class:`TransferError` and subclasses in :mod:`transfer.errors`

The protocol is written down in docs/protocol.md.
"""
from __future__ import annotations

from .demander import Demander
from .errors import (AuthError, BadName, ChecksumError, FrameError, NotHeld, OutOfDiskError,
                     PageCheckError, PeerClosed, PeerUnreachable, RemoteError, SSHError,
                     TlsCut, TlsError, TransferError, UnsafePath)
from .limits import Limits, parse_rate
from .messages import Priority
from .receive import ReceiveObserver
from .result import FetchResult, Progress
from .resume import partial_paths
from .storage import DirectoryStorage, PartitionStoreStorage, Snapshot, TransferStorage
from .supplier import SupplierServer

__all__ = [
    "Demander", "FetchResult", "Progress", "ReceiveObserver", "SupplierServer",
    "DirectoryStorage", "PartitionStoreStorage", "Snapshot", "TransferStorage",
    "Limits", "Priority", "parse_rate", "partial_paths",
    "TransferError", "AuthError", "BadName", "ChecksumError", "FrameError", "NotHeld",
    "OutOfDiskError", "PageCheckError", "PeerClosed", "PeerUnreachable", "RemoteError",
    "SSHError", "TlsCut", "TlsError", "UnsafePath",
]
