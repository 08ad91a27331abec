"""When is a cluster converged, and did it converge in time after a heal?

Converged (what ``settled`` waits for, and what a heal must reach within
``CONVERGE_TTLS`` lease TTLs):

- **one map**: every expected node answers ``get_map`` and their maps agree on the
  members, the controller, and per partition the primary, in-sync set, epoch and the
  state every node reported (the etcd revision itself is left out: reports carry
  counters that change with every write);
- every expected node is a live member, none leaving; no move in progress;
- per partition exactly the ideal owners OWNING (B+1, capped by the live nodes),
  nothing else held, the ideal primary, and **in_sync == owners**.

:class:`ConvergenceWatch` polls from a thread once a fault ended (``heal``, the end of
a ``flap``, ``restart-etcd``) and reports the seconds it took, or a problem naming what
was still not converged at the deadline.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ..timeline import Timeline

CONVERGE_TTLS = 3          # a heal must converge within this many lease TTLs
POLL_S = 0.2
STABLE_S = 1.0             # converged only if it holds this long (churn passes through
                           # converged-looking moments: a copy admitted, then removed again)


def settled_problems(doc: dict[str, Any] | None, expect: set[str], backups: int) -> list[str]:
    """What keeps ``cluster status`` ``doc`` from being settled (empty: settled)."""
    if doc is None:
        return ["no node answers cluster status"]
    out: list[str] = []
    live = {n["id"] for n in doc["nodes"] if n["alive"] and not n["leaving"]}
    if live != expect:
        out.append(f"live members {sorted(live)}, want {sorted(expect)}")
    if doc["moves"]:
        out.append(f"{len(doc['moves'])} move(s) in progress")
    want = min(backups + 1, len(live))
    for part in doc["partitions"]:
        where = f"{part['cache']}/{part['partition']}"
        owning = sorted(n for n, s in part["states"].items() if s == "OWNING")
        owners = sorted(part["owners"])
        if owning != owners or len(owners) != want:
            out.append(f"{where}: OWNING on {owning}, owners {part['owners']} (want {want})")
        elif set(part["states"].values()) != {"OWNING"}:
            out.append(f"{where}: states {part['states']}")
        elif part["owners"] and part["primary"] != part["owners"][0]:
            out.append(f"{where}: primary {part['primary']}, ideal {part['owners'][0]}")
        elif "in_sync" in part and sorted(part["in_sync"]) != owners:
            out.append(f"{where}: in_sync {sorted(part['in_sync'])} != owners {owners}")
    return out


def _projection(m: Any) -> tuple[Any, ...]:
    parts = tuple((c, p, r.primary, tuple(sorted(r.isr)), r.epoch, r.lost,
                   tuple(sorted(m.states[c][p].items())))
                  for c, lst in sorted(m.parts.items()) for p, r in enumerate(lst))
    members = tuple(sorted((x.id, x.leaving) for x in m.members.values()))
    return members, m.controller, parts


def map_problems(maps: dict[str, Any]) -> list[str]:
    """Do these nodes' maps (``ClusterMap`` or None: no answer) agree? Empty: one map."""
    silent = sorted(n for n, m in maps.items() if m is None)
    if silent:
        return [f"no map from {', '.join(silent)}"]
    views = {n: _projection(m) for n, m in maps.items()}
    first = next(iter(views.values()), None)
    differ = sorted(n for n, v in views.items() if v != first)
    if not differ:
        return []
    ref = next(iter(views))
    return [f"maps differ: {', '.join(differ)} vs {ref}: " + _first_difference(views[ref], views[differ[0]])]


def _first_difference(a: tuple[Any, ...], b: tuple[Any, ...]) -> str:
    if a[0] != b[0]:
        return f"members {a[0]} vs {b[0]}"
    if a[1] != b[1]:
        return f"controller {a[1]} vs {b[1]}"
    for x, y in zip(a[2], b[2]):
        if x != y:
            return f"{x[0]}/{x[1]}: {x[2:]} vs {y[2:]}"
    return "?"


class ConvergenceWatch:
    """From ``start(why)``: poll ``check()`` (problems, empty when converged) until it
    holds for ``STABLE_S``; the time to converge is the start of that stretch. Later
    than ``within`` seconds is a problem (recorded at the deadline, completed with the
    time it finally took if it converges before ``cancel``)."""

    def __init__(self, check: Callable[[], list[str]], within: float, timeline: Timeline) -> None:
        self.check, self.within, self.timeline = check, within, timeline
        self.problems: list[str] = []
        self.seconds: list[float] = []          # time to converge after each heal
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0

    def start(self, why: str) -> None:
        self.cancel()
        self._started = time.monotonic()
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(why, self._cancel),
                                        name="convergence", daemon=True)
        self._thread.start()

    def finish(self) -> None:
        """The run is settled and about to stop: let the watch of the last heal come
        to its verdict (converged and stable, or past its limit) instead of cutting it
        short; a run that stops first would leave a heal neither marked converged nor
        late."""
        t = self._thread
        if t is not None and t.is_alive():
            left = self._started + self.within + STABLE_S + 2 * POLL_S - time.monotonic()
            t.join(max(0.0, left))
        self.cancel()

    def cancel(self) -> None:
        """Another fault began (or the run stops): this heal's clock no longer counts."""
        self._cancel.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self, why: str, cancel: threading.Event) -> None:
        t0 = time.monotonic()
        late: int | None = None
        since: float | None = None          # start of the current converged stretch
        while not cancel.is_set():
            last = self.check()
            now = time.monotonic()
            if last:
                since = None
                if late is None and now - t0 > self.within:
                    late = len(self.problems)
                    self.problems.append(f"not converged {self.within:.0f}s after {why}: "
                                         + "; ".join(last[:4]))
            else:
                since = now if since is None else since
                if now - since >= STABLE_S:
                    took = since - t0
                    self.seconds.append(round(took, 2))
                    self.timeline.mark("-", "converged", f"{took:.1f}s after {why}")
                    if took > self.within:
                        msg = f"converged only {took:.1f}s after {why} (limit {self.within:.0f}s)"
                        if late is None:
                            self.problems.append(msg)
                        else:
                            self.problems[late] += f"; {msg}"
                    return
            cancel.wait(POLL_S)
