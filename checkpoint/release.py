"""Freeing the blocks of a partition file that loses its last name, off the caller's path.

When a file's last name goes (``os.replace`` over it, ``os.unlink``) and no descriptor
holds it, the call that removed the name frees its blocks. On ext4 that takes about
10 ms for a 10 MB file (measured on the development VM: 9.3-10.4 ms for 11 MB), and the
store does it under its checkpoint lock: every install of a moved partition and every
eviction held the checkpointer, and the move waiting for it, that long.

:meth:`Releaser.hold` opens the file before its name goes; the name then goes at once
(the inode lives on while the descriptor is open), and :meth:`Releaser.release` hands
the descriptor to one background thread that closes it: the blocks are freed there.
Nothing durable depends on that close: the name's removal is what the directory fsync
makes durable, and a crash before the close frees the blocks at the next mount as it
would for any unlinked file that was open.

Only with the real file layer: a swapped-in layer (fault injection, the power-loss
layer) sees every file operation itself, so :meth:`hold` answers None there and the
caller's operation frees the blocks as before.
"""
from __future__ import annotations

import os
import queue
import threading

from faults import fileio


class Releaser:
    """One daemon thread that closes the descriptors handed to it, in order."""

    def __init__(self, name: str = "ferry-release") -> None:
        self._name = name
        self._q: queue.Queue[int | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @staticmethod
    def hold(path: str) -> int | None:
        """A read-only descriptor of ``path`` (never through a link), or None: no such
        regular file, or a swapped-in file layer (see the module doc)."""
        if type(fileio.layer()) is not fileio.FileLayer:
            return None
        try:
            return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None

    def release(self, fd: int | None) -> None:
        """Close ``fd`` on the background thread (None: nothing to do)."""
        if fd is None:
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._q.put(fd)

    def drain(self) -> None:
        """Return once every descriptor handed over so far is closed."""
        self._q.join()

    def close(self) -> None:
        """Close what is pending and end the thread."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is not None and thread.is_alive():
                self._q.put(None)
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            fd = self._q.get()
            try:
                if fd is None:
                    return
                try:
                    os.close(fd)
                except OSError:
                    pass                  # nothing to undo: the name is already gone
            finally:
                self._q.task_done()
