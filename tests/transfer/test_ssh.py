"""Encrypted mode against a real OpenSSH server on loopback with throwaway keys."""
from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time

import pytest

from transfer import Demander, DirectoryStorage, PeerClosed
from transfer.ssh import SSHError, SSHTunnel
from transfer_helpers import SECRET, Proxy, read, write_part
from node.listen_ports import free_port

SSHD = "/usr/sbin/sshd"
MB = 1 << 20

pytestmark = [pytest.mark.ssh,
              pytest.mark.skipif(not os.path.exists(SSHD) or shutil.which("ssh-keygen") is None,
                                 reason="needs OpenSSH's sshd and ssh-keygen (openssh-server)")]



class Sshd:
    def __init__(self, root: str) -> None:
        self.root = root
        self.user = getpass.getuser()
        for name in ("host", "user", "other_host"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{root}/{name}"], check=True)
        with open(f"{root}/user.pub") as f, open(f"{root}/authorized_keys", "w") as out:
            out.write(f.read())
        os.makedirs("/run/sshd", exist_ok=True)   # sshd's privilege-separation directory
        self.port = free_port()
        with open(f"{root}/sshd_config", "w") as f:
            f.write(f"""Port {self.port}
ListenAddress 127.0.0.1
HostKey {root}/host
PidFile {root}/sshd.pid
AuthorizedKeysFile {root}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
AllowTcpForwarding yes
LogLevel ERROR
""")
        with open(f"{root}/host.pub") as f:
            key = f.read().split()[:2]
        self.known_hosts = f"{root}/known_hosts"
        with open(self.known_hosts, "w") as f:
            f.write(f"[127.0.0.1]:{self.port} {key[0]} {key[1]}\n")
        self.key = f"{root}/user"
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", f"{root}/sshd_config"],
                                     stderr=open(f"{root}/sshd.log", "w"))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError("sshd exited: " + open(f"{root}/sshd.log").read())
                time.sleep(0.05)
        raise RuntimeError("sshd did not start listening")

    def tunnel(self, **kw) -> SSHTunnel:
        kw.setdefault("key_filename", self.key)
        kw.setdefault("known_hosts", self.known_hosts)
        return SSHTunnel(self.user, "127.0.0.1", self.port, **kw)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    d = Sshd(str(tmp_path_factory.mktemp("sshd")))
    yield d
    d.stop()


def test_fetch_through_ssh(sshd, server, src, dst) -> None:
    data = write_part(src, 1, 3 * MB + 5)
    with sshd.tunnel() as t:
        d = Demander(DirectoryStorage(dst), "ssh", SECRET, connect=t.connector(*server.address))
        res = d.fetch(1)
        assert res.verified and res.bytes_wire == len(data)
        write_part(src, 2, MB)
        d.fetch(2)                       # a second channel over the same SSH connection
    assert read(os.path.join(dst, "part-1.bin")) == data


def test_ssh_resume_after_cut(sshd, server, src, dst) -> None:
    data = write_part(src, 3, 6 * MB)
    cut = Proxy(server.address, cut_after=3 * MB)      # the supplier side breaks off mid-send
    with sshd.tunnel() as t:
        with pytest.raises(PeerClosed):
            Demander(DirectoryStorage(dst), "ssh", SECRET, connect=t.connector(*cut.address),
                     sync_bytes=MB, chunk_size=MB).fetch(3)
        res = Demander(DirectoryStorage(dst), "ssh", SECRET, connect=t.connector(*server.address)).fetch(3)
    assert res.bytes_reused >= 2 * MB
    assert read(os.path.join(dst, "part-3.bin")) == data


def test_unknown_host_key_refused(sshd, tmp_path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(SSHError, match="not in .*known_hosts"):
        sshd.tunnel(known_hosts=str(empty)).open_channel("127.0.0.1", 1)


def test_host_key_mismatch_refused(sshd, tmp_path) -> None:
    other = open(os.path.join(sshd.root, "other_host.pub")).read().split()
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{sshd.port} {other[0]} {other[1]}\n")
    with pytest.raises(SSHError, match="HOST KEY MISMATCH"):
        sshd.tunnel(known_hosts=str(kh)).open_channel("127.0.0.1", 1)


def test_wrong_user_key_refused(sshd) -> None:
    from transfer import AuthError
    with pytest.raises(AuthError, match="public-key authentication"):
        sshd.tunnel(key_filename=os.path.join(sshd.root, "other_host")).open_channel("127.0.0.1", 1)


def test_tunnel_to_closed_port(sshd) -> None:
    from transfer import PeerUnreachable
    with sshd.tunnel() as t:
        with pytest.raises(PeerUnreachable, match="could not open a tunnel"):
            t.open_channel("127.0.0.1", free_port())


def test_cli_fetch_over_ssh(sshd, server, src, dst, secret_file) -> None:
    import json

    from click.testing import CliRunner

    from transfer.cli import transfer
    data = write_part(src, 4, 2 * MB)
    h, p = server.address
    r = CliRunner().invoke(transfer, ["fetch", f"{h}:{p}", "--partition", "4", "--dest", dst,
                                      "--secret-file", secret_file, "--json",
                                      "--ssh", f"{sshd.user}@127.0.0.1:{sshd.port}",
                                      "--ssh-key", sshd.key, "--known-hosts", sshd.known_hosts])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["ok"] and out["partitions"][0]["bytes_wire"] == 2 * MB
    assert read(os.path.join(dst, "part-4.bin")) == data
