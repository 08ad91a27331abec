"""Run one node in this process until SIGTERM/SIGINT or a completed graceful leave."""
from __future__ import annotations

import faulthandler
import logging
import signal
import sys
import time

from .config import NodeConfig
from .errors import NodeError


def setup_logging(cfg: NodeConfig) -> None:
    logging.basicConfig(
        level=getattr(logging, cfg.log_level.upper(), logging.INFO), stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s node={cfg.id} %(name)s: %(message)s")


def run(cfg: NodeConfig) -> int:
    setup_logging(cfg)
    # `kill -USR1 <pid>` prints every thread's stack to the log: for a node that hangs
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    log = logging.getLogger("ferry.node")
    from .node import Node
    try:
        node = Node(cfg)
    except NodeError as e:
        log.error("stage=start cannot start: %s", e)
        return 2
    # The handler only records the signal. A Python signal handler runs in the main
    # thread between bytecodes, so taking a lock there (Event.set, logging) can
    # deadlock against the very code it interrupted: two SIGTERMs back to back once
    # left a node hung inside Event.set while its threads went on coordinating.
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        node.start()
    except NodeError as e:
        log.error("stage=start cannot start: %s", e)
        node.stop()
        return 2
    print(f"node {cfg.id} serving on {cfg.listen}", flush=True)
    while not received and not node.left.is_set():
        time.sleep(0.2)
    if received:
        log.info("stage=shutdown signal %s received", signal.Signals(received[0]).name)
    node.stop()
    return 0
