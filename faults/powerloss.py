"""A file layer that simulates a power cut.

It passes every operation to the real file system and keeps a model of what the disk
has made durable: a file's bytes become durable at its fsync, a directory entry
(create, rename, unlink) at the fsync of its directory. :meth:`PowerLossLayer.cut`
then rewrites the real directories it has seen to hold only the durable state, the way
a machine would find them after losing power; ``keep_unsynced`` (0..1) additionally
keeps a random subset of the unsynced writes, in order, as real file systems may.

It is strict on purpose: ext4 often persists a new directory entry without a directory
fsync, but POSIX does not promise it, and code that forgets the fsync loses files on
other file systems. The layer makes such a forgotten fsync a test failure.
"""
from __future__ import annotations

import os
import random
import threading
from dataclasses import dataclass, field

from .fileio import FileLayer


@dataclass
class _Inode:
    durable: bytes                                  # content as of the last fsync
    pending: list[tuple[str, int, bytes]] = field(default_factory=list)  # unsynced ops


class PowerLossLayer(FileLayer):
    def __init__(self, *, keep_unsynced: float = 0.0, seed: int = 0) -> None:
        self.keep_unsynced = keep_unsynced
        self.rng = random.Random(seed)
        self._lock = threading.Lock()
        self._fds: dict[int, _Inode] = {}
        self._offsets: dict[int, int] = {}          # fd -> write offset (O_APPEND aware)
        self._append: set[int] = set()
        self._current: dict[str, dict[str, _Inode]] = {}   # dir -> name -> inode (live)
        self._durable: dict[str, dict[str, _Inode]] = {}   # dir -> name -> inode (durable)
        self.cut_done = False

    # -- model helpers -------------------------------------------------------------
    def _dir(self, path: str) -> tuple[str, str]:
        path = os.path.abspath(path)
        d, name = os.path.split(path)
        if d not in self._current:
            # First sight of a directory: everything already in it counts as durable.
            names: dict[str, _Inode] = {}
            for n in os.listdir(d):
                p = os.path.join(d, n)
                if os.path.isfile(p) and not os.path.islink(p):
                    with open(p, "rb") as f:
                        names[n] = _Inode(f.read())
            self._current[d] = names
            self._durable[d] = dict(names)
        return d, name

    # -- FileLayer -------------------------------------------------------------------
    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        with self._lock:
            d, name = self._dir(path)
            existed = os.path.exists(path)
            fd = os.open(path, flags, mode)
            ino = self._current[d].get(name) if existed else None
            if ino is None:
                ino = _Inode(b"")
                self._current[d][name] = ino
            if flags & os.O_TRUNC and existed:
                ino.pending.append(("truncate", 0, b""))
            self._fds[fd] = ino
            self._offsets[fd] = 0
            if flags & os.O_APPEND:
                self._append.add(fd)
            return fd

    def write(self, fd: int, data) -> int:
        data = bytes(data)
        with self._lock:
            off = os.lseek(fd, 0, os.SEEK_END) if fd in self._append else os.lseek(fd, 0, os.SEEK_CUR)
            n = os.write(fd, data)
            if fd in self._fds:
                self._fds[fd].pending.append(("write", off, data[:n]))
            return n

    def pwrite(self, fd: int, data, offset: int) -> int:
        data = bytes(data)
        with self._lock:
            n = os.pwrite(fd, data, offset)
            if fd in self._fds:
                self._fds[fd].pending.append(("write", offset, data[:n]))
            return n

    def ftruncate(self, fd: int, size: int) -> None:
        with self._lock:
            os.ftruncate(fd, size)
            if fd in self._fds:
                self._fds[fd].pending.append(("truncate", size, b""))

    def fsync(self, fd: int) -> None:
        with self._lock:
            os.fsync(fd)
            ino = self._fds.get(fd)
            if ino is not None:
                ino.durable = _apply(ino.durable, ino.pending)
                ino.pending = []

    fdatasync = fsync

    def close(self, fd: int) -> None:
        with self._lock:
            self._fds.pop(fd, None)
            self._offsets.pop(fd, None)
            self._append.discard(fd)
            os.close(fd)

    def replace(self, src: str, dst: str) -> None:
        with self._lock:
            sd, sn = self._dir(src)
            dd, dn = self._dir(dst)
            os.replace(src, dst)
            ino = self._current[sd].pop(sn, None) or _Inode(b"")
            self._current[dd][dn] = ino

    def unlink(self, path: str) -> None:
        with self._lock:
            d, name = self._dir(path)
            os.unlink(path)
            self._current[d].pop(name, None)

    def fsync_dir(self, path: str) -> None:
        with self._lock:
            d = os.path.abspath(path)
            super().fsync_dir(d)
            if d in self._current:
                self._durable[d] = dict(self._current[d])

    # -- the power cut -----------------------------------------------------------------
    def cut(self) -> None:
        """Make the real directories look as after a power loss. Close every file the
        code under test holds before calling this (a dead process holds none)."""
        with self._lock:
            for d, durable in self._durable.items():
                current = self._current[d]
                for name in set(current) | set(durable):
                    path = os.path.join(d, name)
                    ino = durable.get(name)
                    if ino is None:
                        if os.path.lexists(path):
                            os.unlink(path)
                        continue
                    kept = [op for op in ino.pending if self.rng.random() < self.keep_unsynced]
                    with open(path, "wb") as f:
                        f.write(_apply(ino.durable, kept))
            self.cut_done = True


def _apply(base: bytes, ops: list[tuple[str, int, bytes]]) -> bytes:
    buf = bytearray(base)
    for kind, off, data in ops:
        if kind == "truncate":
            del buf[off:]
        else:
            if len(buf) < off:
                buf.extend(b"\0" * (off - len(buf)))
            buf[off:off + len(data)] = data
    return bytes(buf)
