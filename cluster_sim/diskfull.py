"""Disk full on one node: its data directory on a small tmpfs the harness mounts, a
filler file that leaves less free space than a move needs, and the space freed again.

Why a tmpfs: the free space must be small and exact (a real ``statvfs`` answer, real
``ENOSPC``), and nothing outside the run may fill up. Mounting needs root (or
CAP_SYS_ADMIN); :func:`permitted` probes it once and says why not, so a scenario that
needs it is refused with that reason (tests skip with it).

The transfer's free-disk check (``transfer.Demander``) wants the partition's size plus
a 64 MiB margin free before it writes a byte, so a filler that leaves ``free_mib`` <
64 MiB makes every fetch onto this disk fail *before* anything is written: the move
must report it, install nothing, keep retrying, and succeed once :meth:`free` ran.
"""
from __future__ import annotations

import errno
import functools
import os
import shutil
import subprocess
import tempfile

from .errors import SimError

FILLER = "ferry-sim-filler.bin"


class SimSkipped(SimError):
    """The machine cannot run this scenario (a prerequisite is missing); the message says which."""


@functools.lru_cache(maxsize=1)
def permitted() -> tuple[bool, str]:
    """(True, "") when this process may mount a tmpfs, else (False, why)."""
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return False, "mount/umount are not installed"
    d = tempfile.mkdtemp(prefix="ferry-sim-tmpfs-probe-")
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", d],
                           capture_output=True, text=True, timeout=20)
        if r.returncode != 0:
            return False, f"mounting a tmpfs is not permitted here: {r.stderr.strip() or r.returncode}"
        subprocess.run(["umount", d], capture_output=True, timeout=20)
        return True, ""
    except (OSError, subprocess.SubprocessError) as e:
        return False, f"mounting a tmpfs failed: {e}"
    finally:
        try:
            os.rmdir(d)
        except OSError:
            pass


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class Tmpfs:
    """A tmpfs of ``size_mib`` at ``path`` (created empty) for one run."""

    def __init__(self, path: str, size_mib: int) -> None:
        self.path, self.size_mib = path, size_mib
        self.mounted = False

    def mount(self) -> None:
        ok, why = permitted()
        if not ok:
            raise SimSkipped(f"disk-full scenarios need a tmpfs: {why}")
        os.makedirs(self.path, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size_mib}m,mode=0755",
                            "tmpfs", self.path], capture_output=True, text=True, timeout=20)
        if r.returncode != 0:
            raise SimSkipped(f"cannot mount a tmpfs on {self.path}: {r.stderr.strip()}")
        self.mounted = True

    def fill(self, free_mib: int) -> int:
        """Write a filler so that about ``free_mib`` MiB stay free; returns its size.
        Plain writes (no fallocate: tmpfs counts written pages, and so does ENOSPC)."""
        size = max(0, free_bytes(self.path) - (free_mib << 20))
        block = b"\0" * (1 << 20)
        path = os.path.join(self.path, FILLER)
        written = 0
        with open(path, "wb") as f:
            while written < size:
                try:
                    written += f.write(block[:min(size - written, len(block))])
                except OSError as e:      # filling to the last page: tmpfs says so first
                    if e.errno != errno.ENOSPC:
                        raise
                    break
            try:
                f.flush()
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
        return written

    def free(self) -> None:
        try:
            os.unlink(os.path.join(self.path, FILLER))
        except FileNotFoundError:
            pass

    def unmount(self) -> None:
        """Unmount, keeping the node's files (without the filler)."""
        if not self.mounted:
            return
        self.free()
        unmount_keeping(self.path)
        self.mounted = False


def unmount_keeping(path: str, keep: bool = True) -> None:
    """Unmount ``path``; ``keep``: with its files still there afterwards (a kept run
    folder must still show the node's data): copied out first, put back where the
    mount was."""
    copy = path.rstrip("/") + ".copy"
    if keep and os.path.isdir(path):
        shutil.copytree(path, copy, symlinks=True, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("lost+found"))
    r = subprocess.run(["umount", path], capture_output=True, timeout=60)
    if r.returncode != 0:      # a straggler holds a file: detach now, freed when it exits
        subprocess.run(["umount", "-l", path], capture_output=True, timeout=60)
    if os.path.isdir(copy):
        shutil.rmtree(path, ignore_errors=True)
        os.rename(copy, path)
