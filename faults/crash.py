"""``crashpoint(name)``: a no-op unless armed, a SIGKILL of this process when armed.

Arming comes from the environment (so the harness can arm a node process it starts)
or from :func:`arm` (in-process tests):

    FERRY_CRASH="demander.mid_replay:3"          crash on the 3rd hit
    FERRY_CRASH="wal.before_sync@0.01#42"        crash with probability 0.01, seed 42
    FERRY_CRASH="a.b:1,c.d@0.5#7"                several points
    FERRY_CRASH_TRACE=/path/file                 append each point's name on its first hit

Unarmed cost: one global truth test. Armed, the process ends at once by SIGKILL to
itself: no flush, no atexit, exactly what a power cut or ``kill -9`` leaves behind.
"""
from __future__ import annotations

import os
import random
import signal
import threading
from dataclasses import dataclass, field

from .points import POINTS

ENV_ARM = "FERRY_CRASH"
ENV_TRACE = "FERRY_CRASH_TRACE"


@dataclass
class _Arm:
    name: str
    nth: int | None = None           # crash on this hit (1-based)
    probability: float | None = None
    rng: random.Random = field(default_factory=random.Random)
    hits: int = 0


_armed: dict[str, _Arm] = {}
_trace_path: str | None = None
_traced: set[str] = set()
_active = False                      # the one thing the unarmed fast path reads
_lock = threading.Lock()


def crashpoint(name: str) -> None:
    """Mark a place where a crash matters. Does nothing unless armed or traced."""
    if _active:
        _hit(name)


def _hit(name: str) -> None:
    if name not in POINTS:
        raise KeyError(f"crash point {name!r} is not declared in faults/points.py")
    with _lock:
        if _trace_path is not None and name not in _traced:
            _traced.add(name)
            with open(_trace_path, "a", encoding="utf-8") as f:
                f.write(name + "\n")
        arm = _armed.get(name)
        if arm is None:
            return
        arm.hits += 1
        fire = (arm.nth is not None and arm.hits == arm.nth) or (
            arm.probability is not None and arm.rng.random() < arm.probability)
    if fire:
        die()


def die() -> None:
    """End this process now, as ``kill -9`` would."""
    os.kill(os.getpid(), signal.SIGKILL)


def parse_spec(spec: str) -> list[_Arm]:
    """Parse ``name[:N]`` / ``name@P[#SEED]`` items separated by commas."""
    arms: list[_Arm] = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        if "@" in item:
            name, _, rest = item.partition("@")
            prob, _, seed = rest.partition("#")
            arm = _Arm(name, probability=float(prob),
                       rng=random.Random(int(seed) if seed else 0))
        else:
            name, _, nth = item.partition(":")
            arm = _Arm(name, nth=int(nth) if nth else 1)
        if arm.name not in POINTS:
            raise ValueError(f"unknown crash point {arm.name!r}; known: {', '.join(sorted(POINTS))}")
        if arm.nth is not None and arm.nth < 1:
            raise ValueError(f"crash point {arm.name}: hit number must be >= 1")
        arms.append(arm)
    return arms


def arm(spec: str) -> None:
    """Arm crash points in this process (see module doc for the syntax)."""
    global _active
    with _lock:
        for a in parse_spec(spec):
            _armed[a.name] = a
        _active = bool(_armed) or _trace_path is not None


def disarm() -> None:
    global _active
    with _lock:
        _armed.clear()
        _active = _trace_path is not None


def trace_to(path: str | None) -> None:
    global _trace_path, _active
    with _lock:
        _trace_path = path
        _active = bool(_armed) or path is not None


def _from_environment() -> None:
    if os.environ.get(ENV_TRACE):
        trace_to(os.environ[ENV_TRACE])
    if os.environ.get(ENV_ARM):
        arm(os.environ[ENV_ARM])


_from_environment()
