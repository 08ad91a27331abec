"""Bounded-memory sort of index entries: sorted runs spilled to scratch files, then a
k-way merge (heapq.merge).

Run file record: u16 key length, u32 data length, key, data (little-endian). Run
files are scratch, not state: a crash leaves them behind, the next rebuild deletes
the directory first, so they are neither fsynced nor written through the
``faults.fileio`` seam.
"""
from __future__ import annotations

import heapq
import itertools
import os
import shutil
import struct
import tempfile
from typing import BinaryIO, Iterator

import faults

from .errors import OutOfDiskError

_REC = struct.Struct("<HI")
# CPython: a bytes object is 33 bytes + its length; a list slot is 8 more.
_KEY_OVERHEAD = 41
_EXTRA_OVERHEAD = 120      # dict slot + data bytes object header
_IO_BUFFER = 1 << 20
DEFAULT_MEMORY = 256 << 20


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
        try:
            with open(path, "wb", buffering=_IO_BUFFER) as f:
                pack, write, get = _REC.pack, f.write, extra.get
                for k in keys:
                    d = get(k, b"")
                    write(pack(len(k), len(d)))
                    write(k)
                    if d:
                        write(d)
        except OSError as e:
            raise faults.translate_os_error(e, path, None, OutOfDiskError) from e
        self.runs.append(path)
        self.count += len(keys)
        keys.clear()
        self._extra, self._bytes, self._counted = {}, 0, 0

    # -- merging ------------------------------------------------------------------
    def sorted(self) -> Iterator[tuple[bytes, bytes]]:
        """All pairs in key order (equal keys stay adjacent; the loader drops repeats)."""
        self.check()
        self._keys.sort()
        mem = self._memory_run()
        if not self.runs:
            return mem
        files = [open(p, "rb", buffering=_IO_BUFFER) for p in self.runs]
        self._files = files
        return heapq.merge(*(_read_run(f) for f in files), mem)

    def _memory_run(self) -> Iterator[tuple[bytes, bytes]]:
        keys, extra = self._keys, self._extra
        if not extra:
            return zip(keys, itertools.repeat(b""))
        return ((k, extra.get(k, b"")) for k in keys)

    def close(self) -> None:
        for f in getattr(self, "_files", []):
            f.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self._keys.clear()
        self._extra = {}


def _read_run(f: BinaryIO) -> Iterator[tuple[bytes, bytes]]:
    read, unpack, size = f.read, _REC.unpack, _REC.size
    while True:
        head = read(size)
        if not head:
            return
        kl, dl = unpack(head)
        k = read(kl)
        yield (k, read(dl) if dl else b"")
