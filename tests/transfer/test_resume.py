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
