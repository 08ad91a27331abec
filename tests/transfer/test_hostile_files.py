"""What a local user who can write a data directory can plant, and what Ferry does with it.

Tables of plants (symlinks, FIFOs, hard links, sockets, directories) on both sides:
the supplier must refuse to serve anything but a regular file beneath its directory,
without waiting on a FIFO; the demander must never write through anything planted
where it keeps its temp file or journal, and installs only the file it received.
"""
from __future__ import annotations

import logging
import os
import socket
import stat
import threading
from typing import Callable

import pytest

from transfer import Demander, DirectoryStorage, Limits, RemoteError, SupplierServer
from transfer.errors import UnsafePath
from transfer.frames import ErrorCode

from transfer_helpers import SECRET, peer_of, read, wait_until, write_part

MB = 1 << 20
OUTSIDE = b"secret data outside the data dir" * 100
pytestmark = pytest.mark.timeout(120)


def _within(seconds: float, fn: Callable[[], object]) -> object:
    """Run ``fn`` in a thread; fail (instead of hanging the suite) if it blocks."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:   # re-raised below, in the test's thread
            box["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still blocked after {seconds} s"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("result")


def _unix_socket(path: str) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()


# -- the supplier: (name, cache, plant(src, outside_dir), word expected in the refusal)
SERVED = [
    ("symlinked cache directory", "evil", lambda src, out: os.symlink(out, os.path.join(src, "evil")),
     "symlink"),
    ("symlinked partition file", "default",
     lambda src, out: os.symlink(os.path.join(out, "part-0.bin"), os.path.join(src, "part-0.bin")), "symlink"),
    ("symlinked file in a cache", "c",
     lambda src, out: (os.mkdir(os.path.join(src, "c")),
                       os.symlink(os.path.join(out, "part-0.bin"), os.path.join(src, "c", "part-0.bin"))),
     "symlink"),
    ("FIFO as partition file", "default", lambda src, out: os.mkfifo(os.path.join(src, "part-0.bin")), "FIFO"),
    ("FIFO as cache directory", "f", lambda src, out: os.mkfifo(os.path.join(src, "f")), "FIFO"),
    ("directory as partition file", "default", lambda src, out: os.mkdir(os.path.join(src, "part-0.bin")),
     "directory"),
    ("socket as partition file", "default", lambda src, out: _unix_socket(os.path.join(src, "part-0.bin")),
     "socket"),
    ("file as cache directory", "c.bin", lambda src, out: write_part(src, 0, 10) and
     os.rename(os.path.join(src, "part-0.bin"), os.path.join(src, "c.bin")), "not a directory"),
]


@pytest.mark.parametrize("name,cache,plant,word", SERVED, ids=[s[0] for s in SERVED])
def test_supplier_serves_only_regular_files_beneath_its_dir(src, dst, tmp_path, caplog, name, cache,
                                                            plant, word) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "part-0.bin").write_bytes(OUTSIDE)
    good = write_part(src, 1, 3000)
    plant(src, str(outside))
    # One transfer slot: a refusal that kept its slot (a FIFO open waiting for a writer)
    # would block the good fetch after it.
    srv = SupplierServer(DirectoryStorage(src), SECRET, limits=Limits(1), timeout=10).start()
    try:
        d = Demander(DirectoryStorage(dst), peer_of(srv), SECRET, timeout=5)
        with caplog.at_level(logging.WARNING, logger="ferry.transfer"):
            with pytest.raises(RemoteError) as ei:
                _within(30, lambda: d.fetch(0, cache=cache))
        assert ei.value.code == ErrorCode.NOT_HELD, ei.value
        assert word in str(ei.value), ei.value
        assert not os.path.exists(os.path.join(dst, cache if cache != "default" else "", "part-0.bin"))

        def logged() -> list[str]:
            return [r.getMessage() for r in caplog.records
                    if r.getMessage().startswith("supplier: transfer failed")]
        # the supplier sends its ERROR frame before it logs the failure: wait for the line
        with caplog.at_level(logging.WARNING, logger="ferry.transfer"):
            assert wait_until(lambda: any(word in m for m in logged()), 10), logged()
        _within(30, lambda: d.fetch(1))                  # the server and its slot are free
        assert read(os.path.join(dst, "part-1.bin")) == good
    finally:
        srv.stop()


# -- the demander: (name, plant(dst, victim)); a victim file outside DEST must stay as it was
def _tmp(dst: str) -> str:
    return os.path.join(dst, "part-0.bin.ferry-tmp")


def _journal(dst: str) -> str:
    return os.path.join(dst, "part-0.bin.ferry-resume")


RECEIVED = [
    ("temp file is a symlink to a victim", lambda dst, v: os.symlink(v, _tmp(dst))),
    ("temp file is a hard link to a victim", lambda dst, v: os.link(v, _tmp(dst))),
    ("temp file is a FIFO", lambda dst, v: os.mkfifo(_tmp(dst))),
    ("temp file is a socket", lambda dst, v: _unix_socket(_tmp(dst))),
    ("journal is a symlink to a victim", lambda dst, v: os.symlink(v, _journal(dst))),
    ("journal is a hard link to a victim", lambda dst, v: os.link(v, _journal(dst))),
    ("journal is a FIFO", lambda dst, v: os.mkfifo(_journal(dst))),
    ("journal's temp file is a symlink to a victim", lambda dst, v: os.symlink(v, _journal(dst) + ".tmp")),
    ("journal's temp file is a FIFO", lambda dst, v: os.mkfifo(_journal(dst) + ".tmp")),
]


@pytest.mark.parametrize("name,plant", RECEIVED, ids=[r[0] for r in RECEIVED])
def test_demander_never_writes_through_planted_files(server, src, dst, tmp_path, name, plant) -> None:
    data = write_part(src, 0, 3 * MB + 17)
    victim = tmp_path / "victim"
    victim.write_bytes(OUTSIDE)
    plant(dst, str(victim))
    d = Demander(DirectoryStorage(dst), peer_of(server), SECRET, timeout=10, chunk_size=MB)
    res = _within(30, lambda: d.fetch(0))
    assert victim.read_bytes() == OUTSIDE                 # not a byte written into it
    target = os.path.join(dst, "part-0.bin")
    assert stat.S_ISREG(os.lstat(target).st_mode) and os.lstat(target).st_nlink == 1
    assert read(target) == data and res.verified          # type: ignore[attr-defined]
    assert sorted(os.listdir(dst)) == ["part-0.bin"]      # nothing planted left behind


def test_demander_refuses_a_symlinked_cache_directory(server, src, dst, tmp_path) -> None:
    write_part(os.path.join(src, "evil"), 0, 3000)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, os.path.join(dst, "evil"))
    with pytest.raises(UnsafePath, match="symlink"):
        Demander(DirectoryStorage(dst), peer_of(server), SECRET, timeout=10).fetch(0, cache="evil")
    assert os.listdir(outside) == []                      # nothing created out there


def test_temp_file_swapped_for_a_link_before_install_is_not_installed(server, src, dst, tmp_path) -> None:
    """Only the file received is renamed into place: a link swapped in at the temp path
    after the data was verified must not become part-0.bin."""
    write_part(src, 0, 2 * MB)
    victim = tmp_path / "victim"
    victim.write_bytes(OUTSIDE)

    def swap(ev) -> None:
        if ev.stage == "verify" and ev.total and ev.done == ev.total and not os.path.islink(_tmp(dst)):
            os.unlink(_tmp(dst))
            os.symlink(victim, _tmp(dst))
    with pytest.raises(UnsafePath, match="nothing installed"):
        Demander(DirectoryStorage(dst), peer_of(server), SECRET, timeout=10,
                 chunk_size=MB).fetch(0, progress=swap)
    assert not os.path.lexists(os.path.join(dst, "part-0.bin"))
    assert victim.read_bytes() == OUTSIDE
