from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from transfer.cli import transfer
from transfer_helpers import peer_of, read, write_part

FERRY = [sys.executable, "-c", "from ferry.cli import main; main()"]
MB = 1 << 20


def test_fetch_json_summary(server, src, dst, secret_file) -> None:
    a = write_part(src, 1, 3 * MB)
    b = write_part(src, 2, 1000)
    r = CliRunner().invoke(transfer, ["fetch", peer_of(server), "--partition", "1", "--partition", "2",
                                      "--dest", dst, "--secret-file", secret_file, "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["ok"] is True and [p["partition"] for p in out["partitions"]] == [1, 2]
    p1 = out["partitions"][0]
    assert set(p1) == {"partition", "bytes", "bytes_wire", "bytes_reused", "seconds", "mb_per_s", "verified",
                       "mode", "pages", "pages_sent", "delta_refused", "path"}
    assert p1["mode"] == "full" and p1["pages_sent"] == 0
    assert p1["bytes"] == 3 * MB and p1["bytes_wire"] == 3 * MB and p1["bytes_reused"] == 0 and p1["verified"]
    assert read(os.path.join(dst, "part-1.bin")) == a and read(os.path.join(dst, "part-2.bin")) == b


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(FERRY + ["transfer"] + args, env=env, capture_output=True, text=True, timeout=30)


def test_failures_exit_nonzero_with_one_line(server, src, dst, secret_file, tmp_path, py_env) -> None:
    write_part(src, 1, 100)
    wrong = tmp_path / "wrong"
    wrong.write_text("another-secret-of-enough-length")
    wrong.chmod(0o600)
    cases = {
        "wrong secret": (["fetch", peer_of(server), "--partition", "1", "--dest", dst,
                          "--secret-file", str(wrong)], "does not know the cluster secret"),
        "unreachable": (["fetch", "127.0.0.1:1", "--partition", "1", "--dest", dst,
                         "--secret-file", secret_file], "cannot connect to 127.0.0.1:1"),
        "missing partition": (["fetch", peer_of(server), "--partition", "9", "--dest", dst,
                               "--secret-file", secret_file], "NOT_HELD"),
        "no secret": (["fetch", peer_of(server), "--partition", "1", "--dest", dst], "no cluster secret"),
    }
    env = dict(py_env)
    env.pop("FERRY_SECRET", None)
    for name, (args, text) in cases.items():
        r = _run(args, env)
        assert r.returncode == 1, (name, r.stderr)
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("ferry transfer fetch: error:")]
        assert len(lines) == 1 and text in lines[0], (name, r.stderr)
    assert not os.path.exists(os.path.join(dst, "part-1.bin"))
    assert not os.path.exists(os.path.join(dst, "part-9.bin"))


def test_json_failure_object(server, dst, secret_file) -> None:
    r = CliRunner().invoke(transfer, ["fetch", peer_of(server), "--partition", "5", "--dest", dst,
                                      "--secret-file", secret_file, "--json"])
    assert r.exit_code == 1
    out = json.loads(r.stdout.strip().splitlines()[0])
    assert out["ok"] is False and out["partitions"] == [] and "NOT_HELD" in out["error"]


def test_secret_from_env_and_never_from_argv(server, src, dst, monkeypatch) -> None:
    write_part(src, 1, 100)
    r = CliRunner().invoke(transfer, ["fetch", peer_of(server), "--partition", "1", "--dest", dst,
                                      "--secret", "x" * 32])
    assert r.exit_code == 2 and "No such option" in r.output
    from transfer_helpers import SECRET
    monkeypatch.setenv("FERRY_SECRET", SECRET.decode())
    r = CliRunner().invoke(transfer, ["fetch", peer_of(server), "--partition", "1", "--dest", dst, "--rate", "50MB"])
    assert r.exit_code == 0, r.output


def test_serve_refuses_bad_setup(tmp_path, secret_file, py_env) -> None:
    r = _run(["serve", "--dir", str(tmp_path), "--port", "0", "--secret-file", secret_file, "--rate", "fast"], py_env)
    assert r.returncode == 1 and "rate 'fast'" in r.stderr


def test_serve_rereads_limits_file_on_sighup(src, dst, secret_file, tmp_path, py_env) -> None:
    """Limits change while `ferry transfer serve` runs: SIGHUP re-reads --limits-file;
    a bad file is reported and keeps the limits in force; transfers go on throughout."""
    import signal

    from transfer import Demander, DirectoryStorage
    from transfer_helpers import SECRET

    data = write_part(src, 0, 2 << 20)
    limits = tmp_path / "limits.json"
    limits.write_text('{"rate": "500MB", "max_transfers": 2}')
    proc = subprocess.Popen([sys.executable, "-c", "from ferry.cli import main; main()", "transfer", "serve",
                             "--dir", src, "--port", "0", "--secret-file", secret_file,
                             "--limits-file", str(limits)], env=py_env, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert line.startswith("serving "), line
        peer = line.rsplit(" ", 1)[1].strip()

        def hup_and_read() -> str:
            proc.send_signal(signal.SIGHUP)
            return proc.stderr.readline()
        limits.write_text('{"rate": "50MiB", "max_transfers": 1}')
        assert hup_and_read().strip() == f"limits now: rate={50 << 20} B/s, max_transfers=1"
        limits.write_text('{"rate": "fast please"}')
        bad = hup_and_read()
        assert "limits file" in bad and "limits unchanged" in bad, bad
        limits.write_text('{"rate": null, "max_transfers": 3}')
        assert hup_and_read().strip() == "limits now: rate=unlimited, max_transfers=3"
        Demander(DirectoryStorage(dst), peer, SECRET).fetch(0)      # still serving
        assert read(os.path.join(dst, "part-0.bin")) == data
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=20)      # drains stderr: a full pipe would block the shutdown


# (name, arguments, what the one line must say); {d} is a scratch directory
BAD_OPTIONS = [
    ("serve port over 65535", ["serve", "--dir", "{d}", "--port", "70000"], "--port 70000 is out of range: use 0..65535"),
    ("serve negative port", ["serve", "--dir", "{d}", "--port", "-1"], "--port -1 is out of range"),
    ("serve no transfers", ["serve", "--dir", "{d}", "--port", "0", "--max-transfers", "0"],
     "--max-transfers 0 is out of range: use 1 or more"),
    ("fetch negative retries", ["fetch", "127.0.0.1:1", "--partition", "1", "--dest", "{d}", "--retries", "-5"],
     "--retries -5 is out of range: use 0 or more"),
    ("fetch negative partition", ["fetch", "127.0.0.1:1", "--partition", "-1", "--dest", "{d}"],
     "--partition -1 is out of range"),
    ("fetch partition over 2^31-1", ["fetch", "127.0.0.1:1", "--partition", str(2**31), "--dest", "{d}"],
     f"--partition {2**31} is out of range: use 0..{2**31 - 1}"),
]


@pytest.mark.parametrize("name,args,text", BAD_OPTIONS, ids=[b[0] for b in BAD_OPTIONS])
def test_bad_option_values_are_one_line_exit_2(tmp_path, secret_file, name, args, text) -> None:
    """Out-of-range values used to end in a traceback (OverflowError for --port 70000,
    UnboundLocalError for --retries -5)."""
    argv = [a.format(d=tmp_path) for a in args] + ["--secret-file", secret_file]
    r = CliRunner().invoke(transfer, argv)
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    cmd = args[0]
    assert len(lines) == 1 and lines[0].startswith(f"ferry transfer {cmd}: error: ") and text in lines[0], lines


def test_serve_with_a_fifo_as_secret_file_fails_at_once(tmp_path, py_env) -> None:
    fifo = tmp_path / "secret"
    os.mkfifo(fifo, 0o600)
    r = _run(["serve", "--dir", str(tmp_path), "--port", "0", "--secret-file", str(fifo)], py_env)
    assert r.returncode == 1 and "FIFO" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_serve_stops_on_sigint_or_sigterm_even_when_its_parent_ignores_sigint(src, secret_file, py_env, sig) -> None:
    """A SIGINT ignored by the parent is inherited as SIG_IGN (test runners, nohup-like
    launchers); ``transfer serve`` installs its own handlers, so it still stops."""
    import signal
    proc = subprocess.Popen(FERRY + ["transfer", "serve", "--dir", src, "--port", "0",
                                     "--secret-file", secret_file], env=py_env, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert proc.stderr.readline().startswith("serving ")
        proc.send_signal(getattr(signal, sig))
        err = proc.communicate(timeout=15)[1]
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
