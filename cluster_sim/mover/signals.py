"""How a mover process waits for the harness's SIGTERM.

The handler only records the signal; the main thread polls and then stops once. A
Python signal handler runs in the main thread between bytecodes, so a handler that
takes locks or closes stores can deadlock: the harness sends SIGTERM twice within
milliseconds, and a second handler run inside the first one blocked on a partition
lock the first had taken (a demander mover "ignored SIGTERM for 60 s" in the quick
matrix). SIGUSR1 prints every thread's stack to stderr (the mover's log) for a
process that hangs anyway.
"""
from __future__ import annotations

import faulthandler
import signal
import time
from typing import Callable


def wait_for_sigterm(poll_s: float = 0.1, ready: Callable[[], None] | None = None) -> None:
    """Block the calling (main) thread until SIGTERM or SIGINT arrives; ``ready`` is
    called once the handlers are in place (a signal before that would kill the
    process with the default action)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if ready is not None:
        ready()
    while not received:
        time.sleep(poll_s)
