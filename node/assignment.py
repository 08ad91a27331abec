"""Key -> partition and partition -> owners.

* ``partition_of(key, P)``: xxh64 of the key bytes modulo P. Stable across processes,
  platforms and Python versions (unlike ``hash()``), which the Spark validator and the
  client rely on.
* ``owners(cache, p, nodes, backups)``: rendezvous (highest-random-weight) hashing.
  Each node scores ``xxh64("<cache>/<p>/<node>")``; the B+1 highest scores own the
  partition, the highest is the ideal primary. A join takes over only the partitions
  where the new node scores in the top B+1, about (B+1)/N of them, and a leave moves
  only the partitions the leaving node held: no other partition changes owners.
"""
from __future__ import annotations

from typing import Iterable

import xxhash


def partition_of(key: bytes, partitions: int) -> int:
    return xxhash.xxh64_intdigest(key) % partitions


def score(cache: str, partition: int, node: str) -> int:
    return xxhash.xxh64_intdigest(f"{cache}/{partition}/{node}".encode())


def ranked(cache: str, partition: int, nodes: Iterable[str]) -> list[str]:
    """All ``nodes`` in rendezvous order for the partition (ties broken by id)."""
    return sorted(nodes, key=lambda n: (-score(cache, partition, n), n))


def owners(cache: str, partition: int, nodes: Iterable[str], backups: int) -> list[str]:
    """The ideal owners, primary first: the top ``backups + 1`` of :func:`ranked`."""
    return ranked(cache, partition, nodes)[: backups + 1]


def assignment(cache: str, partitions: int, nodes: Iterable[str], backups: int) -> list[list[str]]:
    nodes = list(nodes)
    return [owners(cache, p, nodes, backups) for p in range(partitions)]
