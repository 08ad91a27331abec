"""The ``index rebuild`` stage: p's indexes from the file just installed."""
from __future__ import annotations

import logging
from typing import Callable

from checkpoint import CheckpointError
from indexes import (IndexStoreError, OutOfDiskError, PartitionFileSource, Progress,
                     RebuildCancelled, RebuildResult, ScanPool, ShippedIndexRefused,
                     StreamingUnavailable)

from ..errors import NodeError, Unavailable
from .ports import PartitionData
from .stream import StreamFeed

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

    Every page of the file passed its CRC and structure checks in the install scan
    (``PartitionStore.file_checked``: and no checkpoint wrote it since), so the
    rebuild's decode checks each page's structure but not its CRC again: a corrupt
    page was refused before install, never indexed. The decode hands the index feed
    the pages' keys and values in buffers (``LiveColumns``), no object per entry.

    Should the file not read (a fault after install), the store, which reads the
    same pages through its page memory, is the fallback (in this process)."""
    path = data.store.partition_path(p)
    # The install scan checked every page of this file (CRC and structure) and nothing
    # wrote it since: the rebuild's decode does not compute the CRCs again.
    checked = getattr(data.store, "file_checked", None)
    verified = bool(checked(p)) if callable(checked) else False
    try:
        data.indexes.rebuild(p, PartitionFileSource(path, verified=verified), progress=progress,
                             pool=pool, cancel=cancel)
    except RebuildCancelled as e:
        raise Unavailable(f"index rebuild of {cache}/{p} stopped: {e}") from None
    except OutOfDiskError:
        raise                       # the index's disk: the store cannot help
    except (IndexStoreError, CheckpointError, OSError) as e:
        log.warning("stage=index cache=%s partition=%d rebuild from %s failed (%s); "
                    "rebuilding from the store", cache, p, path, e)
        data.indexes.rebuild(p, data.store, progress=progress)


def index_installed(cache: str, p: int, data: PartitionData, feed: StreamFeed | None,
                    progress: Callable[[Progress], None] | None, *,
                    pool: ScanPool | None, cancel: Callable[[], bool],
                    shipped: Callable[[], RebuildResult] | None = None) -> str:
    """The ``index rebuild`` stage: load the keys streamed while the file arrived
    (checked against the installed file, ranges that differ decoded again from it:
    the same entries as a rebuild), else rebuild from the installed file. Returns
    "shipped", "streamed" or "rebuilt".

    The rebuild is the fallback when: streaming is off (``MoveContext.stream_index``),
    the last fetch was not streamed whole (its stream thread failed, the storage has
    no pages), the streamed keys passed their memory bound, the index definitions
    changed meanwhile, or the streamed load hits a file or decode error. A resumed
    fetch is streamed too: its held chunks are decoded from the temp file at the
    start. The same argument as :func:`rebuild_installed` makes the installed file
    p's content here; the load is the rebuild's clear/load/ready, so a crash in it
    (``demander.mid_index_rebuild``) leaves p not ready and the restart starts over.

    ``shipped`` (``[rebalance] index_transfer``): first, load the index the supplier
    shipped (:func:`node.move.ship.index_shipped`); "shipped" when it passed every
    check, else the reason is logged and the stage goes on as above (whatever the
    refused load wrote is not ready, and the streamed load or the rebuild clears it)."""
    if shipped is not None:
        try:
            r = shipped()
            log.info("stage=index cache=%s partition=%d shipped index loaded: %d entries in "
                     "%.3fs", cache, p, r.entries, r.seconds)
            return "shipped"
        except OutOfDiskError:
            raise
        except ShippedIndexRefused as e:
            log.warning("stage=index cache=%s partition=%d %s; rebuilding from the file",
                        cache, p, e)
        except Unavailable as e:
            if cancel():
                raise
            log.warning("stage=index cache=%s partition=%d shipped index not received (%s); "
                        "rebuilding from the file", cache, p, e)
        except (NodeError, IndexStoreError, CheckpointError, OSError) as e:
            log.warning("stage=index cache=%s partition=%d shipped index failed (%s); "
                        "rebuilding from the file", cache, p, e)
    if feed is not None:
        path = data.store.partition_path(p)
        try:
            built = feed.result(path)
            data.indexes.load_streamed(p, built, progress=progress, cancel=cancel)
            log.info("stage=index cache=%s partition=%d streamed: %d entries, %d ranges kept, "
                     "%d decoded again at the load, %d decodes while the file arrived",
                     cache, p, built.count, built.streamed, built.redone, built.decodes)
            return "streamed"
        except RebuildCancelled as e:
            raise Unavailable(f"index load of {cache}/{p} stopped: {e}") from None
        except OutOfDiskError:
            raise
        except StreamingUnavailable as e:
            log.info("stage=index cache=%s partition=%d %s; rebuilding from the file", cache, p, e)
        except (IndexStoreError, CheckpointError, OSError) as e:
            log.warning("stage=index cache=%s partition=%d streamed load failed (%s); "
                        "rebuilding from the file", cache, p, e)
    rebuild_installed(cache, p, data, progress, pool=pool, cancel=cancel)
    return "rebuilt"
