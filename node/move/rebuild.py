"""The ``index rebuild`` stage: p's indexes from the file just installed."""
from __future__ import annotations

import logging
from typing import Callable

from checkpoint import CheckpointError
from indexes import (IndexStoreError, OutOfDiskError, PartitionFileSource, Progress,
                     RebuildCancelled, ScanPool)

from ..errors import Unavailable
from .ports import PartitionData

log = logging.getLogger("ferry.node.filemove")


def rebuild_installed(cache: str, p: int, data: PartitionData,
                      progress: Callable[[Progress], None] | None, *,
                      pool: ScanPool | None, cancel: Callable[[], bool]) -> None:
    """Rebuild p's indexes from the file just installed, with the page decoder's bulk
    path (``PartitionFileSource.scan_batches``, ~3x cheaper per entry than scanning
    the store). Between install and replay that file is exactly p's content:

    - the pre-images were applied to the temp file before it was verified and
      renamed into place (transfer's demander), so it is the snapshot at counter C;
    - ``install_partition`` dropped p's page memory: no dirty page of p exists, so
      no checkpoint writes the file;
    - p is MOVING and not ``direct``: every replicated update goes to the temp WAL
      (``buffer_update``), this node is not p's primary (``leads`` wants OWNING),
      and the replay, the only writer of p's data, starts after this returns;
    - eviction waits while the move is registered (reconcile skips the node's moves).

    While a CPU is idle (``[rebalance] index_offload``), the scan goes to the host's
    scan pool (``pool``, :class:`indexes.ScanPool`): decoding pages and parsing
    documents there leaves this process's GIL to the transfers, installs and replays
    of the other moves; this thread only serves page ranges, merges the sorted keys and
    loads LMDB.

    Should the file not read (a fault after install), the store, which reads the
    same pages through its page memory, is the fallback (in this process)."""
    path = data.store.partition_path(p)
    try:
        data.indexes.rebuild(p, PartitionFileSource(path), progress=progress, pool=pool, cancel=cancel)
    except RebuildCancelled as e:
        raise Unavailable(f"index rebuild of {cache}/{p} stopped: {e}") from None
    except OutOfDiskError:
        raise                       # the index's disk: the store cannot help
    except (IndexStoreError, CheckpointError, OSError) as e:
        log.warning("stage=index cache=%s partition=%d rebuild from %s failed (%s); "
                    "rebuilding from the store", cache, p, path, e)
        data.indexes.rebuild(p, data.store, progress=progress)
