"""The one apply path of a move: the temp-WAL replay (files mode) and the supply
batches and catch-up of the messages mode all go through :func:`apply_chunked`."""
from __future__ import annotations

from .ports import PartitionData, Updates

APPLY_CHUNK = 2048         # messages mode: records per WAL batch / durability wait / index commit
APPLY_CHUNK_BYTES = 4 << 20


def apply_chunked(data: PartitionData, p: int, updates: Updates,
                  max_records: int = APPLY_CHUNK, max_bytes: int = APPLY_CHUNK_BYTES, *,
                  logged: bool = True) -> int:
    """Apply ``(key, value or None, counter)`` updates of p (partition lock held) in
    chunks of at most ``max_records`` records / ``max_bytes`` (the messages mode: a
    supply message's APPLY_CHUNK / APPLY_CHUNK_BYTES): each chunk ONE WAL batch,
    ONE durability wait and ONE index commit (``CacheData.apply_many``); counters at or
    below the partition's are skipped. Returns how many were applied. Both the temp-WAL
    replay (``logged=False``: no WAL batch, no wait) and the messages mode's supply
    batches and catch-up go through here."""
    done = 0
    chunk: Updates = []
    size = 0
    for u in updates:
        chunk.append(u)
        size += len(u[0]) + len(u[1] or b"")
        if len(chunk) >= max_records or size >= max_bytes:
            done += data.apply_many(p, chunk, logged=logged)
            chunk, size = [], 0
    if chunk:
        done += data.apply_many(p, chunk, logged=logged)
    return done
