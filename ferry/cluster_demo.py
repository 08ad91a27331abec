"""``ferry demo`` on a cluster: 3 node processes on loopback, 512 MB of indexed entries
(16 partitions of about 32 MB), a 4th node joins and takes its partitions file-based
while a writer keeps writing. The summary sets the moves' rates (each move's over its
transfer stage, the whole rebalance's over its wall time) beside the raw rate of this
machine, measured in the same run (:func:`raw_sendfile_rate`). Right
after the rebalance, with the writer still writing, Spark validates the RUNNING cluster
(live mode: each partition's copies fetched through the transfer agents at one fenced
counter, validation/live.py; authenticated as the nodes' links are, with the cluster
secret or, with ``tls``, a validator certificate). Then the nodes stop, the demo checks the invariants on
the files every node left, and the Spark job validates those files (folder mode)
against the model of acknowledged writes.

The moves themselves are the node's (node/filemove.py): MOVING, temp WAL, DEMAND,
sendfile transfer with copy-on-write pre-images, install, index rebuild, replay,
checkpoint, OWNING; the old owner goes RENTING -> EVICTED.
"""
from __future__ import annotations

import json
import os
import random
import socket
import threading
import time
from typing import Any

import xxhash

from checkpoint import pagefile
from indexes import IndexDefinition, IndexStore, PartitionFileSource
from node.assignment import partition_of
from .localcluster import LocalCluster, key_of, value_of
from node.move import FILE_STAGES

from .demo_ui import DemoUI, MoveRow, mb, move_row, rebalance_rates
from .demo_validate import DemoSpark, session

CACHE = "default"
INDEX = IndexDefinition("by_city", "city")
# 512 MB in 16 partitions: about 32 MB each, so a move's rate is its transfer's, not its
# fixed costs' (prepare, demand, connecting: ~0.1 s whatever the size); 1 GB made the
# live validation (both copies of every partition at 100 MB/s) alone take ~45 s
ENTRIES = 8_192
VALUE_SIZE = 65_536
LOAD_CHUNK = 256           # entries a loading client groups by partition (a progress report each)
RAW_MB = 256               # the raw sendfile measured beside the moves


# the model of acknowledged writes: key -> value_hash of its value (None: removed)
Model = dict[bytes, int | None]


def value_hash(value: bytes) -> int:
    """Spark's ``xxhash64(value)`` (seed 42, signed 64-bit): the ``value_hash`` of the
    validation's expected file (validation/expected.py), so the model holds 8 bytes per
    key instead of the value."""
    h = xxhash.xxh64_intdigest(value, seed=42)
    return h - (1 << 64) if h >= 1 << 63 else h


class Writer(threading.Thread):
    """Overwrites and removes random loaded keys; a write counts once its call returned."""

    def __init__(self, cluster: LocalCluster, entries: int, model: Model,
                 seed: int = 7) -> None:
        super().__init__(name="demo-writer", daemon=True)
        self.cluster, self.entries, self.model = cluster, entries, model
        self.rng = random.Random(seed)
        self.stop_evt = threading.Event()
        self.writes = 0
        self.errors = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.cluster.client() as c:
                version = 0
                while not self.stop_evt.is_set():
                    i = self.rng.randrange(self.entries)
                    key = key_of(i)
                    version += 1
                    if self.rng.random() < 0.05:
                        c.remove(CACHE, key)
                        self.model[key] = None
                    else:
                        value = json.dumps({"i": i, "city": "moved", "v": version}).encode()
                        c.put(CACHE, key, value)
                        self.model[key] = value_hash(value)
                    self.writes += 1
        except BaseException as e:  # noqa: BLE001 - reported in the summary
            self.error = e


def run_cluster_demo(root: str, *, entries: int, value_size: int, partitions: int, nodes: int,
                     validate: bool, master: str, ui: DemoUI, raw_mb: int = RAW_MB,
                     protect: bool = True, tls: bool = True) -> dict[str, Any]:
    """The demo's summary (``--json``). ``validate``: both Spark validations, live
    and offline, in one Spark session (started for the first). ``raw_mb``: the size of
    the raw sendfile measured beside the moves (0: not measured). ``protect``: the
    nodes' foreground protection (``[rebalance] protect``), which paces the moves while
    the writer writes. ``tls``: the nodes' links (node RPC, client RPC, transfers) are
    mutual TLS with certificates of the cluster's CA; False: the shared secret."""
    with session(ui, master=master, jvm_log=os.path.join(root, "spark.log")) as spark:
        return _run(root, entries=entries, value_size=value_size, partitions=partitions,
                    nodes=nodes, spark=spark if validate else None, master=master, ui=ui,
                    raw_mb=raw_mb, protect=protect, tls=tls)


def links_line(tls: bool) -> str:
    """How the nodes' links are authenticated, for the demo's output."""
    if tls:
        return ("mutual TLS 1.3 (a certificate of the cluster CA per node, for the demo's clients "
                "and for the live validator)")
    return "shared secret (HMAC handshake, sealed frames, no encryption; --tls: mutual TLS)"


def validator_line(c: LocalCluster) -> str:
    """How the live validation authenticates, for the demo's output and summary."""
    files = c.validator_tls
    if files is None:
        return "the cluster secret"
    from transfer.tls import file_identity
    who = file_identity(files.cert)
    return f"mutual TLS, certificate ferry://{who.role}/{who.name}" if who is not None else "mutual TLS"


def _run(root: str, *, entries: int, value_size: int, partitions: int, nodes: int,
         spark: DemoSpark | None, master: str, ui: DemoUI, raw_mb: int,
         protect: bool, tls: bool = True) -> dict[str, Any]:
    t0 = time.monotonic()
    model: Model = {}
    with LocalCluster(root, partitions=partitions, backups=1, mode="files",
                      protect=None if protect else False, tls=tls, etcd_tls=True) as c:
        ui.step(f"starting a local etcd (the control plane) and {nodes} nodes on loopback in {root}")
        c.start(nodes)
        ui.note(f"control plane {', '.join(c.control_plane)} (TLS, client certificates, an etcd user "
                f"per role); controller {c.status().get('controller')}, "
                f"lease TTL {c.lease_ttl} s")
        ui.note(f"node links: {links_line(tls)}")
        data = entries * value_size
        ui.step(f"loading {entries:,} entries of {value_size:,} bytes: {mb(data)}, {partitions} "
                f"partitions of about {mb(data / partitions)} (JSON values, index by_city)")
        t_load = time.monotonic()
        with ui.counter("entries loaded", entries) as report:
            c.load(entries, value_size=value_size, progress=lambda done, total: report(done),
                   chunk=LOAD_CHUNK)
        t_loaded = time.monotonic()
        for i in range(entries):
            model[key_of(i)] = value_hash(value_of(i, value_size))
        raw = measure_raw(ui, root, raw_mb)

        writer = Writer(c, entries, model)
        writer.start()
        time.sleep(0.5)
        ui.step(f"node n{nodes + 1} joins; rebalancing file-based under live writes")
        t_join = time.time()
        writes_before = writer.writes
        c.add_node(wait=False)
        pacing = Pacing(f"n{nodes + 1}")

        def seen(doc: dict[str, Any]) -> None:
            pacing.see(doc)
            view.update(*_rows(doc, ui.arrow))
        with ui.moves("partitions settled") as view:
            c.wait_all_owning(timeout=300, progress=seen)
        t_owning = time.time()
        writes_during = writer.writes - writes_before
        time.sleep(0.5)                     # writes after OWNING go to the new owners
        if spark is None:
            live = dict(SKIPPED)
        else:
            live = validate_live(ui, spark, c, writer, master)
        writer.stop_evt.set()
        writer.join()
        moves = sorted((m for m in c.moves_done() if m["finished"] >= t_join), key=lambda m: m["finished"])
        status = c.status()
        control_plane, lease_ttl = ",".join(c.control_plane), c.lease_ttl
    # every node stopped gracefully (checkpoint, exit): its files are what it holds
    ui.step("checking the invariants on every node's files")
    owners = {(p["partition"]): list(p["owners"]) for p in status["partitions"]}
    invariants = check_files(root, owners, model, partitions)
    invariants["writer_had_no_error"] = writer.error is None
    invariants["b_plus_1_owning_copies"] = all(len(o) == 2 for o in owners.values())
    invariants["every_owner_in_sync"] = all(sorted(p.get("in_sync", [])) == sorted(p["owners"])
                                            for p in status["partitions"])
    rows = [_move_row(m) for m in moves]
    summary: dict[str, Any] = {
        "flow": f"{nodes}-node cluster on loopback; node n{nodes + 1} joins; file-based moves",
        "control_plane": {"etcd": control_plane, "controller": status.get("controller"),
                          "lease_ttl_s": lease_ttl},
        "node_links": "mutual TLS" if tls else "shared secret",
        "partitions_moved": len(moves),
        **rebalance_rates(moves, rows),
        "seconds_join_to_settled": round(t_owning - t_join, 2),
        "raw": raw,
        "pacing": pacing.summary(),
        "seconds_to_owning": {f"{m['cache']}/{m['partition']}": round(m["seconds_to_owning"], 3)
                              for m in moves},
        "stage_seconds": {f"{m['cache']}/{m['partition']}": m.get("stage_seconds", {}) for m in moves},
        "writes_during_move": writes_during,
        "writes_total": writer.writes,
        "load_seconds": round(t_loaded - t0, 1),       # from the start, with etcd and the nodes
        "entries": entries,
        "value_size": value_size,
        "data_bytes": data,
        "load_put_seconds": round(t_loaded - t_load, 1),
        "load_entries_per_s": round(entries / max(t_loaded - t_load, 1e-6)),
        "load_mb_per_s": round(data / max(t_loaded - t_load, 1e-6) / 1e6, 1),
        "updates_buffered_in_temp_wal": sum(int(m.get("buffered") or 0) for m in moves),
        "updates_replayed": sum(int(m.get("replayed") or 0) for m in moves),
        "stages": stage_order(moves),
        "moves": rows,
        "invariants": invariants,
        "invariants_ok": all(invariants.values()),
        "live_validation": live,
    }
    if writer.error is not None:
        summary["writer_error"] = repr(writer.error)
    if spark is not None:
        ui.step(f"running the Spark validation job ({master}) against the model of acknowledged writes")
        expected = os.path.join(root, "expected.jsonl")
        with open(expected, "w") as f:
            for k, h in model.items():
                f.write(json.dumps({"key": k.decode(), "partition": partition_of(k, partitions),
                                    "value_hash": h}) + "\n")
        dirs = sorted(os.path.join(root, d) for d in os.listdir(root)
                      if os.path.isfile(os.path.join(root, d, "node.id")))
        res = spark.validate("Spark validation", dirs, reading="reading the partition files",
                             expected=expected)
        summary["validation"] = {"passed": res["passed"], "partitions_checked": res["partitions_checked"],
                                 "entries": res["entries"], "divergent": res["divergent"],
                                 "corrupt_pages": res["corrupt_pages"], "expected": res.get("expected"),
                                 "seconds": res["seconds"],
                                 "spark_start_seconds": res["spark_start_seconds"]}
    else:
        summary["validation"] = dict(SKIPPED)
    summary["seconds"] = round(time.monotonic() - t0, 1)
    return summary


class Pacing:
    """What foreground protection (node/admission.py, on by default) let the joining
    node do while its moves ran, from the ``admission`` entries of the status polls:
    moves and transfers at once, the receive rate limit."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.samples: list[dict[str, Any]] = []

    def see(self, doc: dict[str, Any]) -> None:
        if not any(m.get("to") == self.node for m in doc.get("moves", [])):
            return
        self.samples += [a for a in doc.get("admission", []) if a.get("node") == self.node]

    def summary(self) -> dict[str, Any] | None:
        """None when no poll saw a move of the node running."""
        a = self.samples
        if not a:
            return None
        limits = [int(x["transfer_rate_limit"]) for x in a if x.get("transfer_rate_limit")]
        return {"node": self.node, "polls": len(a),
                "protect": any(bool(x.get("protect")) for x in a),
                "move_limit": [min(int(x["move_limit"]) for x in a), max(int(x["move_limit"]) for x in a)],
                "max_moves": max(int(x["max_moves"]) for x in a),
                "transfers": [min(int(x["transfers"]) for x in a), max(int(x["transfers"]) for x in a)],
                "receive_limit_mb_per_s": ([round(min(limits) / 1e6, 1), round(max(limits) / 1e6, 1)]
                                           if limits else None),
                "polls_unlimited": len(a) - len(limits)}


SKIPPED: dict[str, Any] = {"passed": None, "skipped": "--no-validate"}


def validate_live(ui: DemoUI, spark: DemoSpark, c: LocalCluster, writer: Writer,
                  master: str) -> dict[str, Any]:
    """Live validation of the running cluster while ``writer`` writes: the
    ``live_validation`` object of the summary. With ``tls`` every connection of the
    validation (the map, the fences, the file fetches) is mutual TLS with the cluster's
    validator certificate (``ferry://validator/spark``), else the cluster secret. A
    cluster the validator cannot reach (or that refuses its secret or certificate) is a
    failed check, not a crash of the demo."""
    from validation import ValidationError
    from validation.live import LiveSettings

    auth = validator_line(c)
    ui.step(f"validating the running cluster with Spark ({master}) through the transfer "
            f"agents while the writer writes ({auth})")
    before = writer.writes
    files = c.validator_tls
    settings = (LiveSettings(seeds=c.seeds, tls=files) if files is not None
                else LiveSettings(seeds=c.seeds, secret_file=c.secret_file))
    try:
        v = spark.validate("live validation", [], live=settings,
                           reading="each partition: fence, a snapshot of every copy at one "
                                   "counter, unfence, fetch")
    except ValidationError as e:
        return {"passed": False, "error": str(e), "writes_during": writer.writes - before,
                "auth": auth}
    return dict(live_summary(v, writer.writes - before), auth=auth)


def live_summary(v: dict[str, Any], writes_during: int) -> dict[str, Any]:
    """The demo's view of a live ``validation.validate`` result: the counter each
    partition was compared at (``"cache/p": counter``) beside the verdict."""
    live = v.get("live") or {}
    parts = sorted(live.get("partitions", []), key=lambda p: (p["cache"], int(p["partition"])))
    return {"passed": v["passed"], "partitions_checked": v["partitions_checked"],
            "entries": v["entries"], "divergent": v["divergent"],
            "corrupt_pages": v["corrupt_pages"], "epoch": live.get("epoch"),
            "counters": {f"{p['cache']}/{p['partition']}": p["counter"] for p in parts},
            "unchecked": live.get("unchecked", []),
            "counter_mismatch": live.get("counter_mismatch", []),
            "writes_during": writes_during, "seconds": v["seconds"],
            "spark_start_seconds": v["spark_start_seconds"]}


# the demander's stages of a files move, in order (node/filemove.py)
STAGES = FILE_STAGES


def measure_raw(ui: DemoUI, root: str, raw_mb: int) -> dict[str, Any] | None:
    """:func:`raw_sendfile_rate` of ``raw_mb`` MB in ``root``, as a step of the demo
    (None when ``raw_mb`` is 0)."""
    if raw_mb <= 0:
        return None
    ui.step(f"measuring this machine's raw rate: sendfile of {raw_mb} MB over loopback into a file")
    raw = raw_sendfile_rate(root, raw_mb * 1_000_000)
    ui.note(f"raw sendfile: {mb(raw['bytes'])} in {raw['seconds']:.2f} s ({raw['mb_per_s']:,.1f} MB/s)")
    return raw


RAW_METHOD = "raw sendfile over loopback into a file (no fsync)"


def raw_sendfile_rate(folder: str, size: int) -> dict[str, Any]:
    """The floor a file move is compared with: a file of ``size`` bytes (just written,
    in the page cache like a freshly checkpointed partition) sent with ``sendfile`` to a
    socket on loopback, received into another file (recv + write, no fsync, like a
    move's transfer stage: its fsync is in install). No protocol, no hashing, no
    snapshot; both files are deleted. ``seconds`` = first byte sent to last byte
    written."""
    src, dst = os.path.join(folder, "raw-sendfile.src"), os.path.join(folder, "raw-sendfile.dst")
    block = os.urandom(1 << 20)
    try:
        with open(src, "wb") as f:
            left = size
            while left > 0:
                left -= f.write(block[:min(left, len(block))])
        with socket.create_server(("127.0.0.1", 0)) as srv:
            port = srv.getsockname()[1]
            failed: list[BaseException] = []

            def send() -> None:
                try:
                    with socket.create_connection(("127.0.0.1", port)) as s, open(src, "rb") as f:
                        off = 0
                        while off < size:
                            off += os.sendfile(s.fileno(), f.fileno(), off, size - off)
                except BaseException as e:  # noqa: BLE001 - reported below
                    failed.append(e)

            sender = threading.Thread(target=send, name="demo-raw-sendfile", daemon=True)
            t0 = time.perf_counter()
            sender.start()
            conn, _ = srv.accept()
            got = 0
            buf = bytearray(1 << 20)
            view = memoryview(buf)
            with conn, open(dst, "wb", buffering=0) as out:
                while True:
                    n = conn.recv_into(view)
                    if not n:
                        break
                    chunk = view[:n]
                    while chunk:
                        chunk = chunk[out.write(chunk):]
                    got += n
            seconds = time.perf_counter() - t0
            sender.join()
        if failed:
            raise RuntimeError(f"raw sendfile of {size} bytes failed: {failed[0]!r}")
        if got != size:
            raise RuntimeError(f"raw sendfile of {size} bytes: {got} received")
    finally:
        for path in (src, dst):
            if os.path.exists(path):
                os.unlink(path)
    return {"method": RAW_METHOD, "bytes": size, "seconds": round(seconds, 4),
            "mb_per_s": round(size / seconds / 1e6, 1)}


def stage_order(moves: list[dict[str, Any]]) -> list[str]:
    """The stages these moves went through, in the order a move takes them (a stage
    of another mode, e.g. messages' fetch and catchup, after them)."""
    seen = [st for m in moves for st in m.get("stage_seconds", {})]
    return [st for st in STAGES if st in seen] + list(dict.fromkeys(st for st in seen if st not in STAGES))


def _bytes(m: dict[str, Any]) -> int:
    return int(m.get("wire_bytes") or m.get("bytes") or 0)


def _move_row(m: dict[str, Any]) -> dict[str, Any]:
    return move_row(f"{m['cache']}/{m['partition']}", m["from"], m["to"], _bytes(m),
                    m.get("stage_seconds", {}), round(m["seconds_to_owning"], 3),
                    m.get("buffered"), m.get("replayed"))


def _rows(doc: dict[str, Any], arrow: str = "->") -> tuple[list[MoveRow], tuple[int, int]]:
    """The running moves of a status document, and (partitions settled, partitions):
    settled = exactly its ideal owners hold it, all OWNING."""
    parts = doc.get("partitions", [])
    primary = {(p.get("cache", CACHE), p["partition"]): p.get("primary") for p in parts}
    rows = [MoveRow(key=f"{m['cache']}/{m['partition']} {arrow} {m['to']}", stage=m["stage"],
                    label=(f"{m['cache']}/{m['partition']} "
                           f"{source_label(m.get('from'), primary.get((m['cache'], m['partition'])))}"
                           f" {arrow} {m['to']}"),
                    bytes=int(m.get("bytes") or 0), bytes_total=int(m.get("bytes_total") or 0),
                    rate_bps=m.get("rate_bps"), eta_s=m.get("eta_s"))
            for m in doc.get("moves", [])]
    settled = sum(1 for p in parts if set(p["states"].values()) == {"OWNING"}
                  and sorted(p["states"]) == sorted(p["owners"]))
    return rows, (settled, len(parts))


def source_label(source: str | None, primary: str | None) -> str:
    """Where a running move's file comes from. The demander picks its supplier when
    its transfer begins (any OWNING, in-sync copy, not only the primary); before, the
    move is locating one and the partition's primary is what is known."""
    if source:
        return source
    return f"locating (primary {primary})" if primary else "locating"


def check_files(root: str, owners: dict[int, list[str]], model: Model,
                partitions: int) -> dict[str, bool]:
    """Invariants on the partition files the stopped nodes left behind (values
    compared by :func:`value_hash`)."""
    by_part: dict[int, Model] = {p: {} for p in range(partitions)}
    for k, v in model.items():
        by_part[partition_of(k, partitions)][k] = v
    acked_ok = agree = index_ok = True
    for p, nodes in owners.items():
        copies = []
        for n in nodes:
            path = os.path.join(root, n, "caches", CACHE, f"part-{p}.bin")
            live = {e.key: (None if e.value is None else value_hash(e.value), e.counter)
                    for e in pagefile.iter_entries(path, include_tombstones=False)}
            copies.append(live)
            for k, h in by_part[p].items():
                got = live.get(k)
                if (h is None and got is not None) or (h is not None and (got is None or got[0] != h)):
                    acked_ok = False
            idx = IndexStore.open(os.path.join(root, n, "indexes", CACHE), [INDEX])
            try:
                index_ok &= idx.ready(p) and idx.verify(p, PartitionFileSource(path)).ok
            finally:
                idx.close()
        agree &= all(c == copies[0] for c in copies[1:])
    leftovers = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
                 if f.endswith((".delta", ".ferry-tmp", ".tmp"))]
    tmpwal = [d for d, _, fs in os.walk(root) if os.sep + "tmpwal" in d and fs]
    return {
        "acknowledged_writes_on_every_owner": acked_ok,
        "owners_hold_identical_entries": agree,
        "indexes_agree_with_data": index_ok,
        "no_temp_wal_delta_or_temp_file_left": not leftovers and not tmpwal,
    }
