"""A seeded workload and the model of acknowledged writes.

The workload is a fixed list of operations per writer, derived from the seed alone, so
the same seed gives the same operations in the same order. Writers use disjoint keys
(``w<writer>-...``): each key then has one writer, and its operations are ordered.
With ``read_ratio`` > 0 that fraction of each writer's operations are reads, of any
writer's keys (so a key's history has several processes: its writer and the readers);
the writes are the same as without reads, in the same order (reads draw from a
random stream of their own). ``readers`` adds processes that only read (``ops`` reads
each, of any writer's keys): a writer waits out a write the cluster cannot take yet,
a reader goes on reading meanwhile. Every operation, read or write, enters the run's history
(:mod:`cluster_sim.history`), which the linearizability check reads.

The model (Hypothesis-style: a model beside the real system) records per key the last
*acknowledged* value (a put or remove whose call returned) and the values of later
operations that did not return (in flight at a crash, or failed): those "may or may
not be there". After the run, a copy of the key must hold the acknowledged value or one
of those later candidates; a key whose last acknowledged operation was a remove must be
absent unless a later unacknowledged put may have landed.

It also keeps the partition update counter each acknowledged write got (the put or
remove returns it) and the node whose view routed it: two acknowledged writes with the
same (partition, counter) and different contents mean two primaries acknowledged at
once (a split brain), see :func:`cluster_sim.invariants.counter_conflicts`.
"""
from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field

from .scenario import WorkloadSpec

CITIES = ("oslo", "lima", "pune", "kyiv", "quito", "hanoi", "dakar", "riga")
ABSENT = None        # a removed or never-written key


@dataclass(frozen=True)
class Op:
    writer: int                   # its process: writers first, then the readers
    seq: int                      # a write: its place among the writer's writes; a read: in its list
    key: bytes
    value: bytes | None           # None: remove (or a read)
    read: bool = False            # a read of ``key`` (``value`` unused)


def _value(rng: random.Random, key: bytes, seq: int, size: tuple[int, int]) -> bytes:
    n = rng.randint(*size)
    doc = {"k": key.decode(), "s": seq, "city": rng.choice(CITIES), "pad": ""}
    raw = json.dumps(doc, separators=(",", ":"))
    doc["pad"] = "x" * max(0, n - len(raw))
    return json.dumps(doc, separators=(",", ":")).encode()


def _pick(rng: random.Random, spec: WorkloadSpec, seq: int) -> int:
    if spec.distribution == "sequential":
        return seq % spec.keys
    if spec.distribution == "zipf":
        # A few hot keys get most writes: index ~ keys * u^3 (cheap, no numpy, seeded).
        return min(spec.keys - 1, int(spec.keys * rng.random() ** 3))
    return rng.randrange(spec.keys)


def generate(spec: WorkloadSpec, seed: int) -> list[list[Op]]:
    """Every writer's operations, from ``seed`` alone."""
    out: list[list[Op]] = []
    for w in range(spec.writers):
        rng = random.Random(f"ferry-sim:{seed}:{w}")
        reads = random.Random(f"ferry-sim-reads:{seed}:{w}")
        live: set[bytes] = set()
        ops: list[Op] = []
        i = 0                      # writes so far: their keys, values and seq as without reads
        for pos in range(spec.ops):
            if spec.read_ratio and reads.random() < spec.read_ratio:
                other = reads.randrange(spec.writers)
                ops.append(Op(w, pos, b"w%d-k%05d" % (other, _pick(reads, spec, i)), None, read=True))
                continue
            key = b"w%d-k%05d" % (w, _pick(rng, spec, i))
            if key in live and rng.random() < spec.remove_ratio:
                ops.append(Op(w, i, key, None))
                live.discard(key)
            else:
                ops.append(Op(w, i, key, _value(rng, key, i, spec.value_size)))
                live.add(key)
            i += 1
        out.append(ops)
    for r in range(spec.readers):
        rng = random.Random(f"ferry-sim-reader:{seed}:{r}")
        out.append([Op(spec.writers + r, pos, b"w%d-k%05d" % (rng.randrange(spec.writers),
                                                            _pick(rng, spec, pos)), None, read=True)
                    for pos in range(spec.ops)])
    return out


def preload(spec: WorkloadSpec, seed: int) -> list[tuple[bytes, bytes]]:
    """Entries loaded before the clock starts (put in bulk through the nodes), the
    same for a seed; the model knows them as acknowledged once the bulk put returned."""
    rng = random.Random(f"ferry-sim-preload:{seed}")
    return [(b"pre-%06d" % i, _value(rng, b"pre-%06d" % i, 0, spec.value_size))
            for i in range(spec.preload)]


@dataclass(frozen=True)
class Receipt:
    """What a driver knows of one acknowledged write."""
    counter: int | None           # the partition update counter the put/remove returned
    via: str = ""                 # the node whose map routed it
    by: str = ""                  # the node that answered (the primary that acknowledged)


@dataclass(frozen=True)
class Ack:
    """One acknowledged write: what, the counter the cluster gave it, through whom."""
    key: bytes
    value: bytes | None
    counter: int
    via: str                      # the node whose map routed the write ("" unknown)
    by: str = ""                  # the node that acknowledged it
    at: float = 0.0               # time.monotonic() of the acknowledgement


@dataclass
class Model:
    acked: dict[bytes, bytes | None] = field(default_factory=dict)
    maybe: dict[bytes, list[bytes | None]] = field(default_factory=dict)
    n_acked: int = 0
    n_unsure: int = 0
    acks: list[Ack] = field(default_factory=list)     # writes acknowledged with a counter
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def load(self, entries: list[tuple[bytes, bytes]]) -> None:
        with self._lock:
            for k, v in entries:
                self.acked[k] = v

    def ack(self, op: Op, receipt: Receipt | None = None) -> None:
        """The call returned: this is now the key's value, earlier doubts are settled.
        ``receipt``: the counter it got, who routed and who acknowledged it."""
        with self._lock:
            self.acked[op.key] = op.value
            self.maybe.pop(op.key, None)
            self.n_acked += 1
            if receipt is not None and isinstance(receipt.counter, int):
                self.acks.append(Ack(op.key, op.value, receipt.counter, receipt.via, receipt.by,
                                     time.monotonic()))

    def unsure(self, op: Op) -> None:
        """The call did not return (crash, timeout, error): it may or may not be there."""
        with self._lock:
            self.maybe.setdefault(op.key, []).append(op.value)
            self.n_unsure += 1

    def keys(self) -> set[bytes]:
        return set(self.acked) | set(self.maybe)

    def allowed(self, key: bytes) -> list[bytes | None]:
        return [self.acked.get(key, ABSENT), *self.maybe.get(key, [])]

    def check(self, key: bytes, found: bytes | None) -> str | None:
        """None when ``found`` is a value the key may hold; else what is wrong."""
        allowed = self.allowed(key)
        if found in allowed:
            return None
        last = self.acked.get(key, ABSENT)
        if found is not None and last is None and key in self.acked:
            return f"{key!r} was removed (acknowledged) but came back"
        if found is None:
            return f"{key!r}: acknowledged value lost (expected {_short(last)})"
        return f"{key!r}: holds {_short(found)}, expected {_short(last)}" + (
            f" or one of {len(allowed) - 1} unacknowledged values" if len(allowed) > 1 else "")

    def expected_file(self, path: str, partitions: int, cache: str | None = None) -> int:
        """The acknowledged model as JSON lines for ``ferry validate --expected`` /
        ``validation.validate(expected=...)``: ``key``, ``partition`` (``partition_of``
        over ``partitions``, as the nodes place keys), ``value`` (null: must be absent)
        and ``cache`` when given. Keys with doubts are left out (Spark cannot express
        "one of"); if such a key is present the validator counts it as ``extra``.
        Returns the number of rows written."""
        from node import partition_of
        n = 0
        with open(path, "w") as f:
            for k, v in sorted(self.acked.items()):
                if k in self.maybe:
                    continue
                row = {"key": k.decode(), "partition": partition_of(k, partitions),
                       "value": None if v is None else v.decode()}
                if cache is not None:
                    row["cache"] = cache
                f.write(json.dumps(row) + "\n")
                n += 1
        return n


def _short(v: bytes | None) -> str:
    if v is None:
        return "absent"
    return repr(v[:40]) + ("..." if len(v) > 40 else "")
