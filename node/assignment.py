"""Key -> partition and partition -> owners.

* ``partition_of(key, P)``: xxh64 of the key bytes modulo P. Stable across processes,
  platforms and Python versions (unlike ``hash()``), which the Spark validator and the
  client rely on.
* ``owners(cache, p, nodes, backups)``: rendezvous (highest-random-weight) hashing.
  Each node scores ``mix64(xxh64("<cache>/<p>") ^ xxh64(<node>))`` (``mix64``: the
  SplitMix64 finaliser, a bijection that spreads every input bit over the output); the
  B+1 highest scores own the partition, the highest is the ideal primary. A join takes
  over only the partitions where the new node scores in the top B+1, about (B+1)/N of
  them, and a leave moves only the partitions the leaving node held: no other
  partition changes owners. The score splits into a per-partition and a per-node hash,
  so :mod:`node.placement` scores one node against every partition at once (numpy)
  with the same result as this module's per-partition functions.
"""
from __future__ import annotations

from typing import Iterable

import xxhash

M64 = (1 << 64) - 1
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB


def partition_of(key: bytes, partitions: int) -> int:
    return xxhash.xxh64_intdigest(key) % partitions


def mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * MIX1) & M64
    z = ((z ^ (z >> 27)) * MIX2) & M64
    return z ^ (z >> 31)


def partition_hash(cache: str, partition: int) -> int:
    return xxhash.xxh64_intdigest(f"{cache}/{partition}".encode())


def node_hash(node: str) -> int:
    return xxhash.xxh64_intdigest(node.encode())


def score(cache: str, partition: int, node: str) -> int:
    return mix64(partition_hash(cache, partition) ^ node_hash(node))


def ranked(cache: str, partition: int, nodes: Iterable[str]) -> list[str]:
    """All ``nodes`` in rendezvous order for the partition (ties broken by id)."""
    ph = partition_hash(cache, partition)
    return sorted(nodes, key=lambda n: (-mix64(ph ^ node_hash(n)), n))


def owners(cache: str, partition: int, nodes: Iterable[str], backups: int) -> list[str]:
    """The ideal owners, primary first: the top ``backups + 1`` of :func:`ranked`."""
    return ranked(cache, partition, nodes)[: backups + 1]


def assignment(cache: str, partitions: int, nodes: Iterable[str], backups: int) -> list[list[str]]:
    nodes = list(nodes)
    return [owners(cache, p, nodes, backups) for p in range(partitions)]
