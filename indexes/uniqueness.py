"""The rebuild's check of unique indexes at load: values that several primary keys
hold in the data (docs/indexes.md, "Unique indexes at load").

The keys of a load batch are sorted and start with their index id, so each unique
index is one slice of the batch; within it, a key whose ``id | encoded value`` head
equals the one before it under another primary key is a conflict. The slice is
scanned by ``_ixaccel.unique_conflicts`` when the accelerator has it, else by
:func:`conflicts_py`, its reference.
"""
from __future__ import annotations

import bisect
from . import accel, keycodec
from .results import RebuildResult


def unique_conflicts(keys: list[bytes], extra: dict[bytes, bytes], uniq: list[bytes],
                     last: bytes, res: RebuildResult, max_samples: int) -> bytes:
    """Count in ``res`` the values of unique indexes that several keys hold (the data
    came from an owner that enforced uniqueness, so this means the data is
    inconsistent: report, keep every entry, let verify and the operator decide). Each
    unique index is one slice of ``keys``, found by bisection: the other indexes'
    entries cost nothing here. ``last``: the last unique-index key seen (b"" at
    first), so a value held across two commits is counted too. Returns the new
    ``last``."""
    mod = accel.module
    scan = getattr(mod, "unique_conflicts", None) if mod is not None else None
    for u in uniq:                       # sorted, so the slices come in key order
        lo = bisect.bisect_left(keys, u)
        hi = bisect.bisect_left(keys, _after(u), lo)
        if lo == hi:
            continue
        found, last = (scan or conflicts_py)(keys, lo, hi, last)
        res.unique_conflicts += len(found)
        for i in found[:max(0, max_samples - len(res.unique_samples))]:
            k = keys[i]
            value = keycodec.parse_entry(k, extra.get(k, b""))[1]
            res.unique_samples.append(f"{value!r} held by several keys")
    return last


def conflicts_py(keys: list[bytes], lo: int, hi: int,
                  last: bytes) -> tuple[list[int], bytes]:
    """The reference of ``_ixaccel.unique_conflicts``: positions in [lo, hi) whose key
    holds the same index value as the key before it under another primary key."""
    out: list[int] = []
    lh = _head_len(last) if last else -1
    for i in range(lo, hi):
        k = keys[i]
        h = _head_len(k)
        if h == lh and k[:h] == last[:h] and k != last:
            out.append(i)
        last, lh = k, h
    return out, last


def _head_len(key: bytes) -> int:
    """Length of ``u16 id | encoded value`` at the start of a stored key."""
    return 2 + len(keycodec.split_key(key)[1])


def _after(prefix: bytes) -> bytes:
    """The smallest 2-byte index prefix after ``prefix`` (b"\\xff\\xff" + 1 sorts past
    every key of the last id)."""
    n = int.from_bytes(prefix, "big") + 1
    return n.to_bytes(2, "big") if n < 0x10000 else b"\xff\xff\xff"
