"""A linearizability checker for histories of registers, one per key.

**Model.** Every key is a register: a write sets it (a remove sets it to absent,
None), a read returns it; it starts absent. A history (:mod:`cluster_sim.history`) is
linearizable when every operation can be given one instant between its invocation and
its completion such that, in the order of those instants, each read returns the value
of the last write before it. ``fail`` operations had no effect and are left out; a
write with an unknown outcome (``info``) may take effect at any instant after its
invocation, or never (which is the same as at the very end: nothing observes it then);
a read that did not return observed nothing and is left out.

**P-compositionality.** Linearizability is local: a history is linearizable iff each
key's sub-history is, so every key is checked on its own (Herlihy & Wing; Horn & Kroening
call the split by key "P-compositionality"). Small searches instead of one huge one.

**The search** is Wing & Gong's, with Lowe's memoization, as Knossos and Porcupine do
it: the history's invocations and completions in time order form a doubly linked list;
walking it, an invocation whose operation is consistent with the register's state is
tentatively linearized (its call and return are lifted out of the list, the state
advances, and the walk restarts from the head); reaching a completion whose operation
is not linearized yet means the choices so far were wrong: the last one is undone and
the walk goes on after it. A configuration (the set of linearized operations as a
bitset, the register's state) seen before is never explored again, which bounds the
search by (subsets x states) rather than by orderings.

**Reporting.** For a key whose history fails, :func:`minimal` finds a small failing
sub-history: the shortest failing prefix (histories are prefix-closed: cut at the
k-th completion, an operation still running there is a write of unknown outcome or a
read that observed nothing), then greedy deletion of operations whose removal keeps it
failing -- only reads, and writes whose value no remaining read returned, since
deleting either can never turn a linearizable history into a failing one, so what is
left fails only if the whole history does.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Iterable

from .history import FAIL, INFO, OK, READ, WRITE, Operation

ABSENT: bytes | None = None


@dataclass
class KeyResult:
    key: bytes
    ok: bool
    ops: int                               # operations checked (fail ones left out)
    seconds: float
    minimal: list[Operation] = field(default_factory=list)   # a small failing sub-history
    linearized: int = 0                    # the longest linearized prefix the search reached
    gave_up: bool = False                  # the search hit its budget (counted as ok)


@dataclass
class Result:
    ok: bool
    keys: int
    ops: int
    seconds: float
    failures: list[KeyResult] = field(default_factory=list)
    gave_up: list[bytes] = field(default_factory=list)


def prepare(ops: Iterable[Operation]) -> list[Operation]:
    """What the search takes: no ``fail`` operation, no read that did not return, and
    every unknown write completing at +infinity."""
    out = []
    for op in ops:
        if op.status == FAIL or (op.kind == READ and (op.status != OK or op.ret is None)):
            continue
        if op.kind == WRITE and (op.status == INFO or op.ret is None):
            op = replace(op, ret=math.inf, status=INFO)
        out.append(op)
    return out


class _Budget(Exception):
    pass


def linearizable(ops: list[Operation], init: bytes | None = ABSENT, *,
                 max_steps: int = 2_000_000) -> tuple[bool, int]:
    """Wing-Gong-Lowe on one register (``ops`` already prepared). Returns (ok, the
    most operations linearized at once); raises _Budget after ``max_steps``."""
    n = len(ops)
    if n == 0:
        return True, 0
    # entries: invocations before completions at the same instant (they overlap then)
    events = sorted([(op.call, 0, i) for i, op in enumerate(ops)] +
                    [(op.ret if op.ret is not None else math.inf, 1, i) for i, op in enumerate(ops)])
    size = len(events)
    head, tail = 0, size + 1            # sentinels around entries 1..size
    nxt = list(range(1, size + 2)) + [tail]
    prv = [head] + list(range(0, size + 1))
    is_ret = [False] * (size + 2)
    op_of = [0] * (size + 2)
    ret_pos = [0] * n
    call_pos = [0] * n
    for pos, (_, kind, i) in enumerate(events, 1):
        is_ret[pos] = bool(kind)
        op_of[pos] = i
        if kind:
            ret_pos[i] = pos
        else:
            call_pos[i] = pos

    def lift(c: int) -> None:
        nxt[prv[c]] = nxt[c]
        prv[nxt[c]] = prv[c]
        r = ret_pos[op_of[c]]
        nxt[prv[r]] = nxt[r]
        prv[nxt[r]] = prv[r]

    def unlift(c: int) -> None:
        r = ret_pos[op_of[c]]
        prv[nxt[r]] = r
        nxt[prv[r]] = r
        prv[nxt[c]] = c
        nxt[prv[c]] = c

    kinds = [op.kind == WRITE for op in ops]
    values = [op.value for op in ops]
    state = init
    linearized = 0
    seen: set[tuple[int, bytes | None]] = set()
    stack: list[tuple[int, bytes | None]] = []
    best = 0
    steps = 0
    entry = nxt[head]
    while nxt[head] != tail:
        steps += 1
        if steps > max_steps:
            raise _Budget()
        if not is_ret[entry]:
            i = op_of[entry]
            if kinds[i]:
                ok, new = True, values[i]
            else:
                ok, new = values[i] == state, state
            if ok:
                config = (linearized | (1 << i), new)
                if config not in seen:
                    seen.add(config)
                    stack.append((entry, state))
                    state, linearized = new, config[0]
                    lift(entry)
                    best = max(best, len(stack))
                    entry = nxt[head]
                    continue
            entry = nxt[entry]
        else:
            if not stack:
                return False, best
            entry, state = stack.pop()
            linearized &= ~(1 << op_of[entry])
            unlift(entry)
            entry = nxt[entry]
    return True, best


def _fails(ops: list[Operation], max_steps: int) -> bool:
    try:
        return not linearizable(prepare(ops), max_steps=max_steps)[0]
    except _Budget:
        return False


def _prefix(ops: list[Operation], t: float) -> list[Operation]:
    """The history as it stood at instant ``t``: operations invoked by then; one still
    running is a write of unknown outcome, or a read that observed nothing (left out)."""
    out = []
    for op in ops:
        if op.call > t:
            continue
        if op.ret is not None and op.ret <= t:
            out.append(op)
        elif op.kind == WRITE:
            out.append(replace(op, ret=None, status=INFO))
    return out


def minimal(ops: list[Operation], *, max_steps: int = 200_000, budget_s: float = 10.0) -> list[Operation]:
    """A small failing sub-history of a failing one (see the module doc)."""
    ops = prepare(ops)
    ends = sorted({op.ret for op in ops if op.ret is not None and op.ret != math.inf})
    lo, hi = 0, len(ends) - 1            # the earliest completion at which it fails
    if ends and _fails(_prefix(ops, ends[hi]), max_steps):
        while lo < hi:
            mid = (lo + hi) // 2
            if _fails(_prefix(ops, ends[mid]), max_steps):
                hi = mid
            else:
                lo = mid + 1
        cur = _prefix(ops, ends[lo])
    else:
        cur = list(ops)
    deadline = time.monotonic() + budget_s
    i = 0
    while i < len(cur) and time.monotonic() < deadline:
        op = cur[i]
        observed = {o.value for o in cur if o.kind == READ}
        if op.kind == READ or op.value not in observed:
            trial = cur[:i] + cur[i + 1:]
            if _fails(trial, max_steps):
                cur = trial
                continue
        i += 1
    return sorted(cur, key=lambda o: o.call)


def by_key(ops: Iterable[Operation]) -> dict[bytes, list[Operation]]:
    out: dict[bytes, list[Operation]] = {}
    for op in ops:
        out.setdefault(op.key, []).append(op)
    return out


def check(ops: Iterable[Operation], *, max_steps: int = 2_000_000) -> Result:
    """Every key's history as a register; a key whose search runs past ``max_steps``
    is reported in ``gave_up`` (not failed: unknown)."""
    t0 = time.monotonic()
    failures, gave_up = [], []
    n_ops = 0
    keys = by_key(ops)
    for key, hist in sorted(keys.items()):
        prepared = prepare(hist)
        n_ops += len(prepared)
        k0 = time.monotonic()
        try:
            ok, best = linearizable(prepared, max_steps=max_steps)
        except _Budget:
            gave_up.append(key)
            continue
        if not ok:
            failures.append(KeyResult(key, False, len(prepared), round(time.monotonic() - k0, 3),
                                      minimal(hist), best))
    return Result(not failures, len(keys), n_ops, round(time.monotonic() - t0, 3), failures, gave_up)


def describe(kr: KeyResult, t0: float = 0.0) -> list[str]:
    """One line per operation of the minimal failing sub-history (times in s from t0)."""
    def v(x: bytes | None) -> str:
        if x is None:
            return "absent"
        s = x.decode("utf-8", "backslashreplace")
        return repr(s[:32] + ("..." if len(s) > 32 else ""))
    lines = [f"{kr.key!r}: not linearizable ({kr.ops} operations; at most {kr.linearized} "
             f"linearized at once); a failing sub-history of {len(kr.minimal)}:"]
    for op in kr.minimal:
        end = "?" if op.ret is None or op.ret == math.inf else f"{op.ret - t0:.3f}"
        what = f"{'write' if op.kind == WRITE else 'read'} {v(op.value)}"
        how = op.status + (f" ({op.error[:80]})" if op.error else "")
        lines.append(f"  {op.process:>8} {op.call - t0:8.3f} .. {end:>8}  {what:<40} {how}"
                     + (f" via {op.via}" if op.via else ""))
    return lines


__all__ = ["check", "linearizable", "minimal", "prepare", "by_key", "describe", "Result", "KeyResult",
           "ABSENT"]
