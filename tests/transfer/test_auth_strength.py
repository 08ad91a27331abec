"""Weak cluster secrets are refused wherever a secret is loaded (every tool and the
node go through ``load_secret``), and ``ferry secret generate`` makes one that passes."""
from __future__ import annotations

import os
import secrets
import socket
import stat
import subprocess
import sys
import threading

import pytest

from transfer import auth
from transfer.errors import AuthError
from transfer.transport import SocketConn
from node.listen_ports import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FERRY = [sys.executable, "-m", "ferry"]

# (secret, words the refusal must contain)
WEAK = [
    (b"", "0 bytes"),
    (b"short", "5 bytes"),
    (b"0123456789abcde", "15 bytes"),                    # one byte short
    (b"aaaaaaaaaaaaaaaa", "1 distinct"),                  # a run
    (b"abababababababababab", "2 distinct"),              # a repeated pair
    (b"secretsecretsecret", "5 distinct"),                # a repeated word
    (b"Summer2024!Summer2024!", "bits"),                  # a repeated password
    (b"1234567890123456", "bits"),                        # a sequence
    (b"abcdefghijklmnopqrstuvwxyz0123456789", "bits"),    # sequences, 36 distinct bytes
    (b"zyxwvutsrqponmlkjihgfedcba", "bits"),              # descending
    (b"qwertyuiopasdfgh", "bits"),                        # a keyboard row
    (b"summer-password!", "bits"),                        # dictionary words
    (b"correct-horse-battery-staple", "bits"),            # four words
    (b"correcthorsebatterystaple", "bits"),
    (b"test-cluster-secret-0123456789abcdef", "bits"),   # words and sequences
    (b"Password-Password-Password", "bits"),
    (b"abcabcabcabcabcabc", "3 distinct"),
    (b"Blue-Ocean-Table-Winter", "bits"),
]

STRONG = [
    b"9d41c7a2e05f3b86d2c94e17a0b5f368",                  # 32 hex digits (128 bits)
    b"Xk9pQrTzLm2vBnWq",                                  # 16 random alphanumerics
    b"K7#mQ2$vX9!pL4@z",                                  # 16 random printable
    bytes.fromhex("c38f13e07a5cd2b9416ef72a90bd641f"),   # 16 random bytes, binary
]


@pytest.mark.parametrize("secret,words", WEAK, ids=[w[0].decode()[:24] or "empty" for w in WEAK])
def test_weak_secret_refused_with_the_reason(secret: bytes, words: str) -> None:
    with pytest.raises(AuthError) as ei:
        auth.check_strength(secret)
    msg = str(ei.value)
    assert words in msg and "ferry secret generate" in msg, msg


@pytest.mark.parametrize("secret", STRONG)
def test_strong_secret_accepted(secret: bytes) -> None:
    auth.check_strength(secret)
    assert auth.estimate_bits(secret) >= auth.MIN_BITS


def test_random_secrets_pass() -> None:
    """What ``ferry secret generate`` writes (64 hex digits) and 32 random bytes in
    base64 pass; so do 128-bit ones, bar a 1 in 300,000 draw with under 8 distinct
    digits (not tried here)."""
    for _ in range(1000):
        auth.check_strength(auth.generate_secret())
        auth.check_strength(secrets.token_hex(32).encode())
        auth.check_strength(secrets.token_urlsafe(32).encode())
        assert auth.estimate_bits(secrets.token_hex(16).encode()) >= auth.MIN_BITS


def test_load_secret_refuses_weak_from_file_and_env(tmp_path, monkeypatch) -> None:
    p = tmp_path / "s"
    p.write_bytes(b"summer-password!\n")
    p.chmod(0o600)
    with pytest.raises(AuthError, match=f"secret file {p}: cluster secret is too weak"):
        auth.load_secret(str(p))
    monkeypatch.setenv("FERRY_SECRET", "aaaaaaaaaaaaaaaaaaaaaaaa")
    with pytest.raises(AuthError, match=r"\$FERRY_SECRET: cluster secret is too weak: only 1 distinct"):
        auth.load_secret(None)


def _env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e.pop("FERRY_SECRET", None)
    return e



def test_node_start_refuses_a_weak_secret(tmp_path) -> None:
    weak = tmp_path / "secret"
    weak.write_text("1234567890123456")
    weak.chmod(0o600)
    r = subprocess.run(FERRY + ["node", "start", "--id", "n1", "--data", str(tmp_path / "n1"),
                                "--listen", f"127.0.0.1:{free_port()}", "--secret-file", str(weak),
                                "--partitions", "4", "--control-plane", "http://127.0.0.1:1"],
                       env=_env(), capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode != 0
    assert "too weak" in r.stderr and "ferry secret generate" in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("args", [["transfer", "fetch", "127.0.0.1:1", "--partition", "1", "--dest", "DEST"],
                                  ["cluster", "status", "--seed", "127.0.0.1:1"]])
def test_tools_refuse_a_weak_secret(tmp_path, args: list[str]) -> None:
    weak = tmp_path / "secret"
    weak.write_text("summer-password!")
    weak.chmod(0o600)
    args = [str(tmp_path / "d") if a == "DEST" else a for a in args]
    r = subprocess.run(FERRY + args + ["--secret-file", str(weak)], env=_env(), capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert r.returncode != 0
    assert "too weak" in r.stderr, r.stderr[-2000:]


def _generate(out: str, *extra: str, umask: int = 0o022) -> subprocess.CompletedProcess:
    def set_umask() -> None:
        os.umask(umask)
    return subprocess.run(FERRY + ["secret", "generate", "--out", out, *extra], env=_env(),
                          capture_output=True, text=True, timeout=60, cwd=ROOT, preexec_fn=set_umask)


def test_secret_generate_writes_a_0600_file_that_is_accepted(tmp_path) -> None:
    out = tmp_path / "cluster.secret"
    r = _generate(str(out), umask=0)              # even with a umask that allows all
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    value = auth.load_secret(str(out))
    assert len(value) == 64 and int(value, 16) >= 0
    assert auth.estimate_bits(value) >= 2 * auth.MIN_BITS
    # and it authenticates a real handshake
    a, b = socket.socketpair()
    got: dict = {}
    t = threading.Thread(target=lambda: got.update(role=auth.server_handshake(SocketConn(b, "s"), value)))
    t.start()
    auth.client_handshake(SocketConn(a, "c"), auth.load_secret(str(out)), role="node")
    t.join(10)
    assert got == {"role": "node"}
    assert os.listdir(tmp_path) == ["cluster.secret"]     # no temp file left


def test_secret_generate_does_not_overwrite_without_force(tmp_path) -> None:
    out = tmp_path / "s"
    assert _generate(str(out)).returncode == 0
    first = out.read_bytes()
    r = _generate(str(out))
    assert r.returncode == 1 and "exists; pass --force" in r.stderr
    assert out.read_bytes() == first
    r = _generate(str(out), "--force")
    assert r.returncode == 0 and out.read_bytes() != first
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600


def test_secret_generate_into_a_missing_directory_fails_clearly(tmp_path) -> None:
    r = _generate(str(tmp_path / "nope" / "s"))
    assert r.returncode == 1 and "cannot write" in r.stderr and "No such file" in r.stderr


def test_secret_generate_to_stdout(tmp_path) -> None:
    r = _generate("-")
    assert r.returncode == 0
    auth.check_strength(r.stdout.strip().encode())
