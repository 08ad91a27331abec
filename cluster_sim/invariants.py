"""The invariants, checked offline on the data directories after every process of the
run stopped cleanly (so partition files hold everything: a clean stop checkpoints).

Reads partition files directly with :func:`checkpoint.pagefile.iter_entries` (the one
decoder); opens a PartitionStore + IndexStore only for the index check. Each check
returns a list of problems (empty: it holds); :func:`check_all` returns
``{name: problems}`` in a fixed order.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from checkpoint import pagefile, part_name
from node import partition_of

from .workload import Model

NAMES = ("acknowledged_writes_present", "no_removed_key_returns", "counters_unique", "owners_agree",
         "indexes_agree_with_data", "owning_copies", "no_temp_files_left", "wal_space_reclaimed")

TEMP_SUFFIXES = (".ferry-tmp", ".ferry-resume", ".delta", ".tmp", ".partial", ".recv")
MAX_WAL_SEGMENTS = 2      # after a clean stop: the segment of the previous marker + the current


@dataclass(frozen=True)
class Copy:
    """One node's copy of one partition, as its durable state file says."""
    node: str
    data_dir: str
    cache: str
    partition: int
    state: str

    @property
    def cache_dir(self) -> str:
        return os.path.join(self.data_dir, "caches", self.cache)

    @property
    def path(self) -> str:
        return os.path.join(self.cache_dir, part_name(self.partition))


@dataclass
class Layout:
    """What the driver tells the checker about the run's end state."""
    copies: list[Copy]
    partitions: int
    want_owning: int | dict[int, int]         # B+1 capped by the live nodes (or per partition)
    data_dirs: dict[str, str]                 # node -> data dir
    lost_reasons: dict[tuple[str, int], str]  # (cache, p) -> reason, for LOST partitions
    cache: str = "default"
    index_dirs: bool = True


def read_copy(c: Copy) -> dict[bytes, tuple[bytes, int]]:
    if not os.path.exists(c.path):
        return {}
    return {e.key: (e.value or b"", e.counter)
            for e in pagefile.iter_entries(c.path, include_tombstones=False)}


def check_all(layout: Layout, model: Model) -> dict[str, list[str]]:
    owning = [c for c in layout.copies if c.state == "OWNING"]
    data = {c: read_copy(c) for c in owning}
    out = {name: [] for name in NAMES}
    _model_checks(layout, model, data, out)
    out["counters_unique"] = counter_conflicts(model, layout.partitions)
    out["owners_agree"] = _owners_agree(data)
    out["indexes_agree_with_data"] = _indexes(layout, owning)
    out["owning_copies"] = _owning_copies(layout, owning)
    out["no_temp_files_left"] = _leftovers(layout)
    out["wal_space_reclaimed"] = _wal_space(layout)
    return out


def _model_checks(layout: Layout, model: Model, data: dict[Copy, dict], out: dict[str, list[str]]) -> None:
    by_part: dict[int, list[Copy]] = {}
    for c in data:
        by_part.setdefault(c.partition, []).append(c)
    keys = model.keys()
    for key in sorted(keys):
        p = partition_of(key, layout.partitions)
        for c in by_part.get(p, []):
            found = data[c].get(key)
            why = model.check(key, found[0] if found else None)
            if why:
                name = "no_removed_key_returns" if "came back" in why else "acknowledged_writes_present"
                out[name].append(f"{c.node} partition {p}: {why}")
    for c, entries in data.items():
        for key in entries.keys() - keys:
            out["no_removed_key_returns"].append(f"{c.node} partition {c.partition}: {key!r} "
                                                 "is present but was never written by the workload")
    for name in ("acknowledged_writes_present", "no_removed_key_returns"):
        if len(out[name]) > 20:
            out[name][20:] = [f"... and {len(out[name]) - 20} more"]


def counter_conflicts(model: Model, partitions: int) -> list[str]:
    """Two acknowledged writes that got the same (partition, counter) with different
    contents: two primaries acknowledged at the same point of the partition's history
    (a split brain). Counters come from the put/remove replies (the cluster driver)."""
    seen: dict[tuple[int, int], tuple[bytes, bytes | None, str]] = {}
    out: list[str] = []
    for a in model.acks:
        p = partition_of(a.key, partitions)
        who = f"acknowledged by {a.by or '?'}, routed by {a.via or '?'}"
        first = seen.setdefault((p, a.counter), (a.key, a.value, who))
        if first[:2] != (a.key, a.value):
            out.append(f"partition {p} counter {a.counter}: acknowledged for {first[0]!r} "
                       f"({first[2]}) and for {a.key!r} ({who})")
    if len(out) > 20:
        out[20:] = [f"... and {len(out) - 20} more"]
    return out


def digest(entries: dict[bytes, tuple[bytes, int]]) -> str:
    h = hashlib.sha256()
    for k in sorted(entries):
        v, c = entries[k]
        h.update(len(k).to_bytes(4, "big") + k + len(v).to_bytes(4, "big") + v + c.to_bytes(8, "big"))
    return h.hexdigest()[:16]


def _owners_agree(data: dict[Copy, dict]) -> list[str]:
    by_part: dict[int, dict[str, str]] = {}
    for c, entries in data.items():
        by_part.setdefault(c.partition, {})[c.node] = digest(entries)
    return [f"partition {p}: owners differ: {ds}" for p, ds in sorted(by_part.items())
            if len(set(ds.values())) > 1]


def _indexes(layout: Layout, owning: list[Copy]) -> list[str]:
    from checkpoint import PartitionStore
    from indexes import IndexStore
    problems: list[str] = []
    for node, d in layout.data_dirs.items():
        mine = [c for c in owning if c.node == node]
        idx_dir = os.path.join(d, "indexes", layout.cache)
        if not mine or not os.path.isdir(idx_dir):
            continue
        store = PartitionStore.open(os.path.join(d, "caches", layout.cache), checkpoint_interval=None)
        idx = IndexStore.open(idx_dir)
        try:
            if not idx.definitions:
                continue
            for c in mine:
                if not idx.ready(c.partition):
                    # not trusted: the node rebuilds it from the data before any read or
                    # change (an index a node stopped without rebuilding after an
                    # unclean start: docs/node.md, "Indexes after an unclean stop")
                    continue
                rep = idx.verify(c.partition, store)
                if not rep.ok:
                    problems.append(f"{node} partition {c.partition}: index disagrees with data: {rep}")
        finally:
            idx.close()
            store.close(checkpoint=False)
    return problems


def _owning_copies(layout: Layout, owning: list[Copy]) -> list[str]:
    count: dict[int, int] = {}
    for c in owning:
        count[c.partition] = count.get(c.partition, 0) + 1
    problems = []
    for p in range(layout.partitions):
        n = count.get(p, 0)
        want = layout.want_owning if isinstance(layout.want_owning, int) else layout.want_owning[p]
        if n == want:
            continue
        reason = layout.lost_reasons.get((layout.cache, p))
        if reason and n == 0:
            continue          # reported LOST with a reason: allowed
        problems.append(f"partition {p}: {n} OWNING copies, want {want}"
                        + (f" (LOST: {reason})" if reason else ""))
    return problems


def _leftovers(layout: Layout) -> list[str]:
    found = []
    for d in layout.data_dirs.values():
        for base, dirs, files in os.walk(d):
            found += [os.path.join(base, f) for f in files if f.endswith(TEMP_SUFFIXES)]
            if os.path.basename(base) == "tmpwal":
                found += [os.path.join(base, x) for x in dirs if os.listdir(os.path.join(base, x))]
    return found


def _wal_space(layout: Layout) -> list[str]:
    import wal
    problems = []
    for node, d in layout.data_dirs.items():
        wdir = os.path.join(d, "caches", layout.cache, "wal")
        if not os.path.isdir(wdir):
            continue
        rep = wal.verify(wdir)
        if rep.segments > MAX_WAL_SEGMENTS:
            problems.append(f"{node}: {rep.segments} WAL segments after a clean stop "
                            f"(want <= {MAX_WAL_SEGMENTS}: older ones are reclaimed)")
        if not rep.ok:
            problems.append(f"{node}: WAL damaged: {rep.corruption}")
    return problems
