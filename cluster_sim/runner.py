"""One run: a scenario under one seed and one crash plan.

  start processes (the crash plan only in the target's FERRY_CRASH)
  -> writers run the seeded workload, the model records what was acknowledged, the
     history every operation (invocation, completion, outcome)
  -> topology events fire when the workload has issued ``at`` operations
  -> a process that kills itself at its crash point is restarted (without the plan)
  -> settle -> reads through every node (cluster) -> clean stop of every process
  -> invariants on the data directories, and the history checked for linearizability
     (``linearizable``: every key a register; a failure names the smallest failing
     sub-history and the faults around it)

Everything after the driver's setup runs in a worker thread under the scenario's time
budget; a run past it fails naming the step it was stuck in (:mod:`cluster_sim.budget`).

The result's JSON is ``{"passed", "invariants": {NAME: bool}, "seed"}``; the rest
(problems, timeline, trace of reached points) is kept beside it for reports.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .budget import GRACE_S, Budget
from .drivers import ClusterDriver, Driver
from .errors import SimError
from .history import READ, WRITE, History
from .invariants import NAMES, check_all
from .linearizable import check as check_linearizable
from .linearizable import describe
from .procs import read_trace
from .scenario import CrashPlan, Scenario, validate
from .timeline import Timeline
from .workload import Model, generate

LINEARIZABLE = "linearizable"
FAULT_LOOKBACK_S = 5.0    # timeline marks this long before a failing sub-history are shown with it

SAMPLE_S = 0.5


@dataclass
class RunResult:
    scenario: str
    seed: int
    crash: str | None
    side: str | None
    passed: bool
    invariants: dict[str, bool]
    problems: dict[str, list[str]]
    seconds: float
    reached: list[str]
    acked: int
    unsure: int
    timeline: Timeline
    dir: str | None = None
    error: str | None = None
    exit_codes: dict[str, int | None] = field(default_factory=dict)

    @property
    def failed(self) -> dict[str, list[str]]:
        """The checks that failed, with what each found (``problems`` lists every
        check, the ones that passed with no finding)."""
        return {name: found for name, found in self.problems.items() if found}

    def to_json(self) -> dict[str, Any]:
        """The schema of ``ferry sim run --json`` (docs/harness.md): exactly these keys."""
        return {"passed": self.passed, "invariants": self.invariants, "seed": self.seed}

    def details(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "seed": self.seed, "crash": self.crash, "side": self.side,
                "passed": self.passed, "invariants": self.invariants, "problems": self.problems,
                "seconds": self.seconds, "reached": self.reached, "acked": self.acked,
                "unsure": self.unsure, "dir": self.dir, "error": self.error,
                "exit_codes": self.exit_codes, "timeline": self.timeline.to_dict()}


def make_driver(s: Scenario, *args: Any, **kw: Any) -> Driver:
    return ClusterDriver(s, *args, **kw)


@dataclass
class _Outcome:
    """What the worker thread of one run produced (the main thread reads it)."""
    problems: dict[str, list[str]] = field(default_factory=dict)
    codes: dict[str, int | None] = field(default_factory=dict)
    error: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(self, error: str, *, first: bool = True) -> None:
        with self.lock:
            if self.error is None or not first:
                self.error = error


def run(scenario: Scenario, *, seed: int = 0, crash: CrashPlan | None = None,
        workdir: str | None = None, keep: bool = False,
        net: Any = None, expected: str | None = None,
        log: Callable[[str], None] = lambda m: None) -> RunResult:
    """One run. ``expected``: also write the model of acknowledged writes there (JSON
    lines for ``ferry validate --expected``, see :meth:`Model.expected_file`); keep the
    run folder (``keep``) to validate its data directories.

    The run works in a thread under the scenario's time budget
    (:meth:`Scenario.budget`); past it every process is killed and the run fails with
    ``run_completed`` naming the step it was stuck in (:mod:`cluster_sim.budget`)."""
    s = validate(scenario.with_crash(crash) if crash is not None else scenario)
    if workdir is not None:
        os.makedirs(workdir, exist_ok=True)     # --workdir may name a folder to create
    run_dir = tempfile.mkdtemp(prefix=f"sim-{s.name}-{seed}-", dir=workdir)
    tl, model, history = Timeline(), Model(), History()
    spec = s.crash.spec(seed) if s.crash else None
    t0 = time.monotonic()
    budget = Budget(s.budget())
    try:
        driver = make_driver(s, seed, run_dir, tl, model, spec, net=net, history=history)
    except Exception:
        shutil.rmtree(run_dir, ignore_errors=True)   # e.g. SimSkipped: no tmpfs here
        raise
    out = _Outcome()
    log(f"run {s.name} seed={seed} crash={spec or '-'} side={s.crash.side if s.crash else '-'} "
        f"budget={budget.seconds:.0f}s in {run_dir}")
    worker = threading.Thread(target=_work, args=(driver, s, model, tl, log, budget, out, expected),
                              name=f"run-{s.name}-{seed}", daemon=True)
    worker.start()
    try:
        worker.join(budget.left())
        if worker.is_alive():
            budget.expired = True
            out.fail(budget.verdict(), first=False)
            log(f"run failed: {out.error}")
            tl.mark("-", "over budget", budget.describe())
            driver.kill_all()          # blocked calls into the processes now fail
            worker.join(GRACE_S)
    except BaseException:
        driver.kill_all()              # interrupted (^C): leave no process behind
        driver.cleanup()
        raise
    try:
        driver.cleanup()
    except Exception as e:  # noqa: BLE001 - a mount that would not go is a failed run
        out.fail(f"cleanup: {type(e).__name__}: {e}")
    problems = {} if budget.expired else out.problems
    error = out.error
    reached = sorted(read_trace(driver.trace))
    invariants = {n: not problems.get(n, ["not checked"]) for n in (*NAMES, LINEARIZABLE)}
    for name, bad in driver.extra_checks().items():
        invariants[name] = not bad
        if bad:
            problems[name] = bad
    if s.crash and s.crash.probability is None:
        # A cell whose crash never fired proves nothing about that point: it fails.
        invariants["crash_point_reached"] = bool(driver.crashed)
        if not driver.crashed:
            problems["crash_point_reached"] = [f"{spec} never fired in {s.target()}"]
    if error:
        invariants["run_completed"] = False
        problems["run_completed"] = [error]
    passed = all(invariants.values())
    res = RunResult(s.name, seed, s.crash.label() if s.crash else None,
                    s.crash.side if s.crash else None, passed, invariants, problems,
                    round(time.monotonic() - t0, 2), reached, model.n_acked, model.n_unsure,
                    tl, run_dir, error, out.codes)
    if passed and not keep:
        shutil.rmtree(run_dir, ignore_errors=True)
        res.dir = None
    return res


def _work(driver: Driver, s: Scenario, model: Model, tl: Timeline, log: Callable[[str], None],
          budget: Budget, out: _Outcome, expected: str | None) -> None:
    """The steps of one run (in the run's worker thread)."""
    try:
        budget.enter("start")
        driver.start()
        budget.enter("events")
        _drive(driver, s, driver.seed, model, tl, log, budget)
        budget.enter("settle")
        deadline = time.monotonic() + s.settle_timeout
        next_sample = 0.0
        while not driver.settled():
            driver.poll()
            if time.monotonic() >= next_sample:
                driver.sample()
                next_sample = time.monotonic() + SAMPLE_S
            if time.monotonic() > deadline:
                raise SimError(f"did not settle within {s.settle_timeout}s: {driver.unsettled()}")
            if budget.expired:
                return
            time.sleep(0.2)
        tl.mark("-", "settled")
        if budget.expired:
            return
        budget.enter("reads", "every node's view reads every key")
        driver.after_settle()
        budget.enter("stop")
        out.codes = codes = driver.stop()
        tl.mark("-", "stop")
        if any(c == -9 for c in codes.values()) and not driver.crashed:
            driver.crashed.append("(at shutdown)")  # the armed point fired in the final stop
        budget.enter("checks")
        _recover_unclean(driver, codes)
        lin = linearizability(driver.history, tl, driver.dir)
        layout = driver.layout()
        out.problems = check_all(layout, model) | {LINEARIZABLE: lin}
        if expected:
            model.expected_file(expected, layout.partitions, layout.cache)
    except Exception as e:  # noqa: BLE001 - a run that cannot finish is a failed cell, with why
        if budget.expired:
            return                     # the main thread gave up on us and said why
        out.fail(f"{type(e).__name__}: {e}")
        log(f"run failed: {out.error}")
        driver.kill_all()


def _drive(driver: Driver, s: Scenario, seed: int, model: Model, tl: Timeline,
           log: Callable[[str], None], budget: Budget | None = None) -> None:
    """Writers + events + crash handling until every operation was issued, every
    event fired and no fault is still running by itself (a flap).

    An event due by its op count (no ``min_wait``) is a gate: no writer issues
    operation ``at`` + 1 before it fired, so it lands at its op however slow the loop
    that fires it is (status samples take a while; unpaced writers do not wait)."""
    ops = generate(s.workload, seed)
    total = sum(len(x) for x in ops)
    issued = [0]
    lock = threading.Lock()
    stop = threading.Event()
    pending = sorted(s.events, key=lambda e: e.at)

    def take_turn() -> bool:
        """Count one more operation, unless the next event is due first."""
        with lock:
            head = pending[0] if pending else None
            if head is None or head.min_wait > 0 or issued[0] < head.at:
                issued[0] += 1
                return True
        return False

    def writer(w: int) -> None:
        client = driver.client(w)
        interval = 1.0 / s.workload.rate if s.workload.rate > 0 else 0.0
        history = driver.history
        try:
            for op in ops[w]:
                while not stop.is_set() and not take_turn():
                    time.sleep(0.005)
                if stop.is_set():
                    return
                process = f"w{w}" if w < s.workload.writers else f"r{w - s.workload.writers}"
                h = history.invoke(process, READ if op.read else WRITE, op.key,
                                   None if op.read else op.value)
                try:
                    if op.read:
                        history.ok(h, driver.read(client, op))
                    else:
                        model.ack(op, driver.apply(client, op))
                        history.ok(h)
                except Exception as e:  # noqa: BLE001 - not returned: may or may not be there
                    if not op.read:
                        model.unsure(op)
                    history.failed(h, e)
                history.via(h, driver.via(client))
                if interval:
                    time.sleep(interval)
        finally:
            driver.close_client(client)

    threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(len(ops))]
    for t in threads:
        t.start()
    next_sample = 0.0
    last_event = time.monotonic()

    def due(ev: Any) -> bool:
        since = time.monotonic() - last_event
        return since >= ev.min_wait and (
            issued[0] >= ev.at or not any(t.is_alive() for t in threads)
            or (ev.max_wait > 0 and since >= ev.max_wait))
    try:
        while any(t.is_alive() for t in threads) or pending or driver.busy():
            if budget and budget.expired:
                return              # the run is over; the main thread said why
            driver.poll()
            while pending and due(pending[0]):
                with lock:
                    ev = pending.pop(0)
                what = f"{ev.action} {ev.node}".rstrip()
                tl.mark(ev.node or "-", ev.action, f"at op {issued[0]}")
                log(f"  event {what} at op {issued[0]}")
                if budget:
                    budget.note(f"in event {what!r}, op {issued[0]} of {total}")
                driver.event(ev)
                last_event = time.monotonic()
            if budget:
                budget.note(f"op {issued[0]} of {total} issued; {len(pending)} event(s) to come"
                            + ("; a flap is running" if driver.busy() else ""))
            if time.monotonic() >= next_sample:
                driver.sample()
                next_sample = time.monotonic() + SAMPLE_S
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(60)


def linearizability(history: History, tl: Timeline, run_dir: str | None = None) -> list[str]:
    """The run's history checked key by key (:mod:`cluster_sim.linearizable`): for each
    key that fails, its smallest failing sub-history and the timeline marks around it
    (the faults in force). The history is written to ``history.jsonl`` in the run
    folder (kept when the run fails)."""
    ops = history.snapshot()
    if run_dir is not None:
        _dump(ops, os.path.join(run_dir, "history.jsonl"), tl.t0)
    res = check_linearizable(ops)
    tl.mark("-", "linearizable", f"{res.ops} operations on {res.keys} keys checked in {res.seconds:.2f}s: "
            + ("ok" if res.ok else f"{len(res.failures)} key(s) not linearizable")
            + (f"; gave up on {len(res.gave_up)}" if res.gave_up else ""))
    out: list[str] = []
    for kr in res.failures[:5]:
        out.extend(describe(kr, tl.t0))
        times = [o.call for o in kr.minimal] + [o.ret for o in kr.minimal if o.ret not in (None, float("inf"))]
        lo, hi = min(times) - tl.t0 - FAULT_LOOKBACK_S, max(times) - tl.t0 + 1.0
        around = [m for m in tl.marks if lo <= m.t <= hi and m.kind not in ("writes", LINEARIZABLE)]
        out.append("  around it: " + ("; ".join(f"{m.t:.1f}s {m.node} {m.kind}"
                                                 + (f" ({m.detail[:60]})" if m.detail else "")
                                                 for m in around) or "no fault marked"))
    if len(res.failures) > 5:
        out.append(f"... and {len(res.failures) - 5} more keys")
    return out


def _dump(ops: list, path: str, t0: float) -> None:
    import json
    with open(path, "w") as f:
        for o in ops:
            f.write(json.dumps({"process": o.process, "kind": o.kind, "key": o.key.decode("utf-8", "replace"),
                                "value": None if o.value is None else o.value.decode("utf-8", "replace"),
                                "call": round(o.call - t0, 6),
                                "ret": None if o.ret is None else round(o.ret - t0, 6),
                                "status": o.status, "via": o.via, "error": o.error}) + "\n")


def _recover_unclean(driver: Driver, codes: dict[str, int | None]) -> None:
    """A process whose last stop was not clean left its updates in the WAL only: run
    the store's recovery (what a restart does) so the partition files hold them."""
    from checkpoint import PartitionStore
    for name, code in codes.items():
        if code in (0, None):
            continue
        cache_root = os.path.join(driver.data_dir(name), "caches")
        for cache in os.listdir(cache_root) if os.path.isdir(cache_root) else []:
            PartitionStore.open(os.path.join(cache_root, cache), checkpoint_interval=None).close()
