"""Bounded-memory sort of index entries: sorted runs spilled to scratch files, then a
block-wise k-way merge.

Run file: blocks of ``u32 length | marshal((sorted keys, {key: data} of those keys
with data))``; marshal reads and writes lists of bytes in C, which a per-record
format parsed in Python cannot match. Run files are scratch, not state, and only
this process reads them: a crash leaves them behind, the next rebuild deletes the
directory first, so they are neither fsynced nor written through the
``faults.fileio`` seam.
"""
from __future__ import annotations

import bisect
import itertools
import marshal
import os
import shutil
import struct
import tempfile
from typing import BinaryIO, Iterator

import faults

from .errors import OutOfDiskError

_BLOCK = struct.Struct("<I")
# CPython: a bytes object is 33 bytes + its length; a list slot is 8 more.
_KEY_OVERHEAD = 41
_EXTRA_OVERHEAD = 120      # dict slot + data bytes object header
_IO_BUFFER = 1 << 20
DEFAULT_MEMORY = 256 << 20
# what a buffered key / data value costs in memory, for other bounded buffers of keys
KEY_OVERHEAD, EXTRA_OVERHEAD = _KEY_OVERHEAD, _EXTRA_OVERHEAD


class ExternalSorter:
    """Collect (key, data) pairs, then yield them in key order.

    Most index entries have empty data, so keys are kept in a plain list (fast to sort
    in C) and the few non-empty data values beside it in a dict.
    """

    def __init__(self, scratch_dir: str, memory_limit: int = DEFAULT_MEMORY) -> None:
        self.scratch_dir = scratch_dir
        self.memory_limit = memory_limit
        self.count = 0
        self.runs: list[str] = []
        self._keys: list[bytes] = []
        self._extra: dict[bytes, bytes] = {}
        self._bytes = 0
        self._counted = 0           # keys whose size is in _bytes
        self._dir: str | None = None
        # The hot path appends with the bound method of the one list (emptied in
        # place on spill) and calls check() now and then, not per key.
        self.append = self._keys.append

    def add(self, key: bytes) -> None:
        self.append(key)
        self.check()

    def add_with_data(self, key: bytes, data: bytes) -> None:
        self._extra[key] = data
        self._bytes += len(data) + _EXTRA_OVERHEAD
        self.append(key)

    def check(self) -> None:
        """Spill a sorted run when the buffered entries exceed the memory limit."""
        keys = self._keys
        if len(keys) > self._counted:
            new = keys[self._counted:]
            self._bytes += sum(map(len, new)) + _KEY_OVERHEAD * len(new)
            self._counted = len(keys)
        if self._bytes > self.memory_limit:
            self._spill()

    def __len__(self) -> int:
        return self.count + len(self._keys)

    # -- spilling -----------------------------------------------------------------
    def _spill(self) -> None:
        if self._dir is None:
            os.makedirs(self.scratch_dir, exist_ok=True)
            self._dir = tempfile.mkdtemp(prefix="sort-", dir=self.scratch_dir)
        path = os.path.join(self._dir, f"run-{len(self.runs):05d}")
        keys, extra = self._keys, self._extra
        keys.sort()
        block = self._block_keys(keys)
        try:
            with open(path, "wb", buffering=_IO_BUFFER) as f:
                for i in range(0, len(keys), block):
                    blk = keys[i:i + block]
                    ex = {k: extra[k] for k in blk if k in extra} if extra else {}
                    payload = marshal.dumps((blk, ex))
                    f.write(_BLOCK.pack(len(payload)))
                    f.write(payload)
        except OSError as e:
            raise faults.translate_os_error(e, path, None, OutOfDiskError) from e
        self.runs.append(path)
        self.count += len(keys)
        keys.clear()
        self._extra, self._bytes, self._counted = {}, 0, 0

    def spill_all(self) -> list[str]:
        """Spill what is buffered as a last run; the run files (left in place: a scan
        worker hands them to the process that merges)."""
        self.check()
        if self._keys:
            self._spill()
        return list(self.runs)

    def adopt(self, runs: list[str], count: int) -> None:
        """Merge ``runs`` (written by another sorter's spill_all, ``count`` keys in
        all) with this sorter's own. Their files are removed with the scratch tree."""
        self.runs.extend(runs)
        self.count += count

    def _block_keys(self, keys: list[bytes]) -> int:
        """Keys per run block: about min(1 MiB, memory_limit / 16) of buffered keys, so
        that the merge, which holds one block per run, stays small next to the limit."""
        if not keys:
            return 1
        per_key = self._bytes / len(keys) if self._bytes else 64.0
        return max(64, int(min(_IO_BUFFER, self.memory_limit // 16) / max(per_key, 1.0)))

    # -- merging ------------------------------------------------------------------
    def sorted_batches(self) -> Iterator[list[tuple[bytes, bytes]]]:
        """All pairs in key order, in lists (equal keys stay adjacent; the loader
        drops repeats). Builds a tuple per entry: the rebuild's loader uses
        :meth:`key_batches` instead."""
        for keys, extra in self.key_batches():
            for i in range(0, len(keys), 65536):
                yield _with_data(keys[i:i + 65536], [extra] if extra else [])

    def key_batches(self) -> Iterator[tuple[list[bytes], dict[bytes, bytes]]]:
        """All keys in key order, in lists, each with a dict holding the data of those
        of its keys that have any (it may hold other keys too; a key it lacks has
        empty data). No per-entry object is built.

        All keys in memory (no run spilled, the common case for one partition): one
        ``list.sort`` and the buffer itself, once. Otherwise a k-way merge a block at
        a time: with one block of every run in memory, every key up to the smallest
        last key of those blocks can be handed out, so those prefixes are gathered and
        ordered by one ``list.sort`` (timsort merges presorted runs in C); at least
        one block is used up per round."""
        self.check()
        self._keys.sort()
        if not self.runs:
            if self._keys:
                yield self._keys, self._extra
            return
        files = [open(p, "rb", buffering=_IO_BUFFER) for p in self.runs]
        self._files = files
        cursors = [_Cursor(_read_run(f)) for f in files]
        cursors.append(_Cursor(iter([(self._keys, self._extra)])))
        live = [c for c in cursors if c.advance()]
        while live:
            bound = min(c.keys[-1] for c in live)
            out: list[bytes] = []
            extras: list[dict[bytes, bytes]] = []
            for c in live:
                end = bisect.bisect_right(c.keys, bound, c.pos)
                if end > c.pos:
                    out += c.keys[c.pos:end]
                    c.pos = end
                    if c.extra:
                        extras.append(c.extra)
            out.sort()
            yield out, merged_data(extras)
            live = [c for c in live if c.pos < len(c.keys) or c.advance()]

    def sorted(self) -> Iterator[tuple[bytes, bytes]]:
        """All pairs in key order, one at a time."""
        return itertools.chain.from_iterable(self.sorted_batches())

    def close(self) -> None:
        for f in getattr(self, "_files", []):
            f.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self._keys.clear()
        self._extra = {}


class _Cursor:
    """The current block of one sorted run and the position in it."""

    __slots__ = ("blocks", "keys", "extra", "pos")

    def __init__(self, blocks: Iterator[tuple[list[bytes], dict[bytes, bytes]]]) -> None:
        self.blocks = blocks
        self.keys: list[bytes] = []
        self.extra: dict[bytes, bytes] = {}
        self.pos = 0

    def advance(self) -> bool:
        """Load the next non-empty block; False at the end of the run."""
        for keys, extra in self.blocks:
            if keys:
                self.keys, self.extra, self.pos = keys, extra, 0
                return True
        return False


def merged_data(extras: list[dict[bytes, bytes]]) -> dict[bytes, bytes]:
    """One dict of the data of several blocks' keys (the one itself when alone)."""
    if len(extras) == 1:
        return extras[0]
    merged: dict[bytes, bytes] = {}
    for e in extras:
        merged.update(e)
    return merged


def _with_data(keys: list[bytes], extras: list[dict[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    if not extras:
        return list(zip(keys, itertools.repeat(b"")))
    if len(extras) == 1:
        get = extras[0].get
    else:
        merged: dict[bytes, bytes] = {}
        for e in extras:
            merged.update(e)
        get = merged.get
    return [(k, get(k, b"")) for k in keys]


def _read_run(f: BinaryIO) -> Iterator[tuple[list[bytes], dict[bytes, bytes]]]:
    read, unpack, size = f.read, _BLOCK.unpack, _BLOCK.size
    while True:
        head = read(size)
        if not head:
            return
        (n,) = unpack(head)
        yield marshal.loads(read(n))
