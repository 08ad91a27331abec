"""Resume after SIGKILL of the supplier or the demander (real processes, real crash points)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from transfer import Demander, DirectoryStorage, PeerClosed
from transfer_helpers import SECRET, read, write_part

MB = 1 << 20
FERRY = [sys.executable, "-c", "from ferry.cli import main; main()"]


class Served:
    """``ferry transfer serve`` in a child process."""

    def __init__(self, directory: str, secret_file: str, env: dict[str, str], crash: str | None = None) -> None:
        env = dict(env)
        if crash:
            env["FERRY_CRASH"] = crash
        self.proc = subprocess.Popen(FERRY + ["transfer", "serve", "--dir", directory, "--port", "0",
                                              "--secret-file", secret_file],
                                     env=env, stderr=subprocess.PIPE, text=True)
        line = self.proc.stderr.readline()
        assert line.startswith("serving "), line
        self.peer = line.rsplit(" ", 1)[1].strip()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        # drain stderr while waiting: a server blocked writing its log into a full pipe
        # (this test reads only the first line) cannot finish its shutdown
        self.proc.communicate(timeout=20)
        return self.proc.returncode


def _leftovers(d: str) -> list[str]:
    return sorted(f for f in os.listdir(d) if "ferry" in f)


@pytest.mark.slow
def test_supplier_sigkilled_at_half_resume_sends_at_most_55_percent(src, dst, secret_file, py_env) -> None:
    size = 256 * MB
    data = write_part(src, 0, size)
    s = Served(src, secret_file, py_env, crash="supplier.mid_send:32")    # 32 of 64 chunks of 4 MiB
    d = Demander(DirectoryStorage(dst), s.peer, SECRET)
    with pytest.raises(PeerClosed):
        d.fetch(0)
    assert s.proc.wait(10) == -signal.SIGKILL
    assert not os.path.exists(os.path.join(dst, "part-0.bin"))
    s2 = Served(src, secret_file, py_env)
    try:
        res = Demander(DirectoryStorage(dst), s2.peer, SECRET).fetch(0)
    finally:
        s2.stop()
    assert res.bytes_wire <= 0.55 * size, f"{res.bytes_wire / size:.0%} crossed the wire again"
    assert res.bytes_reused + res.bytes_wire == size
    assert read(os.path.join(dst, "part-0.bin")) == data
    assert _leftovers(dst) == []


def test_supplier_sigkilled_after_snapshot(src, dst, secret_file, py_env) -> None:
    data = write_part(src, 1, 2 * MB)
    s = Served(src, secret_file, py_env, crash="supplier.after_snapshot:1")
    with pytest.raises(PeerClosed) as ei:
        Demander(DirectoryStorage(dst), s.peer, SECRET).fetch(1)
    assert ei.value.stage == "manifest"
    assert s.proc.wait(10) == -signal.SIGKILL
    s2 = Served(src, secret_file, py_env)
    try:
        Demander(DirectoryStorage(dst), s2.peer, SECRET).fetch(1)
    finally:
        s2.stop()
    assert read(os.path.join(dst, "part-1.bin")) == data


def _fetch_in_child(peer: str, dst: str, p: int, secret_file: str, env: dict[str, str], crash: str) -> int:
    env = dict(env, FERRY_CRASH=crash)
    return subprocess.run(FERRY + ["transfer", "fetch", peer, "--partition", str(p), "--dest", dst,
                                   "--secret-file", secret_file, "--retries", "0"],
                          env=env, capture_output=True, timeout=60).returncode


def test_demander_sigkilled_mid_receive_resumes(server, src, dst, secret_file, py_env) -> None:
    from transfer_helpers import peer_of
    data = write_part(src, 2, 80 * MB)
    rc = _fetch_in_child(peer_of(server), dst, 2, secret_file, py_env, "demander.mid_receive:10")  # 40 MiB
    assert rc == -signal.SIGKILL
    assert not os.path.exists(os.path.join(dst, "part-2.bin"))
    assert _leftovers(dst) == ["part-2.bin.ferry-resume", "part-2.bin.ferry-tmp"]
    res = Demander(DirectoryStorage(dst), peer_of(server), SECRET).fetch(2)
    # verified chunks are made durable every 32 MiB: the first 32 survive the kill
    assert res.bytes_reused >= 32 * MB and res.bytes_wire <= 48 * MB
    assert read(os.path.join(dst, "part-2.bin")) == data


def test_demander_sigkilled_before_install_resends_nothing(server, src, dst, secret_file, py_env) -> None:
    from transfer_helpers import peer_of
    data = write_part(src, 3, 5 * MB + 17)
    rc = _fetch_in_child(peer_of(server), dst, 3, secret_file, py_env, "demander.before_install:1")
    assert rc == -signal.SIGKILL
    assert not os.path.exists(os.path.join(dst, "part-3.bin"))
    res = Demander(DirectoryStorage(dst), peer_of(server), SECRET).fetch(3)
    assert res.bytes_wire == 0 and res.bytes_reused == len(data)
    assert read(os.path.join(dst, "part-3.bin")) == data


def test_torn_and_lying_resume_records_are_refetched(server, src, dst) -> None:
    from transfer_helpers import Proxy, peer_of
    data = write_part(src, 4, 6 * MB)
    proxy = Proxy(server.address, cut_after=3 * MB + 500)
    with pytest.raises(PeerClosed):
        Demander(DirectoryStorage(dst), proxy.peer, SECRET, sync_bytes=MB, chunk_size=MB).fetch(4)
    tmp = os.path.join(dst, "part-4.bin.ferry-tmp")
    journal = os.path.join(dst, "part-4.bin.ferry-resume")
    from transfer.resume import Receiving
    r = Receiving(os.path.join(dst, "part-4.bin"), MB)
    held = sorted(r.held)
    r.close()
    assert len(held) >= 2 and held[0] == 0, held
    with open(journal, "ab") as f:
        f.write(b"\x01\x02\x03")                 # torn tail
    with open(tmp, "r+b") as f:                   # chunk 0 damaged after being recorded
        f.write(b"rot")
    res = Demander(DirectoryStorage(dst), peer_of(server), SECRET).fetch(4)
    assert res.bytes_reused >= MB and res.bytes_wire >= MB    # chunk 0 fetched again
    assert read(os.path.join(dst, "part-4.bin")) == data


# -- a file of at most one chunk: nothing to resume from, so no journal is kept
def _count_journals(monkeypatch) -> list[str]:
    from transfer.resume import Receiving
    made: list[str] = []
    real = Receiving._new_journal

    def spy(self: Receiving) -> None:
        made.append(self.journal_path)
        real(self)
    monkeypatch.setattr(Receiving, "_new_journal", spy)
    return made


@pytest.mark.parametrize("size", [0, 1, MB, 4 * MB], ids=["empty", "1-byte", "1MiB", "exactly-one-chunk"])
def test_fetch_of_at_most_one_chunk_writes_no_journal(server, src, dst, monkeypatch, size) -> None:
    from transfer_helpers import peer_of
    made = _count_journals(monkeypatch)
    data = write_part(src, 5, size)
    res = Demander(DirectoryStorage(dst), peer_of(server), SECRET).fetch(5)    # 4 MiB chunks
    assert res.verified and res.bytes == size                 # type: ignore[attr-defined]
    assert read(os.path.join(dst, "part-5.bin")) == data
    assert made == [] and _leftovers(dst) == []


def test_fetch_of_two_chunks_still_keeps_a_journal(server, src, dst, monkeypatch) -> None:
    from transfer_helpers import peer_of
    made = _count_journals(monkeypatch)
    data = write_part(src, 6, 4 * MB + 1)
    Demander(DirectoryStorage(dst), peer_of(server), SECRET).fetch(6)
    assert read(os.path.join(dst, "part-6.bin")) == data
    assert made == [os.path.join(dst, "part-6.bin.ferry-resume")] and _leftovers(dst) == []


def test_one_chunk_fetch_cut_mid_chunk_leaves_nothing_then_refetches(server, src, dst) -> None:
    from transfer_helpers import Proxy, peer_of
    data = write_part(src, 7, 3 * MB)
    proxy = Proxy(server.address, cut_after=2 * MB)
    with pytest.raises(PeerClosed):
        Demander(DirectoryStorage(dst), proxy.peer, SECRET).fetch(7)
    assert not os.path.exists(os.path.join(dst, "part-7.bin"))
    assert _leftovers(dst) == []          # nothing verified, nothing to resume: no litter
    res = Demander(DirectoryStorage(dst), peer_of(server), SECRET).fetch(7)
    assert res.bytes_wire == len(data) and read(os.path.join(dst, "part-7.bin")) == data


@pytest.mark.parametrize("crash", ["demander.mid_receive:1", "demander.before_install:1"])
def test_one_chunk_fetch_sigkilled_installs_nothing_and_refetches_whole(server, src, dst, secret_file,
                                                                        py_env, crash) -> None:
    from transfer_helpers import peer_of
    target = os.path.join(dst, "part-9.bin")
    old = write_part(dst, 9, MB + 5, seed=1)        # an older copy already installed
    data = write_part(src, 9, MB + 3)
    rc = _fetch_in_child(peer_of(server), dst, 9, secret_file, py_env, crash)
    assert rc == -signal.SIGKILL
    assert read(target) == old                       # neither replaced nor mixed
    assert "part-9.bin.ferry-resume" not in _leftovers(dst)
    res = Demander(DirectoryStorage(dst), peer_of(server), SECRET).fetch(9)
    assert res.bytes_reused == 0 and res.bytes_wire == len(data)
    assert read(target) == data and _leftovers(dst) == []
