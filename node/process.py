"""Run one node in this process until SIGTERM/SIGINT or a completed graceful leave."""
from __future__ import annotations

import faulthandler
import logging
import os
import resource
import signal
import sys
import time

from .config import NodeConfig
from .errors import NodeError


def setup_logging(cfg: NodeConfig) -> None:
    logging.basicConfig(
        level=getattr(logging, cfg.log_level.upper(), logging.INFO), stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s node={cfg.id} %(name)s: %(message)s")


def cannot_start(cfg: NodeConfig, why: object) -> int:
    """ONE line on stderr saying why the node does not start; exit status 2. Printed,
    not logged: a log record puts a timestamp and a logger name before the words a
    person has to act on, and the log goes to stderr too, so doing both says it twice."""
    msg = " ".join(str(why).split())           # one line, whatever the message held
    print(f"ferry node start: node {cfg.id} cannot start: {msg}", file=sys.stderr, flush=True)
    return 2


def run(cfg: NodeConfig) -> int:
    setup_logging(cfg)
    # a move's fetch keeps its authenticated connection to the supplier for the next
    # fetch from it (transfer.connpool): no TCP set-up and handshake per partition
    from transfer.connpool import POOL
    POOL.enabled = True
    _tune_malloc(logging.getLogger("ferry.node"))
    raise_open_files_limit(logging.getLogger("ferry.node"))
    # `kill -USR1 <pid>` prints every thread's stack to the log: for a node that hangs
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    log = logging.getLogger("ferry.node")
    from .node import Node
    from .storage import check_held, os_problem
    try:
        node = Node(cfg)
    except NodeError as e:
        return cannot_start(cfg, e)
    except OSError as e:       # one the start-up checks did not foresee: still one line
        return cannot_start(cfg, os_problem(e))
    try:
        check_held(node.ctx.data, node.ctx.states)
    except NodeError as e:
        node.stop()
        return cannot_start(cfg, e)
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
        node.stop()
        return cannot_start(cfg, e)
    print(f"node {cfg.id} serving on {cfg.listen}", flush=True)
    while not received and not node.ctx.events.left.is_set():
        time.sleep(0.2)
    if received:
        log.info("stage=shutdown signal %s received", signal.Signals(received[0]).name)
    node.stop()
    return 0


def raise_open_files_limit(log: logging.Logger) -> int:
    """Raise the soft limit of open files (RLIMIT_NOFILE) to the hard limit and log
    it; returns the soft limit in force. Partition files are open on demand within a
    budget of a quarter of this limit per cache (at most 1,024, checkpoint/files.py);
    the rest is for sockets per transfer and peer, the WAL and the indexes. The hard
    limit is the operator's (systemd
    ``LimitNOFILE=``, limits.conf), as Kafka and Elasticsearch ask operators for.
    A hard limit of "unlimited" is capped at the kernel's ``fs.nr_open``, above which
    Linux refuses any soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard
    if want == resource.RLIM_INFINITY:
        try:
            with open("/proc/sys/fs/nr_open") as f:
                want = int(f.read())
        except (OSError, ValueError):
            want = soft
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (OSError, ValueError) as e:
            log.warning("stage=start cannot raise the open files limit from %d to %d: %s",
                        soft, want, e)
    log.info("stage=start open files limit %s (hard limit %s)", _limit(soft), _limit(hard))
    return soft


def _limit(n: int) -> str:
    return "unlimited" if n == resource.RLIM_INFINITY else str(n)


M_TOP_PAD = -2            # glibc mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
TOP_PAD_DEFAULT = 64 << 20
MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit


def _tune_malloc(log: logging.Logger) -> None:
    """Keep up to 64 MiB of freed heap instead of handing it back to the kernel at
    once (glibc ``M_TOP_PAD``; ``FERRY_MALLOC_TOP_PAD`` bytes, 0 leaves glibc's
    default). A node reads partition files in chunks and frees each chunk's values
    together: with the default the heap top went back to the kernel every chunk and
    the next chunk's values paid page faults again - measured by the page decoder's
    bench: a scan of 32 MB of 64 KiB values 0.046 s -> 0.011 s. The cost is at most
    that much resident memory beyond what the node uses.

    Setting any of these parameters turns off glibc's dynamic mmap threshold, which
    had moved past the decoder's 2 MiB read chunks after the first was freed: left at
    its 128 KiB start, every chunk was a fresh mmap paying a fault per page (a pread of
    64 MiB in 2 MiB chunks: 5 ms -> 50 ms). So the threshold is set too, to glibc's own
    dynamic ceiling (MMAP_THRESHOLD_MAX): chunks up to 32 MiB come from the heap."""
    raw = os.environ.get("FERRY_MALLOC_TOP_PAD", str(TOP_PAD_DEFAULT))
    try:
        pad = int(raw)
    except ValueError:
        log.warning("stage=start FERRY_MALLOC_TOP_PAD=%r is not a number of bytes; ignored", raw)
        return
    if pad <= 0 or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        mallopt = getattr(libc, "mallopt", None)
        if mallopt is None:
            return
        if not mallopt(M_TOP_PAD, min(pad, 1 << 30)):
            log.warning("stage=start mallopt(M_TOP_PAD, %d) refused; glibc's default kept", pad)
            return
        if not mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD):
            log.warning("stage=start mallopt(M_MMAP_THRESHOLD, %d) refused: large reads "
                        "will be mmapped afresh each time", MMAP_THRESHOLD)
    except OSError:        # not glibc: nothing to tune
        pass
