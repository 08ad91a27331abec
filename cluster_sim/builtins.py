"""The built-in scenarios. Small on purpose: a matrix runs each many times on 2 cores.

Roles: ``supplier`` is a node that gives partitions away, ``demander`` one that takes
them, ``third`` a node that does neither in the event that matters (it still holds
copies, serves writes and checkpoints).
"""
from __future__ import annotations

import json
import os
import tomllib

from .errors import ScenarioError
from .scenario import (CONTROLLER, LEADER, LEASE_TTL_S, CacheSpec, DiskSpec, Event, Scenario,
                       WorkloadSpec, from_dict, validate)

TTL = float(LEASE_TTL_S)    # the nodes' lease: the faults below last whole TTLs

# The partition and control-plane scenarios (no crash plan needed: the faults are the
# events); the matrix runs each once per seed (matrix.FAULTS)
# Three writers at 20 ops/s each for 15 s: a write stalled on a failed primary (up to
# WRITE_TIMEOUT_S) stalls one writer, not the workload, so the cut-off side keeps
# being tried while the fault lasts
PARTITIONED = WorkloadSpec(writers=3, ops=300, rate=20.0, keys=100)
# The same pace with half the operations reads of any writer's keys, on fewer keys, and
# three processes that only read; every process through one node's view, as a client
# that knows one node (writer i and reader i: node i). Each key's history has several
# processes, and while the writer of a deposed node waits out its writes, the others go
# on writing through the new primaries and its reader goes on reading through it
READS = WorkloadSpec(writers=3, ops=300, rate=20.0, keys=30, read_ratio=0.5, readers=3, pinned=True)
FAULT_SCENARIOS = ("net-cut", "long-cut", "controller-cut", "flapping", "etcd-member-loss",
                   "control-plane-outage", "controller-kill", "etcd-cut-reads", "sigstop-reads")

BUILTINS: dict[str, Scenario] = {
    "join": Scenario(
        name="join", description="two nodes under writes; a third joins and pulls its share",
        nodes=("n1", "n2"), workload=WorkloadSpec(ops=240),
        events=(Event(60, "join", "n3"),), settle_timeout=60.0,
        # n2 gives partitions away too; n1 (the first node, usually the controller) is the third node
        roles={"supplier": "n2", "demander": "n3", "third": "n1"}),
    "leave": Scenario(
        name="leave", description="three nodes under writes; n3 leaves gracefully",
        nodes=("n1", "n2", "n3"), workload=WorkloadSpec(ops=240),
        events=(Event(60, "leave", "n3"),),
        roles={"supplier": "n3", "demander": "n1", "third": "n2"}, settle_timeout=60.0),
    "kill-restart": Scenario(
        name="kill-restart", description="three nodes; n2 is SIGKILLed under writes and comes back",
        nodes=("n1", "n2", "n3"), workload=WorkloadSpec(ops=240),
        # the restart comes by op 120 or 4 s after the kill: a crash plan on another node
        # may leave partitions LOST until n2 is back, and writes to them wait 20 s each
        events=(Event(60, "kill", "n2"), Event(120, "restart", "n2", max_wait=4.0)),
        roles={"supplier": "n1", "demander": "n2", "third": "n3"}, settle_timeout=60.0),
    "restart-catchup": Scenario(
        name="restart-catchup",
        description="three nodes with 2,400 preloaded entries (files of ~100 pages); n2 is "
                    "SIGKILLed under writes and comes back: its stale copies catch up by "
                    "a delta of the pages that changed",
        nodes=("n1", "n2", "n3"), caches=(CacheSpec(partitions=4),),
        workload=WorkloadSpec(ops=200, rate=40.0, keys=400, preload=2400, value_size=(500, 900)),
        events=(Event(40, "kill", "n2"), Event(100, "restart", "n2", max_wait=4.0)),
        roles={"supplier": "n1", "demander": "n2", "third": "n3"}, settle_timeout=60.0),
    # -- the move's points that a plain join does not reach
    "slow-join": Scenario(
        name="slow-join",
        description="n1 alone holds 2,400 preloaded entries (files of ~100 pages) under writes; "
                    "n2 joins and takes a copy of every partition from n1 at 256 KiB/s while "
                    "the checkpointer overwrites pages mid-send: the pre-images travel",
        nodes=("n1",), caches=(CacheSpec(partitions=4),), transfer_rate=256 << 10,
        workload=WorkloadSpec(ops=240, rate=40.0, keys=400, preload=2400, value_size=(500, 900)),
        events=(Event(20, "join", "n2"),),
        # n1 is the only copy of every partition, so it supplies every move
        roles={"supplier": "n1", "demander": "n2"}, settle_timeout=60.0),
    "join-stream-index": Scenario(
        name="join-stream-index",
        description="join with the streaming install on ([rebalance] stream_index): n3 builds "
                    "each partition's index keys while its file arrives",
        nodes=("n1", "n2"), workload=WorkloadSpec(ops=240), stream_index=True,
        events=(Event(60, "join", "n3"),), settle_timeout=60.0,
        roles={"supplier": "n2", "demander": "n3", "third": "n1"}),
    "join-ship-index": Scenario(
        name="join-ship-index",
        description="join with the shipped index ([rebalance] index_transfer = \"ship\"): the "
                    "suppliers export each partition's index entries with its file snapshot "
                    "and n3 loads them after checking them against the installed file",
        nodes=("n1", "n2"), workload=WorkloadSpec(ops=240), index_transfer="ship",
        events=(Event(60, "join", "n3"),), settle_timeout=60.0,
        roles={"supplier": "n2", "demander": "n3", "third": "n1"}),
    "join-tls": Scenario(
        name="join-tls",
        description="join with mutual TLS between the nodes (tls = true): certificates of the "
                    "run's CA, no secret; the harness's clients with a client certificate",
        nodes=("n1", "n2"), workload=WorkloadSpec(ops=240), tls=True,
        events=(Event(60, "join", "n3"),), settle_timeout=60.0,
        roles={"supplier": "n2", "demander": "n3", "third": "n1"}),
    "pair-catchup": Scenario(
        name="pair-catchup",
        description="two nodes with 2,400 preloaded entries (files of ~100 pages); n2 is "
                    "SIGKILLed under writes and comes back: its stale copies catch up by deltas "
                    "from n1, the only other copy",
        nodes=("n1", "n2"), caches=(CacheSpec(partitions=4),),
        workload=WorkloadSpec(ops=200, rate=40.0, keys=400, preload=2400, value_size=(500, 900)),
        events=(Event(40, "kill", "n2"), Event(100, "restart", "n2", max_wait=4.0)),
        roles={"supplier": "n1", "demander": "n2"}, settle_timeout=60.0),
    "join-under-load": Scenario(
        name="join-under-load", description="two writers, more keys; n3 then n4 join",
        nodes=("n1", "n2"), caches=(CacheSpec(partitions=16),),
        workload=WorkloadSpec(writers=2, ops=200, keys=300, distribution="zipf"),
        events=(Event(60, "join", "n3"), Event(200, "join", "n4")), settle_timeout=60.0,
        roles={"supplier": "n1", "demander": "n3", "third": "n2"}),
    "disk-full": Scenario(
        name="disk-full",
        description="n3 joins with its data dir on a 96 MiB tmpfs filled to 16 MiB free: its "
                    "fetches are refused (64 MiB margin), nothing installs; space freed, the "
                    "moves retry and converge",
        nodes=("n1", "n2"), disk=DiskSpec("n3", size_mib=96, free_mib=16),
        # paced writes: updates keep arriving while n3's moves fail and retry
        workload=WorkloadSpec(ops=300, rate=60.0),
        events=(Event(60, "join", "n3"), Event(60, "fill", "n3"), Event(200, "free", "n3")),
        roles={"supplier": "n2", "demander": "n3", "third": "n1"}, settle_timeout=90.0),
    "disk-full-mid-transfer": Scenario(
        name="disk-full-mid-transfer",
        description="n3 joins with its data dir on a 96 MiB tmpfs; transfers run at 64 KiB/s, "
                    "and once one of n3's moves is transferring the disk is filled to the last "
                    "byte: the transfer runs out of space mid-file, nothing installs; space "
                    "freed, the moves retry and converge",
        nodes=("n1", "n2"), disk=DiskSpec("n3", size_mib=96, free_mib=0, mid_transfer=True),
        transfer_rate=64 << 10,
        workload=WorkloadSpec(ops=300, rate=60.0, value_size=(8 << 10, 16 << 10)),
        events=(Event(60, "join", "n3"), Event(60, "fill", "n3"), Event(200, "free", "n3")),
        roles={"supplier": "n2", "demander": "n3", "third": "n1"}, settle_timeout=120.0),
    "net-cut": Scenario(
        name="net-cut",
        description="three nodes behind RPC proxies; n3 is cut off from its peers (not from "
                    "etcd) for 2 lease TTLs: its backups leave the in-sync sets through the "
                    "controller, then the links heal and its copies resync",
        nodes=("n1", "n2", "n3"), proxy=True,
        workload=WorkloadSpec(ops=300, rate=60.0),
        events=(Event(90, "cut", "n3"), Event(91, "heal", min_wait=2 * TTL)),
        roles={"supplier": "n3", "demander": "n1", "third": "n2"}, settle_timeout=90.0),
    # -- partitions and the control plane; every write goes through one
    # node's view, the cut-off one included, and a heal must converge within 3 TTLs
    "long-cut": Scenario(
        name="long-cut",
        description="n3, a minority of one, is isolated from its peers and from etcd for 5 "
                    "lease TTLs under writes sent through every node: its lease expires, its "
                    "primaries move; healed, it registers again and its copies resync",
        nodes=("n1", "n2", "n3"), proxy=True, workload=PARTITIONED,
        events=(Event(120, "isolate", "n3"), Event(121, "heal", min_wait=5 * TTL)),
        roles={"supplier": "n3", "demander": "n1", "third": "n2"}, settle_timeout=60.0),
    "controller-cut": Scenario(
        name="controller-cut",
        description="the controller (from cluster status) is isolated from its peers and "
                    "from etcd for 3 lease TTLs under writes: another node is elected, the "
                    "old one must not act or acknowledge; healed, it rejoins",
        nodes=("n1", "n2", "n3"), proxy=True, workload=PARTITIONED,
        events=(Event(120, "isolate", CONTROLLER), Event(121, "heal", min_wait=3 * TTL)),
        settle_timeout=60.0),
    "flapping": Scenario(
        name="flapping",
        description="n3 is isolated (peers and etcd) and healed every second for 8 s under "
                    "writes: in-sync sets shrink and grow, moves start and break",
        nodes=("n1", "n2", "n3"), proxy=True, workload=PARTITIONED,
        events=(Event(120, "flap", "n3", duration_s=8.0, period_s=1.0),),
        roles={"supplier": "n3", "demander": "n1", "third": "n2"}, settle_timeout=60.0),
    "etcd-member-loss": Scenario(
        name="etcd-member-loss",
        description="a 3-member etcd; its raft leader is SIGKILLed under writes and restarted "
                    "5 s later: the control plane keeps a quorum, nothing stops",
        nodes=("n1", "n2", "n3"), control_plane_members=3, workload=PARTITIONED,
        events=(Event(120, "kill-etcd", LEADER), Event(121, "restart-etcd", LEADER, min_wait=5.0)),
        roles={"supplier": "n3", "demander": "n1", "third": "n2"}, settle_timeout=60.0),
    "control-plane-outage": Scenario(
        name="control-plane-outage",
        description="every etcd member is SIGKILLed under writes and restarted 10 s later: "
                    "primaries stop acknowledging when their leases may end, reads go on; "
                    "afterwards writes resume with nothing acknowledged lost",
        nodes=("n1", "n2", "n3"), workload=PARTITIONED,
        events=(Event(120, "kill-etcd"), Event(121, "restart-etcd", min_wait=10.0)),
        roles={"supplier": "n3", "demander": "n1", "third": "n2"}, settle_timeout=60.0),
    "controller-kill": Scenario(
        name="controller-kill",
        description="the controller (from cluster status) is SIGKILLed under writes and "
                    "restarted by op 240 or 4 s later: its lease expires, another node takes "
                    "over, the restarted node comes back as a member",
        nodes=("n1", "n2", "n3"), workload=PARTITIONED,
        events=(Event(120, "kill", CONTROLLER), Event(240, "restart", CONTROLLER, max_wait=4.0)),
        settle_timeout=60.0),
    # -- linearizable reads: faults that depose a primary which clients still reach
    "etcd-cut-reads": Scenario(
        name="etcd-cut-reads",
        description="n1 is cut from etcd (not from its peers or the clients) for 9 s under writes "
                    "and reads through every node: its lease lapses and its primaries move; it must "
                    "serve no read (nor acknowledge a write) once a successor may exist",
        nodes=("n1", "n2", "n3"), workload=READS,
        events=(Event(120, "cut-control", "n1"), Event(121, "heal", min_wait=9.0)),
        roles={"supplier": "n1", "demander": "n2", "third": "n3"}, settle_timeout=60.0),
    "sigstop-reads": Scenario(
        name="sigstop-reads",
        description="the controller's process is frozen (SIGSTOP) for 3 lease TTLs under writes and "
                    "reads through every node: its lease ends, another node takes over; thawed, it "
                    "must not serve a read or acknowledge a write on the lease it remembers",
        nodes=("n1", "n2", "n3"), workload=READS,
        events=(Event(120, "sigstop", CONTROLLER, duration_s=3 * TTL),), settle_timeout=60.0),
}


def load(name_or_file: str) -> Scenario:
    """A built-in scenario by name, or a ``.toml`` / ``.json`` file."""
    if name_or_file in BUILTINS:
        return validate(BUILTINS[name_or_file])
    if not os.path.exists(name_or_file):
        raise ScenarioError(f"no built-in scenario {name_or_file!r} and no such file; "
                            f"built-ins: {', '.join(sorted(BUILTINS))}")
    try:
        with open(name_or_file, "rb") as f:
            raw = f.read()
        data = json.loads(raw) if name_or_file.endswith(".json") else tomllib.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as e:
        raise ScenarioError(f"{name_or_file}: cannot parse: {e}") from None
    return from_dict(data, where=name_or_file)
