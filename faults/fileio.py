"""The file-I/O seam: every durable write, fsync, rename and directory fsync of Ferry
goes through the current :class:`FileLayer`.

The real layer calls ``os`` directly. Tests and the crash harness swap in another
layer (:func:`use`), e.g. one that records writes and fsyncs and, at a simulated power
cut, keeps only what was made durable. Components fetch ``layer()`` when they open a
file, so a swap applies to files opened after it. Reads do not go through the seam:
they do not change what survives a crash.
"""
from __future__ import annotations

import contextlib
import os
import stat
from typing import TYPE_CHECKING, Iterator, Sequence

from .errors import FileTooLarge, NotRegularFile, OutOfDiskError, translate_os_error  # noqa: F401 (the two: re-exported)

if TYPE_CHECKING:
    from typing_extensions import Buffer    # bytes, bytearray, memoryview, array

# Large writes of new data go into the page cache in pieces of at most this size. A
# write of 2 MiB or more lets Linux (6.x, large folios) back it with one 2 MiB folio;
# on a VM whose free memory is reported back to the host (virtio-balloon free page
# reporting) a fresh 2 MiB folio costs about 12x the CPU of the same bytes in 1 MiB
# folios (pwrite into a new file on ext4, this project's 2-vCPU VM: 440-490 MiB/s in
# 2 and 4 MiB writes, 4,900-5,800 MiB/s in 64 KiB-1 MiB writes; the same once the
# memory was freed within the last second). 1 MiB pieces cost nothing elsewhere.
WRITE_SLICE = 1 << 20
# writev takes at most this many buffers (Linux's IOV_MAX)
IOV_MAX = 1024


def iov_slices(parts: Sequence[Buffer], limit: int = WRITE_SLICE
               ) -> Iterator[tuple[list[memoryview], int]]:
    """``parts`` (the buffers of one ``writev``) regrouped into writes of at most
    ``limit`` bytes and IOV_MAX buffers each, in order; a buffer longer than what is
    left of a group is cut (views, no copy). Yields (buffers, their bytes)."""
    group: list[memoryview] = []
    size = 0
    for part in parts:
        view = memoryview(part).cast("B")
        while view:
            take = view[:limit - size]
            group.append(take)
            size += len(take)
            view = view[len(take):]
            if size == limit or len(group) == IOV_MAX:
                yield group, size
                group, size = [], 0
    if group:
        yield group, size


class FileLayer:
    """Real file I/O. Subclasses override what they need to observe or break."""

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags, mode)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        return os.write(fd, data)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def close(self, fd: int) -> None:
        os.close(fd)

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


_layer: FileLayer = FileLayer()


def layer() -> FileLayer:
    return _layer


@contextlib.contextmanager
def use(new: FileLayer) -> Iterator[FileLayer]:
    """Route file I/O through ``new`` for the duration of the block."""
    global _layer
    old, _layer = _layer, new
    try:
        yield new
    finally:
        _layer = old


def write_all(fd: int, data: bytes | memoryview, path: str, *,
              error: type[OutOfDiskError] = OutOfDiskError, io: FileLayer | None = None) -> None:
    """Write all of ``data`` (os.write may write less); ENOSPC becomes ``error``."""
    io = io or _layer
    view = memoryview(data)
    try:
        while view:
            n = io.write(fd, view[:WRITE_SLICE])
            view = view[n:]
    except OSError as e:
        raise translate_os_error(e, path, len(view), error) from e


def atomic_write(path: str, data: bytes, *, error: type[OutOfDiskError] = OutOfDiskError,
                 durable: bool = True) -> None:
    """Replace ``path`` by ``data`` so a crash leaves the old or the new file, never a
    mix: write a temp file, fsync it, rename over, fsync the directory. ``durable=False``
    skips both fsyncs: a reader sees the old or the new file whole, but a power cut may
    lose the new one (or leave it empty), for a file that is only a hint."""
    io = _layer
    tmp = f"{path}.tmp"
    # a leftover temp file (a crash) is removed, never followed: a symlink planted at
    # PATH.tmp must not make this write land in the file it points at
    for attempt in range(3):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        try:
            fd = io.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            break
        except FileExistsError:
            if attempt == 2:
                raise
    try:
        write_all(fd, data, tmp, error=error, io=io)
        if durable:
            io.fsync(fd)
    except BaseException:
        io.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    io.close(fd)
    io.replace(tmp, path)
    if durable:
        io.fsync_dir(os.path.dirname(os.path.abspath(path)))


def read_regular(path: str, limit: int | None = None) -> bytes:
    """The bytes of ``path``, a small file Ferry reads whole (config, plan, states).
    Opened non-blocking, so a FIFO in its place cannot hang the reader; anything but a
    regular file raises :class:`NotRegularFile`, one over ``limit`` bytes
    :class:`FileTooLarge` unread (at most ``limit + 1`` bytes are read if it grows
    meanwhile, so the caller's own check still sees it). OSError as it comes."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(path)
        if limit is None:
            return f.read()
        if st.st_size > limit:
            raise FileTooLarge(st.st_size)
        return f.read(limit + 1)
