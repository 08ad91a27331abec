"""Transfer benchmark: Ferry plain, sealed, over mutual TLS and over SSH against raw
sendfile, an rsync daemon and paramiko SFTP, all on loopback with the same file, in one run.

Prints ONE JSON object: per method MB/s, ratio to raw sendfile, CPU seconds per GiB
on the sending and the receiving side; plus the rate-limit accuracy and the targets.

    .venv/bin/python bench/transfer_bench.py --quick      # 256 MiB, < 30 s
    .venv/bin/python bench/transfer_bench.py              # 1 GiB
    .venv/bin/python bench/transfer_bench.py --full       # 1 GiB and 4 GiB

Files live on tmpfs (/dev/shm) by default, so the disk does not decide the result
(pass --dir to measure on a real file system; Ferry then pays its fsyncs). The source
and every destination (raw, Ferry, rsync, SFTP) are in the same directory tree; the
raw receiver fsyncs its file at the end as Ferry does (a no-op on tmpfs).

Methods run interleaved, one round of every method after another (``--repeat``
rounds, best of each kept), so a burst of load on the shared machine hits all of
them rather than one. ``ferry_plain`` receives as ``ferry transfer fetch`` does (each
chunk read into one buffer, hashed and MACed there, then written: one pass);
``ferry_plain_splice`` is the same fetch received by splice (socket -> pipe -> file,
transfer.splice, the chunk hashed back from the page cache) for comparison.

Secret-mode fetches derive the handshake key (scrypt of the secret, about 70 ms of CPU,
transfer.auth) before the clock starts, as a node does once at its start and never per
move: the figures are the transfer's, not the start of a process. ``--cold-key``
measures instead what one ``ferry transfer fetch`` invocation pays, key derivation
included; every run reports its ``handshake_seconds`` either way.

``raw_sendfile_4m`` is the raw pair again with the receiver reading into a 4 MiB buffer
(Ferry's chunk size) instead of 1 MiB: a second reference, as the buffer size alone
changes the raw receiver's CPU on loopback.

``targets.ferry_plain_cpu_ceiling_vs_raw``: raw's CPU seconds per GiB (sender plus
receiver, medians) over ``ferry_plain``'s. When the sender and the receiver share one
machine whose cores they keep busy (2 cores here: the raw pair alone uses about 1.9),
that is the highest ratio the sealed mode can reach, since its MACs' CPU comes out of
the same cores; across two machines each side has its own.

The authenticated variants, each as a ratio to raw sendfile:

- ``ferry_unsealed``: the shared-secret handshake, then frames without the per-frame
  HMAC and file data without its Poly1305 MAC (data by sendfile). No configuration
  gives this mode; the bench strips the session's sealer on both sides right after the
  handshake to show what the MACs cost.
- ``ferry_plain``: the secret mode as ``ferry transfer fetch`` runs it, sealed frames and Poly1305 over the data.
- ``ferry_tls``: mutual TLS 1.3 with certificates from ``node.certs`` (``ferry transfer
  serve --tls-*``): no sendfile, the file read into a reused buffer and encrypted in user
  space; ``tls_path`` is what the fetch reported and ``ktls_available`` whether the
  kernel lists the ``tls`` TCP ULP (kernel TLS is detected, never used).
- ``ferry_ssh``: the secret mode through an SSH tunnel to a throwaway OpenSSH server; when
  no sshd can be started, the output says so (``ssh``) instead of a figure.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRET = "5e8a1f47c90d3b26e4a7f01c8d5b92e6"   # a random constant: weak secrets are refused
GiB = 1 << 30
WARM_KEY = True       # the demander derives the secret's handshake key before the clock starts (--cold-key: not)
PY = sys.executable


def _env(root: str = ROOT) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""), FERRY_SECRET=SECRET)
    env.pop("FERRY_CRASH", None)
    return env


def _free_port() -> int:
    from node.listen_ports import free_port
    return free_port()


def _wait_port(port: int, proc: subprocess.Popen | None = None, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}")
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def _cpu_tree(proc: subprocess.Popen) -> float:
    """CPU seconds of a server process, its live children and its reaped children."""
    p = psutil.Process(proc.pid)
    total = 0.0
    for q in [p, *p.children(recursive=True)]:
        try:
            t = q.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            pass
    return total


def _client(code: str, root: str = ROOT) -> dict:
    """Run a Python client that prints {"seconds":..., "cpu":...} as its last line."""
    # run in ``root``: ``python -c`` puts the working directory first on sys.path
    out = subprocess.run([PY, "-c", textwrap.dedent(code)], env=_env(root), cwd=root, capture_output=True, text=True,
                         timeout=900)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def _served(server: subprocess.Popen, run) -> dict:
    before = _cpu_tree(server)
    res = run()
    time.sleep(0.3)                      # let per-connection children exit and be reaped
    res["cpu_server"] = _cpu_tree(server) - before
    return res


# -- methods -----------------------------------------------------------------------
RAW_RECEIVER = """
import json, os, resource, socket, sys, time
def cpu(): r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
srv = socket.create_server(("127.0.0.1", {port}))
print("ready", flush=True)
c, _ = srv.accept()
t0, c0 = time.perf_counter(), cpu()
fd = os.open({dst!r}, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
buf = bytearray({bufsize}); view = memoryview(buf)
while True:
    n = c.recv_into(view)
    if not n: break
    os.write(fd, view[:n])
os.fsync(fd); os.close(fd)
print(json.dumps({{"seconds": time.perf_counter() - t0, "cpu": cpu() - c0}}))
"""
RAW_SENDER = """
import json, os, resource, socket, time
def cpu(): r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
s = socket.create_connection(("127.0.0.1", {port}))
c0 = cpu()
fd = os.open({src!r}, os.O_RDONLY); size = os.fstat(fd).st_size; off = 0
while off < size:
    off += os.sendfile(s.fileno(), fd, off, size - off)
s.close()
print(json.dumps({{"seconds": 0, "cpu": cpu() - c0}}))
"""


def raw_sendfile(src: str, dst: str, bufsize: int = 1 << 20) -> dict:
    port = _free_port()
    recv = subprocess.Popen([PY, "-c", RAW_RECEIVER.format(port=port, dst=dst, bufsize=bufsize)],
                            stdout=subprocess.PIPE, text=True)
    assert recv.stdout.readline().strip() == "ready"
    send = _client(RAW_SENDER.format(port=port, src=src))
    r = json.loads(recv.stdout.read().strip().splitlines()[-1])
    recv.wait()
    return {"seconds": r["seconds"], "cpu_send": send["cpu"], "cpu_recv": r["cpu"]}


FERRY_CLIENT = """
import json, resource, time, sys
from transfer import Demander, DirectoryStorage, Limits
from transfer.ssh import SSHTunnel
def cpu(): r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
connect = None
ssh = {ssh!r}
if ssh:
    t = SSHTunnel(ssh["user"], "127.0.0.1", ssh["port"], key_filename=ssh["key"], known_hosts=ssh["known_hosts"])
    connect = t.connector("127.0.0.1", {port})
tls = None
if {tls!r}:
    from transfer.tls import TlsContexts, TlsFiles
    tls = TlsContexts(TlsFiles(*{tls!r}))
if {unsealed!r}:
    import transfer.demander as dm
    _hs = dm.client_handshake
    def _unsealed(conn, secret, **kw):
        _hs(conn, secret, **kw)
        conn.sealer = None
    dm.client_handshake = _unsealed
d = Demander(DirectoryStorage({dst!r}), "127.0.0.1:{port}", {secret!r}.encode(), connect=connect,
             limits=Limits(1, {rate!r}), splice={splice!r}, tls=tls)
if {warm_key!r}:
    try:
        from transfer.auth import handshake_key     # a --baseline tree may predate it
    except ImportError:
        handshake_key = None
    if handshake_key is not None:
        handshake_key({secret!r}.encode())
c0 = cpu()
r = d.fetch(0)
print(json.dumps({{"seconds": r.seconds, "cpu": cpu() - c0, "bytes_wire": r.bytes_wire,
                  "receive_seconds": r.stages["receive"], "handshake_seconds": r.stages.get("handshake", 0.0),
                  "spliced": r.spliced, "path": r.path}}))
"""

# `ferry transfer serve` whose sessions drop the sealer after the handshake (bench only)
UNSEALED_SERVE = """
import sys
import transfer.supplier as sp
_hs = sp.server_handshake
def _unsealed(conn, secret, **kw):
    role = _hs(conn, secret, **kw)
    conn.sealer = None
    return role
sp.server_handshake = _unsealed
from ferry.cli import main
sys.argv = ["ferry"] + sys.argv[1:]
main()
"""


def ferry(serve: subprocess.Popen, port: int, dst: str, ssh: dict | None = None, rate: float | None = None,
          extra: subprocess.Popen | None = None, splice: bool = False, tls: tuple[str, ...] | None = None,
          unsealed: bool = False, root: str = ROOT) -> dict:
    def run() -> dict:
        for f in os.listdir(dst):
            os.unlink(os.path.join(dst, f))
        # an older tree's Demander has no splice=False default: pass what it is asked
        return _client(FERRY_CLIENT.format(port=port, dst=dst, secret=SECRET, ssh=ssh, rate=rate,
                                           splice=splice, tls=tls, unsealed=unsealed,
                                           warm_key=WARM_KEY and not tls), root)
    before_extra = _cpu_tree(extra) if extra else 0.0
    res = _served(serve, run)
    if extra:   # sshd encrypts on the supplier's side of the tunnel: count it there
        res["cpu_server"] += _cpu_tree(extra) - before_extra
    return {"seconds": res["seconds"], "cpu_send": res["cpu_server"], "cpu_recv": res["cpu"],
            "receive_seconds": res["receive_seconds"], "handshake_seconds": res.get("handshake_seconds", 0.0), "spliced": res["spliced"], "path": res["path"]}


def rsync_daemon(src: str, dst: str, work: str) -> dict:
    port = _free_port()
    conf = os.path.join(work, "rsyncd.conf")
    with open(conf, "w") as f:
        f.write(f"port = {port}\naddress = 127.0.0.1\nuse chroot = no\npid file = {work}/rsyncd.pid\n"
                f"uid = {os.getuid()}\ngid = {os.getgid()}\n[dst]\npath = {dst}\nread only = no\n")
    daemon = subprocess.Popen(["rsync", "--daemon", "--no-detach", f"--config={conf}"])
    try:
        _wait_port(port, daemon)

        def run() -> dict:
            for f in os.listdir(dst):
                os.unlink(os.path.join(dst, f))
            t0 = time.perf_counter()
            p = subprocess.Popen(["rsync", "--whole-file", src, f"rsync://127.0.0.1:{port}/dst/"])
            _, status, ru = os.wait4(p.pid, 0)
            if status:
                raise RuntimeError(f"rsync failed: {status}")
            return {"seconds": time.perf_counter() - t0, "cpu": ru.ru_utime + ru.ru_stime}
        res = _served(daemon, run)
    finally:
        daemon.terminate()
        daemon.wait()
    return {"seconds": res["seconds"], "cpu_send": res["cpu"], "cpu_recv": res["cpu_server"]}


SFTP_CLIENT = """
import json, resource, time, paramiko
def cpu(): r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
sock = __import__("socket").create_connection(("127.0.0.1", {port}))
t = paramiko.Transport(sock)
o = t.get_security_options()
o.ciphers = ("aes128-gcm@openssh.com",) + tuple(c for c in o.ciphers if c != "aes128-gcm@openssh.com")
t.start_client()
t.auth_publickey({user!r}, paramiko.PKey.from_path({key!r}))
sftp = paramiko.SFTPClient.from_transport(t)
c0, t0 = cpu(), time.perf_counter()
sftp.get({src!r}, {dst!r})
print(json.dumps({{"seconds": time.perf_counter() - t0, "cpu": cpu() - c0}}))
"""


class Sshd:
    """A throwaway OpenSSH server on loopback (as the tests run it)."""

    def __init__(self, work: str) -> None:
        self.dir = os.path.join(work, "sshd")
        os.makedirs(self.dir)
        for n in ("host", "user"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{self.dir}/{n}"], check=True)
        shutil.copy(f"{self.dir}/user.pub", f"{self.dir}/authorized_keys")
        os.makedirs("/run/sshd", exist_ok=True)
        self.port = _free_port()
        self.user = psutil.Process().username()
        with open(f"{self.dir}/config", "w") as f:
            f.write(f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.dir}/host\n"
                    f"PidFile {self.dir}/pid\nAuthorizedKeysFile {self.dir}/authorized_keys\n"
                    "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                    "PermitRootLogin prohibit-password\nAllowTcpForwarding yes\nLogLevel ERROR\n"
                    "Subsystem sftp internal-sftp\n")
        host = open(f"{self.dir}/host.pub").read().split()
        with open(f"{self.dir}/known_hosts", "w") as f:
            f.write(f"[127.0.0.1]:{self.port} {host[0]} {host[1]}\n")
        self.proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", f"{self.dir}/config"],
                                     stderr=subprocess.DEVNULL)
        _wait_port(self.port, self.proc)

    def spec(self) -> dict:
        return {"user": self.user, "port": self.port, "key": f"{self.dir}/user",
                "known_hosts": f"{self.dir}/known_hosts"}

    def sftp(self, src: str, dst: str) -> dict:
        res = _served(self.proc, lambda: _client(SFTP_CLIENT.format(port=self.port, user=self.user,
                                                                    key=f"{self.dir}/user", src=src, dst=dst)))
        return {"seconds": res["seconds"], "cpu_send": res["cpu_server"], "cpu_recv": res["cpu"]}

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


# -- driver ------------------------------------------------------------------------
def make_file(path: str, size: int) -> None:
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for i in range(size >> 20):
            f.write(i.to_bytes(8, "little") + block[8:])


def interleaved(methods: dict, repeat: int) -> dict[str, dict]:
    """``repeat`` rounds of every method in turn; the fastest run of each is kept."""
    runs: dict[str, list[dict]] = {name: [] for name in methods}
    for _ in range(repeat):
        for name, fn in methods.items():
            runs[name].append(fn())
    best = {name: dict(min(rs, key=lambda r: r["seconds"])) for name, rs in runs.items()}
    for name, rs in runs.items():     # CPU per side, median over the rounds (steadier than one run's)
        for side in ("cpu_send", "cpu_recv"):
            best[name][side + "_median"] = sorted(r[side] for r in rs)[len(rs) // 2]
    # the same-round ratio of every round: how much of the best-of ratio is luck
    for name in runs:
        if name != "raw_sendfile":
            best[name]["ratio_to_raw_each_round"] = [
                round(r["seconds"] / f["seconds"], 3) for r, f in zip(runs["raw_sendfile"], runs[name])]
    return best


def make_certs(work: str) -> tuple[tuple[str, str, str], tuple[str, str, str]]:
    """A CA and two node certificates (supplier n1, demander n2): (ca, cert, key) each."""
    sys.path.insert(0, ROOT)
    from node.certs import init_ca, issue
    ca_dir = os.path.join(work, "ca")
    init_ca(ca_dir, name="bench-ca")
    ca = os.path.join(ca_dir, "ca.crt")
    n1, n2 = issue(ca_dir, "n1", role="node"), issue(ca_dir, "n2", role="node")
    return (ca, n1.cert, n1.key), (ca, n2.cert, n2.key)


def _serve(src_dir: str, port: int, extra: list[str] | None = None, unsealed: bool = False,
           root: str = ROOT) -> subprocess.Popen:
    code = UNSEALED_SERVE if unsealed else "from ferry.cli import main; main()"
    return subprocess.Popen([PY, "-c", code, "transfer", "serve", "--dir", src_dir, "--port", str(port),
                             *(extra or [])], env=_env(root), cwd=root, stderr=subprocess.DEVNULL)


def bench_size(size: int, work: str, repeat: int, sshd: Sshd | None, only: set[str] | None = None,
               baseline: str | None = None) -> dict:
    src_dir, dst_dir = os.path.join(work, "src"), os.path.join(work, "dst")
    for d in (src_dir, dst_dir):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    src = os.path.join(src_dir, "part-0.bin")
    make_file(src, size)
    dst_file = os.path.join(dst_dir, "part-0.bin")
    port, uport, tport = _free_port(), _free_port(), _free_port()
    server_tls, client_tls = make_certs(os.path.join(work, f"certs-{size}"))
    serve = _serve(src_dir, port)
    serve_unsealed = _serve(src_dir, uport, unsealed=True)
    serve_tls = _serve(src_dir, tport, ["--tls-ca", server_tls[0], "--tls-cert", server_tls[1],
                                        "--tls-key", server_tls[2]])
    methods = {"raw_sendfile": lambda: raw_sendfile(src, dst_file),
               "raw_sendfile_4m": lambda: raw_sendfile(src, dst_file, 4 << 20),
               "ferry_unsealed": lambda: ferry(serve_unsealed, uport, dst_dir, unsealed=True),
               "ferry_plain": lambda: ferry(serve, port, dst_dir),
               "ferry_plain_splice": lambda: ferry(serve, port, dst_dir, splice=True),
               "ferry_tls": lambda: ferry(serve_tls, tport, dst_dir, tls=client_tls)}
    if shutil.which("rsync"):
        methods["rsync_daemon"] = lambda: rsync_daemon(src, dst_dir, work)
    if sshd:
        methods["ferry_ssh"] = lambda: ferry(serve, port, dst_dir, ssh=sshd.spec(), extra=sshd.proc)
        methods["paramiko_sftp"] = lambda: sshd.sftp(src, dst_file)
    if only:
        methods = {k: v for k, v in methods.items() if k in only or k in ("raw_sendfile", "ferry_plain")}
    servers = [(port, serve), (uport, serve_unsealed), (tport, serve_tls)]
    if baseline:
        # the same fetches by another tree's supplier and demander (``--baseline``), as
        # that tree's `ferry transfer fetch` runs them (its own splice default)
        bport, buport = _free_port(), _free_port()
        bserve = _serve(src_dir, bport, root=baseline)
        bserve_unsealed = _serve(src_dir, buport, unsealed=True, root=baseline)
        servers += [(bport, bserve), (buport, bserve_unsealed)]
        bsplice = _default_splice(baseline)
        methods["baseline_unsealed"] = lambda: ferry(bserve_unsealed, buport, dst_dir, unsealed=True,
                                                     splice=bsplice, root=baseline)
        methods["baseline_plain"] = lambda: ferry(bserve, bport, dst_dir, splice=bsplice, root=baseline)
    try:
        for pt, proc in servers:
            _wait_port(pt, proc)
        out = interleaved(methods, repeat)
    finally:
        for _, proc in servers:
            proc.terminate()
            proc.wait()
    if check(src, dst_file) is False:
        raise RuntimeError("the last fetch did not install a byte-identical file")
    raw = out["raw_sendfile"]["seconds"]
    raw4 = out["raw_sendfile_4m"]["seconds"] if "raw_sendfile_4m" in out else None
    for name, r in out.items():
        r.pop("receive_seconds", None)
        r["mb_per_s"] = round(size / 1e6 / r["seconds"], 1)
        r["ratio_to_raw_sendfile"] = round(raw / r["seconds"], 3)
        if raw4 is not None:
            r["ratio_to_raw_sendfile_4m"] = round(raw4 / r["seconds"], 3)
        r["cpu_send_s_per_gib"] = round(r.pop("cpu_send") * GiB / size, 3)
        r["cpu_recv_s_per_gib"] = round(r.pop("cpu_recv") * GiB / size, 3)
        r["cpu_send_s_per_gib_median"] = round(r.pop("cpu_send_median") * GiB / size, 3)
        r["cpu_recv_s_per_gib_median"] = round(r.pop("cpu_recv_median") * GiB / size, 3)
        r["seconds"] = round(r["seconds"], 3)
    return out


def _default_splice(root: str) -> bool:
    """The default of ``Demander(splice=...)`` in the tree at ``root``."""
    code = "import inspect, transfer; print(inspect.signature(transfer.Demander).parameters['splice'].default)"
    out = subprocess.run([PY, "-c", code], env=_env(root), cwd=root, capture_output=True, text=True, check=True)
    return out.stdout.strip() == "True"


def check(src: str, dst: str) -> bool | None:
    """Whether the last method's copy equals the source (None: no copy left)."""
    if not os.path.exists(dst):
        return None
    with open(src, "rb") as a, open(dst, "rb") as b:
        while True:
            x, y = a.read(1 << 22), b.read(1 << 22)
            if x != y:
                return False
            if not x:
                return True


def bench_rate(work: str, size: int, rate: float) -> dict:
    src_dir, dst_dir = os.path.join(work, "rsrc"), os.path.join(work, "rdst")
    os.makedirs(src_dir, exist_ok=True)
    os.makedirs(dst_dir, exist_ok=True)
    make_file(os.path.join(src_dir, "part-0.bin"), size)
    port = _free_port()
    serve = subprocess.Popen([PY, "-c", "from ferry.cli import main; main()", "transfer", "serve",
                              "--dir", src_dir, "--port", str(port), "--rate", str(int(rate))],
                             env=_env(), stderr=subprocess.DEVNULL)
    try:
        _wait_port(port, serve)
        r = ferry(serve, port, dst_dir)
    finally:
        serve.terminate()
        serve.wait()
    # The data stage: the limit governs bytes on the wire, not the handshake and manifest.
    got = size / r["receive_seconds"]
    return {"set_mb_per_s": rate / 1e6, "got_mb_per_s": round(got / 1e6, 1),
            "whole_fetch_mb_per_s": round(size / r["seconds"] / 1e6, 1),
            "error": round(got / rate - 1, 4), "bytes": size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="256 MiB, one run each (< 30 s)")
    ap.add_argument("--full", action="store_true", help="also 4 GiB")
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
                    help="where the files go (default tmpfs /dev/shm)")
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--only", default="", help="comma-separated methods to run (raw_sendfile and "
                    "ferry_plain always run), e.g. ferry_unsealed,ferry_plain_splice; skips the rate check")
    ap.add_argument("--no-ssh", action="store_true", help="do not start sshd (no ferry_ssh, paramiko_sftp)")
    ap.add_argument("--cold-key", action="store_true",
                    help="secret-mode fetches derive the handshake key inside the measured fetch, as one "
                         "`ferry transfer fetch` process does (default: before it, as a running node)")
    ap.add_argument("--baseline", default=None, metavar="DIR",
                    help="another checkout of the project (e.g. `git archive OLD | tar -x -C DIR`): its "
                    "supplier and demander run as baseline_plain and baseline_unsealed in the same rounds")
    args = ap.parse_args()
    global WARM_KEY
    WARM_KEY = not args.cold_key
    sizes = [256 << 20] if args.quick else [GiB] + ([4 * GiB] if args.full else [])
    repeat = args.repeat or (1 if args.quick else 3)
    work = tempfile.mkdtemp(prefix="ferry-bench-", dir=args.dir)
    only = {m.strip() for m in args.only.split(",") if m.strip()} or None
    have_ssh = (os.path.exists("/usr/sbin/sshd") and shutil.which("ssh-keygen") is not None
                and not args.no_ssh and (only is None or bool(only & {"ferry_ssh", "paramiko_sftp"})))
    sshd, ssh_note = None, "not run: no /usr/sbin/sshd or ssh-keygen on this machine"
    if have_ssh:
        try:
            sshd, ssh_note = Sshd(work), "OpenSSH on loopback"
        except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
            ssh_note = f"not run: sshd did not start ({e})"
    sys.path.insert(0, ROOT)
    from transfer.tls import ktls_available
    result: dict = {"bench": "transfer", "dir": args.dir, "repeat": repeat, "handshake_key": "cold" if args.cold_key else "derived before the fetch", "cpus": os.cpu_count(),
                    "files": "source and all destinations under " + work,
                    "loadavg_start": os.getloadavg()[0], "ssh": ssh_note, "baseline": args.baseline,
                    "ktls_available": ktls_available(), "sizes": {}}
    try:
        for size in sizes:
            result["sizes"][f"{size >> 20}MiB"] = bench_size(size, work, repeat, sshd, only, args.baseline)
        # A rate the loaded machine can surely deliver: 40% of what Ferry reached
        # unthrottled in this run (at most 100 MB/s), for about 3 seconds of data.
        plain = result["sizes"][f"{sizes[0] >> 20}MiB"]["ferry_plain"]["mb_per_s"] * 1e6
        rate = min(100e6, 0.4 * plain)
        if only is None:
            result["rate_limit"] = bench_rate(work, int(rate * 3) >> 20 << 20, rate)
    finally:
        if sshd:
            sshd.stop()
        shutil.rmtree(work, ignore_errors=True)
    first = result["sizes"][f"{sizes[0] >> 20}MiB"]
    t: dict[str, object] = {}
    t["ferry_plain_vs_raw_sendfile"] = first["ferry_plain"]["ratio_to_raw_sendfile"]
    t["ferry_plain_vs_raw_ok(>=0.85)"] = t["ferry_plain_vs_raw_sendfile"] >= 0.85
    each = sorted(first["ferry_plain"].get("ratio_to_raw_each_round", []))
    if each:
        t["ferry_plain_vs_raw_median_round"] = each[len(each) // 2]
    # With both ends on one machine, the pair's CPU seconds per GiB (sender + receiver,
    # medians) bound the rate when the cores are all busy: raw's sum over Ferry's is
    # the ratio Ferry can reach here at most, whatever its pipelining.
    def cpu_sum(r: dict) -> float:
        return float(r["cpu_send_s_per_gib_median"]) + float(r["cpu_recv_s_per_gib_median"])
    t["ferry_plain_cpu_ceiling_vs_raw"] = round(cpu_sum(first["raw_sendfile"]) / cpu_sum(first["ferry_plain"]), 3)
    if "rsync_daemon" in first:
        t["ferry_plain_vs_rsync"] = round(first["ferry_plain"]["mb_per_s"] / first["rsync_daemon"]["mb_per_s"], 2)
        t["ferry_plain_vs_rsync_ok(>=2)"] = t["ferry_plain_vs_rsync"] >= 2
    if "ferry_ssh" in first:
        t["ferry_ssh_vs_sftp"] = round(first["ferry_ssh"]["mb_per_s"] / first["paramiko_sftp"]["mb_per_s"], 2)
        t["ferry_ssh_vs_sftp_ok(>=1.3)"] = t["ferry_ssh_vs_sftp"] >= 1.3
    if "rate_limit" in result:
        t["rate_limit_ok(within 5%)"] = abs(result["rate_limit"]["error"]) <= 0.05
    # the authenticated modes side by side, each as a ratio to raw sendfile
    modes = {"unsealed_sendfile": "ferry_unsealed", "secret_sealed_default": "ferry_plain",
             "tls_userspace": "ferry_tls", "ssh_tunnel": "ferry_ssh"}
    result["auth_modes_vs_raw_sendfile"] = {
        k: first[m]["ratio_to_raw_sendfile"] if m in first else ssh_note if m == "ferry_ssh" else "not run"
        for k, m in modes.items()}
    result["tls_path"] = first["ferry_tls"].get("path") if "ferry_tls" in first else None
    result["targets"] = t
    result["loadavg_end"] = os.getloadavg()[0]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
