"""Opening files in a data directory without being led out of it or made to wait.

A local user who can write a data directory can plant things where Ferry expects a
regular file or directory: a symlink (to serve or overwrite a file elsewhere), a FIFO
(whose open waits for a writer for ever), a hard link (to have a victim's inode
written), a socket or a directory. Everything here refuses them:

- :func:`open_beneath` (the supplier): every directory below the root is opened with
  ``O_NOFOLLOW|O_DIRECTORY`` relative to its parent's fd, so no component can be a
  symlink, and nothing can be swapped in between a check and the open; the file itself
  with ``O_NOFOLLOW|O_NONBLOCK`` (a FIFO opens at once instead of waiting) and kept
  only if ``fstat`` says it is a regular file. ``O_NOFOLLOW`` alone covers only the
  last component.
- :func:`open_existing` / :func:`create_new` (the demander's temp file and journal):
  an existing file is kept only if it is a regular file with one link; anything else is
  unlinked (which removes the link, never its target) and a new file is created with
  ``O_CREAT|O_EXCL|O_NOFOLLOW``, so a link planted in between makes the create fail
  instead of writing through it.
- :func:`read_small` (journal headers, the cluster secret): a non-blocking open, a
  regular file only, a bounded read.

Refusals raise :class:`transfer.errors.UnsafePath` with what was found where.
"""
from __future__ import annotations

import errno
import logging
import os
import stat
from typing import Sequence

from faults import fileio

from .errors import UnsafePath

log = logging.getLogger("ferry.transfer")

# The file itself: never through a link, never waiting on a FIFO or device.
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# open() errors that mean "something other than a regular file is there"
_NOT_A_FILE = (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.ENOTDIR, errno.EOPNOTSUPP)


def kind(mode: int) -> str:
    """What a file of this mode is, for messages ('a symlink', 'a FIFO' ...)."""
    for test, name in ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a regular file"


def _what(name: str, dir_fd: int | None = None) -> str:
    try:
        return kind(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return "not a regular file"


def open_beneath(root: str, dirs: Sequence[str], name: str, flags: int = os.O_RDONLY) -> int:
    """Open ``root/dirs.../name`` so that no component below ``root`` is followed if it
    is a symlink, and only a regular file is returned (blocking mode, as usual).
    ``root`` itself is the operator's choice and may be a link. FileNotFoundError when
    something is missing; UnsafePath when something is there that must not be used."""
    fd, where = _open_dirs(root, dirs, missing_ok=False)
    try:
        try:
            f = os.open(name, flags | _FILE_FLAGS, dir_fd=fd)
        except OSError as e:
            if e.errno in _NOT_A_FILE:
                raise UnsafePath(f"{os.path.join(where, name)} is {_what(name, fd)}, not a regular "
                                 "file (links are not followed out of the data directory)") from None
            raise
    finally:
        os.close(fd)
    try:
        _require_regular(f, os.path.join(where, name))
    except BaseException:
        os.close(f)
        raise
    os.set_blocking(f, True)
    return f


def check_dirs(root: str, dirs: Sequence[str]) -> None:
    """Each of ``dirs`` below ``root`` that exists is a real directory, not a link
    (the demander's side; the ones missing are created by the caller)."""
    try:
        fd, _ = _open_dirs(root, dirs, missing_ok=True)
    except FileNotFoundError:
        return                  # not even the root yet: the caller creates it all
    os.close(fd)


def _open_dirs(root: str, dirs: Sequence[str], *, missing_ok: bool) -> tuple[int, str]:
    """An fd on the deepest of ``root/dirs...`` (each opened relative to its parent,
    never through a link) and its path; with ``missing_ok`` it stops at a missing one."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    where = root
    try:
        for d in dirs:
            try:
                sub = os.open(d, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if missing_ok:
                    break
                raise
            except OSError as e:
                if e.errno in (errno.ENOTDIR, errno.ELOOP):
                    raise UnsafePath(f"{os.path.join(where, d)} is {_what(d, fd)}, not a directory "
                                     "(links are not followed out of the data directory)") from None
                raise
            os.close(fd)
            fd, where = sub, os.path.join(where, d)
    except BaseException:
        os.close(fd)
        raise
    return fd, where


def _require_regular(fd: int, path: str, *, single_link: bool = False) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(f"{path} is {kind(st.st_mode)}, not a regular file")
    if single_link and st.st_nlink != 1:
        raise UnsafePath(f"{path} has {st.st_nlink} hard links")
    return st


def open_existing(path: str, flags: int, io: fileio.FileLayer) -> int | None:
    """Open ``path`` for the demander if it is a regular file with one link. Anything
    else found there (a symlink, FIFO, socket, a hard link to another file) is unlinked
    with a warning and None returned, as for a missing file: the caller creates it anew
    with :func:`create_new`. A directory there is refused (UnsafePath)."""
    try:
        fd = io.open(path, flags | _FILE_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno not in _NOT_A_FILE:
            raise
        remove_planted(path, io)
        return None
    try:
        _require_regular(fd, path, single_link=True)
    except UnsafePath:
        io.close(fd)
        remove_planted(path, io)
        return None
    os.set_blocking(fd, True)
    return fd


def remove_planted(path: str, io: fileio.FileLayer, *, stale_ok: bool = False) -> None:
    """Unlink what is at ``path`` (the link itself, never what it points to), with a
    warning unless ``stale_ok`` and it is a plain regular file (left by a crash)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    what = kind(st.st_mode)
    if what == "a directory":
        raise UnsafePath(f"{path} is a directory where Ferry keeps a file; remove it")
    if not (stale_ok and stat.S_ISREG(st.st_mode) and st.st_nlink == 1):
        log.warning("transfer: removed %s found at %s (not followed, not written through)",
                    what if st.st_nlink == 1 or not stat.S_ISREG(st.st_mode)
                    else f"a file with {st.st_nlink} hard links", path)
    try:
        io.unlink(path)
    except FileNotFoundError:
        pass


def create_new(path: str, flags: int, io: fileio.FileLayer, mode: int = 0o644) -> int:
    """Create ``path``, which must not exist: never opens anything planted there."""
    try:
        return io.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except FileExistsError:
        raise UnsafePath(f"{path} appeared while Ferry was creating it (something keeps "
                         "planting files there); refusing to write through it") from None


def read_small(path: str, limit: int, *, follow: bool = False) -> tuple[bytes, os.stat_result]:
    """Read a small regular file whole: at most ``limit`` bytes (UnsafePath if it is
    longer), without waiting on a FIFO. ``follow=False`` also refuses a symlink."""
    data, st = _read(path, limit + 1, follow)
    if len(data) > limit:
        raise UnsafePath(f"{path} is larger than {limit} bytes")
    return data, st


def read_head(path: str, n: int) -> bytes:
    """The first ``n`` bytes (or fewer) of a regular file that is not a link."""
    return _read(path, n, False)[0]


def _read(path: str, n: int, follow: bool) -> tuple[bytes, os.stat_result]:
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno in _NOT_A_FILE:
            raise UnsafePath(f"{path} is {_what(path)}, not a regular file") from None
        raise
    try:
        st = _require_regular(fd, path)
        chunks, size = [], 0
        while size < n:
            b = os.read(fd, n - size)
            if not b:
                break
            chunks.append(b)
            size += len(b)
        return b"".join(chunks), st
    finally:
        os.close(fd)
