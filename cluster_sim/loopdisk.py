"""A node's data directory on its own block device: an ext4 filesystem in a sparse file
behind a loop device, mounted on the data directory for one run.

Why a block device: docker's ``--device-write-bps`` / ``--device-read-bps`` (the cgroup's
blkio throttle) limit I/O per *device*, and the node's data directory otherwise shares
the host's disk with everything else. The throttle counts what the node's own
processes submit: its fsyncs and direct I/O (the WAL's syncs, the checkpoint's and the
transfer's fsyncs, LMDB's commits) wait for the limit; buffered writes that the
kernel's flusher writes back later are not charged to the node under cgroup v1 -- on
this kernel, a slow disk is a slow fsync.

Needs root, ``losetup`` and ``mkfs.ext4``, and a kernel that gives out loop devices;
:func:`permitted` probes it once and says why not.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile

from .diskfull import SimSkipped, unmount_keeping
from .errors import SimError


def _run(*argv: str) -> str:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise SimError(f"{' '.join(argv)}: {r.stderr.strip() or r.returncode}")
    return r.stdout.strip()


@functools.lru_cache(maxsize=1)
def permitted() -> tuple[bool, str]:
    """(True, "") when a loop device with a filesystem can be made and mounted here."""
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}") \
                and not os.path.exists(f"/sbin/{tool}"):
            return False, f"{tool} is not installed"
    if os.geteuid() != 0:
        return False, "loop devices need root"
    d = tempfile.mkdtemp(prefix="ferry-loop-probe-")
    disk = LoopDisk(os.path.join(d, "mnt"), size_mib=16)
    try:
        disk.mount()
        disk.unmount(keep=False)
        return True, ""
    except SimError as e:
        return False, f"this machine does not give out loop devices: {e}"
    finally:
        shutil.rmtree(d, ignore_errors=True)


class LoopDisk:
    """``size_mib`` of ext4 on a loop device, mounted at ``path`` (created empty); the
    backing file is ``path`` + ``.img`` beside it (sparse: it uses what is written)."""

    def __init__(self, path: str, size_mib: int = 256) -> None:
        self.path, self.size_mib = path.rstrip("/"), size_mib
        self.image = self.path + ".img"
        self.device = ""

    def mount(self) -> None:
        os.makedirs(self.path, exist_ok=True)
        with open(self.image, "wb") as f:
            f.truncate(self.size_mib << 20)
        try:
            self.device = _run("losetup", "--find", "--show", self.image)
            # no lazy init: the kernel's background zeroing would write to the device
            # during the run (in no container's cgroup: not throttled, but not the node's)
            _run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0",
                 self.device)
            _run("mount", self.device, self.path)
        except SimError:
            self._detach()
            raise

    def unmount(self, keep: bool = True) -> None:
        """Unmount, keeping the files (``keep``: a kept run folder must still show the
        node's data) by copying them out first; detach the device, delete the image."""
        if not self.device:
            return
        unmount_keeping(self.path, keep)
        self._detach()

    def _detach(self) -> None:
        if self.device:
            subprocess.run(["losetup", "-d", self.device], capture_output=True, timeout=60)
            self.device = ""
        try:
            os.unlink(self.image)
        except FileNotFoundError:
            pass


def require() -> None:
    """Raise :class:`SimSkipped` (with the reason) when no loop device can be had here."""
    ok, why = permitted()
    if not ok:
        raise SimSkipped(f"a slow disk needs a loop device: {why}")
