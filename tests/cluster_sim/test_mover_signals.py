"""A mover process stops once, cleanly, even when SIGTERM comes twice in a row.

The harness sends SIGTERM twice within milliseconds. When the stop (taking partition
locks, closing stores) ran inside the signal handler, the second handler run blocked on
a lock the first run held, in the same thread: the process hung until SIGKILL."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

CHILD = r"""
import threading, time
from cluster_sim.mover.signals import wait_for_sigterm
lock = threading.Lock()
wait_for_sigterm(ready=lambda: print("ready", flush=True))
with lock:              # a stop that holds a lock for a while, like store.close()
    time.sleep(0.5)
print("stopped", flush=True)
"""


def test_two_sigterms_in_a_row_stop_the_process_once(py_env) -> None:
    p = subprocess.Popen([sys.executable, "-c", CHILD], env=py_env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        p.send_signal(signal.SIGTERM)
        time.sleep(0.2)                     # the stop is now inside its locked section
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    assert out.strip() == "stopped"
