"""Shared helpers of the index tests."""
from __future__ import annotations

import json

from indexes import IndexStore, keycodec
from indexes.verify import stored


def doc(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def dump(store: IndexStore, partition: int) -> list[tuple[bytes, bytes]]:
    """Every stored (LMDB key, data) of a partition, in key order."""
    return list(stored(store, partition))


def decoded(store: IndexStore, partition: int) -> list[tuple[int, object, bytes]]:
    return [keycodec.parse_entry(k, d) for k, d in dump(store, partition)]


def rank(v: object) -> tuple:
    """The documented order of index values (docs/indexes.md)."""
    if v is None:
        return (0,)
    if isinstance(v, bool):
        return (1, v)
    if isinstance(v, (int, float)):
        return (2, v)
    if isinstance(v, str):
        return (3, v.encode("utf-8", "surrogatepass"))
    return (4, v)
