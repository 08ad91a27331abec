"""Run one node in this process until SIGTERM/SIGINT or a completed graceful leave."""
from __future__ import annotations

import faulthandler
import logging
import signal
import sys
import threading

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
    done = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("stage=shutdown signal %s received", signal.Signals(signum).name)
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        node.start()
    except NodeError as e:
        log.error("stage=start cannot start: %s", e)
        node.stop()
        return 2
    print(f"node {cfg.id} serving on {cfg.listen}", flush=True)
    while not done.wait(0.2):
        if node.left.is_set():
            break
    node.stop()
    return 0
