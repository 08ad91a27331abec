"""Ideal owners of every partition of a cache, kept up to date as members come and go.

:func:`node.assignment.owners` ranks every node for one partition: O(nodes) per
partition, O(partitions x nodes) for a whole cache, which is 10^8 hashes at 1,000
nodes and 100,000 partitions. This table holds the top B+1 scores of each partition
(numpy arrays, one row per rank) and changes them by the membership delta only:

- a node **joins**: its score against every partition at once (one vectorised pass:
  the score is ``mix64(partition hash ^ node hash)``), inserted where it beats a
  current owner. O(partitions) numpy work, a few milliseconds at 100,000;
- a node **leaves** (or is marked leaving): only the partitions it owned, about
  (B+1)/N of them, are ranked again over the remaining nodes: O((B+1) x partitions).

:meth:`Placement.update` returns the partitions whose owners changed, so the
reconcile loop and the controller look only at those. The result equals
:func:`node.assignment.owners` for every partition (a test compares them); ties of
two 64-bit scores, which the per-partition function breaks by node id, are not
expected to occur.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .assignment import MIX1, MIX2, node_hash, partition_hash


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX2)
    return z ^ (z >> np.uint64(31))


class Placement:
    """Top ``copies`` owners of each of ``partitions`` partitions of ``cache`` over a
    set of nodes changed with :meth:`update`."""

    def __init__(self, cache: str, partitions: int, copies: int) -> None:
        self.cache, self.partitions, self.copies = cache, partitions, copies
        self._ph = np.fromiter((partition_hash(cache, p) for p in range(partitions)),
                               dtype=np.uint64, count=partitions)
        self.nodes: list[str] = []            # index -> node id (indexes never reused)
        self._index: dict[str, int] = {}
        self.members: set[str] = set()
        # rank r of partition p: score and node index (-1: no node)
        self._score = np.zeros((copies, partitions), dtype=np.uint64)
        self._node = np.full((copies, partitions), -1, dtype=np.int32)

    def _scores(self, node: str, where: np.ndarray | slice = slice(None)) -> np.ndarray:
        with np.errstate(over="ignore"):
            return _mix(self._ph[where] ^ np.uint64(node_hash(node)))

    def _idx(self, node: str) -> int:
        i = self._index.get(node)
        if i is None:
            i = self._index[node] = len(self.nodes)
            self.nodes.append(node)
        return i

    def _insert(self, node: str, where: np.ndarray | slice = slice(None)) -> None:
        """Insert ``node``'s score into the ranks of the partitions ``where``."""
        cur_s = self._scores(node, where)
        cur_n = np.full(cur_s.shape, self._idx(node), dtype=np.int32)
        for r in range(self.copies):
            row_s, row_n = self._score[r][where], self._node[r][where]
            better = (cur_s > row_s) | (row_n < 0)
            new_s, new_n = np.where(better, cur_s, row_s), np.where(better, cur_n, row_n)
            cur_s, cur_n = np.where(better, row_s, cur_s), np.where(better, row_n, cur_n)
            self._score[r][where], self._node[r][where] = new_s, new_n

    def update(self, nodes: Iterable[str]) -> np.ndarray:
        """Make the table rank exactly ``nodes``; returns the partitions (sorted array)
        whose owners changed."""
        want = set(nodes)
        gone, new = self.members - want, want - self.members
        if not gone and not new:
            return np.empty(0, dtype=np.int64)
        before = self._node.copy()
        if gone:
            gone_idx = np.array([self._index[n] for n in gone], dtype=np.int32)
            hit = np.nonzero(np.isin(self._node, gone_idx).any(axis=0))[0]
            self.members -= gone
            if hit.size:
                self._score[:, hit] = 0
                self._node[:, hit] = -1
                for n in sorted(self.members):
                    self._insert(n, hit)
        for n in sorted(new):
            self.members.add(n)
            self._insert(n)
        changed = (before != self._node).any(axis=0)
        return np.nonzero(changed)[0]

    @classmethod
    def share(cls, cache: str, partitions: int, copies: int, nodes: Iterable[str], node: str) -> list[int]:
        """The partitions of ``cache`` whose ideal owners among ``nodes`` include ``node``."""
        pl = cls(cache, partitions, copies)
        pl.update(nodes)
        return [int(p) for p in pl.owned_by(node)]

    def owners(self, p: int) -> list[str]:
        return [self.nodes[i] for i in self._node[:, p] if i >= 0]

    def owned_by(self, node: str) -> np.ndarray:
        """Partitions whose ideal owners include ``node``."""
        i = self._index.get(node)
        if i is None or node not in self.members:
            return np.empty(0, dtype=np.int64)
        return np.nonzero((self._node == i).any(axis=0))[0]


__all__ = ["Placement"]
