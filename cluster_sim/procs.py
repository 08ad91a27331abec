"""Processes of a run: started with their own environment (the crash plan goes only into
the target's ``FERRY_CRASH``), logged to a file, killed by SIGKILL, restarted without
the crash plan. Every process gets ``FERRY_CRASH_TRACE`` so the harness learns which
crash points the run reached."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from .errors import ProcessError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))



def child_env(crash: str | None, trace: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("FERRY_CRASH", None)
    env.pop("FERRY_CRASH_TRACE", None)
    if crash:
        env["FERRY_CRASH"] = crash
    if trace:
        env["FERRY_CRASH_TRACE"] = trace
    return env


@dataclass
class Proc:
    """One logical process (a node id) across its lives."""
    name: str
    argv: list[str]
    log: str
    trace: str | None = None
    crash: str | None = None          # armed in every life until it has fired once
    prefix: list[str] = field(default_factory=list)   # e.g. ["ip", "netns", "exec", ns]
    popen: subprocess.Popen[bytes] | None = None
    lives: int = 0
    crashed: bool = False             # a life ended by SIGKILL we did not send
    port_retries: int = 0             # lives started again because their port was taken
    _killed_by_us: bool = False

    def start(self) -> Proc:
        # a life the scenario ends first (a kill event) never reached the point: the next
        # one is armed again (restart-catchup's node reaches the delta points only after
        # its restart); once the plan fired, the process runs unarmed
        armed = self.crash if not self.crashed else None
        with open(self.log, "ab") as log:
            log.write(f"\n=== life {self.lives + 1}{' FERRY_CRASH=' + armed if armed else ''}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(self.prefix + self.argv, stdout=log, stderr=log,
                                          env=child_env(armed, self.trace), cwd=ROOT)
        self.lives += 1
        self._killed_by_us = False
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def self_killed(self) -> bool:
        """True once: the process ended by SIGKILL that the harness did not send (an
        armed crash point fired)."""
        if self.popen is None or self.popen.poll() is None or self._killed_by_us:
            return False
        if self.popen.returncode == -signal.SIGKILL and not self.crashed:
            self.crashed = True
            return True
        return False

    def kill(self) -> None:
        if self.alive():
            self._killed_by_us = True
            assert self.popen is not None
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait (graceful stop); SIGKILL if ignored. Returns the status."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self._killed_by_us = True
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                # `ferry node` registers faulthandler on SIGUSR1: every thread's stack goes
                # to its log, so a hang at shutdown can be diagnosed from the kept run.
                self.popen.send_signal(signal.SIGUSR1)
                time.sleep(1.0)
                self.popen.kill()
                self.popen.wait()
                raise ProcessError(f"{self.name} ignored SIGTERM for {timeout}s (thread stacks "
                                   f"at the end of {self.log}):\n{self.tail()}")
        return self.popen.returncode

    def current_life(self) -> str:
        """The log of the current life."""
        try:
            with open(self.log, errors="replace") as f:
                return f.read().rsplit("\n=== life ", 1)[-1]
        except OSError:
            return ""

    def tail(self, n: int = 25) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def wait_for_line(self, text: str, timeout: float = 30.0) -> None:
        """Until ``text`` appears in the log of the current life."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log, errors="replace") as f:
                if text in f.read().rsplit("\n=== life ", 1)[-1]:
                    return
            if not self.alive():
                raise ProcessError(f"{self.name} exited with status "
                                   f"{self.popen.returncode if self.popen else None} before "
                                   f"{text!r}:\n{self.tail()}")
            time.sleep(0.05)
        raise ProcessError(f"{self.name}: no {text!r} within {timeout}s:\n{self.tail()}")


def python_argv(*args: str) -> list[str]:
    return [sys.executable, *args]


def read_trace(path: str) -> set[str]:
    try:
        with open(path) as f:
            return {line.strip() for line in f if line.strip()}
    except FileNotFoundError:
        return set()
