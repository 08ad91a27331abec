"""Where the index entries of every partition live: two LMDB databases keyed by partition.

::

    entries  (MDB_DUPSORT)  key   u32 BE partition
                            values  the partition's entry keys, sorted (entries whose
                                    LMDB data is empty: nearly all)
    long     (plain)        key   u32 BE partition | entry key
                            value the entry's data (msgpack [value, primary key]: a
                                  long value or primary key hashed in the key)

An entry key is ``u16 BE index id | encoded value | primary key`` (indexes/keycodec.py)
and lives in exactly one of the two: in ``long`` when it has data, else as a value of
its partition's key in ``entries``.

Why a duplicate-sorted database: LMDB keeps the values of one key in a B-tree of their
own (a sub-database), so each partition has a tree of its own without being a named
database (those are limited by ``max_dbs``, and LMDB allocates arrays of that size per
transaction: no good for 100,000 partitions). And it keeps what one database per
partition gave:

* ``clear`` deletes a partition's key with all its values (``mdb_cursor_del`` with
  MDB_NODUPDATA frees the sub-tree's pages without reading them): no per-entry work,
  whatever the partition's size;
* a rebuild appends a partition's sorted entry keys to its own sub-tree
  (MDB_APPENDDUP: compared with the partition's last value only, pages filled left to
  right), whatever the partitions around it hold;
* ``count`` is ``mdb_cursor_count``.

Entries with data cannot be values: a value is at most LMDB's key size (511 bytes)
and the data is unbounded, so they sit in ``long`` under the partition's key prefix;
an index makes them only for values or primary keys too long for a key. Entry keys
are at most :data:`MAX_ENTRY_KEY` bytes less the prefix, so a ``long`` key fits.
"""
from __future__ import annotations

import heapq
import struct
from itertools import repeat
from typing import Iterable, Iterator

import lmdb

from .errors import IndexStoreError

ENTRIES = b"entries"
LONG = b"long"
# The partition key: fixed width, big-endian, so ``long`` keys of one partition form
# one key range and partitions sort by number.
PARTITION = struct.Struct(">I")
PREFIX_LEN = PARTITION.size
# The last u32 is kept out, so every partition's ``long`` range has an end key.
MAX_PARTITION = (1 << 32) - 2

Item = tuple[bytes, bytes]          # (entry key, data)


def partition_key(p: int) -> bytes:
    if not 0 <= p <= MAX_PARTITION:
        raise IndexStoreError(f"partition {p} is outside 0..{MAX_PARTITION}, the partitions "
                              "an index store holds")
    return PARTITION.pack(p)


def max_entry_key(lmdb_max_key: int) -> int:
    """The longest entry key the indexer may make: a ``long`` key holds it after the
    partition prefix."""
    return lmdb_max_key - PREFIX_LEN


class EntryDbs:
    """The two databases' handles, and every read and write of entries (each within a
    transaction the caller holds)."""

    def __init__(self, env: lmdb.Environment, txn: lmdb.Transaction[bytes] | None = None) -> None:
        self.plain = env.open_db(ENTRIES, txn=txn, dupsort=True)
        self.long = env.open_db(LONG, txn=txn)

    # -- writes ---------------------------------------------------------------------------
    def load(self, txn: lmdb.Transaction[bytes], p: int, keys: list[bytes],
             extra: dict[bytes, bytes]) -> tuple[int, int]:
        """Add sorted ``keys`` (their data in ``extra``, empty when absent) after every
        entry the partition holds; returns (consumed, added). A key equal to one
        already there (a value the source gave twice) is not added."""
        pk = partition_key(p)
        cur = txn.cursor(db=self.plain)
        if not extra:
            # no per-entry object is built: zip hands out one reused tuple
            return cur.putmulti(zip(repeat(pk), keys), dupdata=False, append=True)
        c1, a1 = cur.putmulti(((pk, k) for k in keys if k not in extra), dupdata=False,
                              append=True)
        c2, a2 = txn.cursor(db=self.long).putmulti(
            ((pk + k, extra[k]) for k in keys if k in extra), overwrite=False)
        return c1 + c2, a1 + a2

    def put(self, txn: lmdb.Transaction[bytes], p: int, key: bytes, data: bytes) -> None:
        if data:
            txn.put(partition_key(p) + key, data, db=self.long)
        else:
            txn.put(partition_key(p), key, db=self.plain, dupdata=False)

    def delete(self, txn: lmdb.Transaction[bytes], p: int, key: bytes, data: bytes) -> None:
        """Delete an entry (``data``: the entry's data as the indexer makes it, which
        says where it is); an absent one is no error."""
        if data:
            txn.delete(partition_key(p) + key, db=self.long)
        else:
            txn.delete(partition_key(p), key, db=self.plain)

    def clear(self, txn: lmdb.Transaction[bytes], p: int) -> None:
        """Delete every entry of the partition."""
        pk = partition_key(p)
        cur = txn.cursor(db=self.plain)
        if cur.set_key(pk):
            cur.delete(dupdata=True)         # the whole sub-tree, page by page
        cur = txn.cursor(db=self.long)
        hi = PARTITION.pack(p + 1)
        if cur.set_range(pk):
            key, delete = cur.key, cur.delete
            while True:
                k = key()
                if not k or k >= hi:         # b"": past the last key
                    break
                delete()                     # and on to the next key

    # -- reads ----------------------------------------------------------------------------
    def count(self, txn: lmdb.Transaction[bytes], p: int) -> int:
        pk = partition_key(p)
        cur = txn.cursor(db=self.plain)
        n = cur.count() if cur.set_key(pk) else 0
        return n + sum(1 for _ in self._long(txn, pk, b"", None, None))

    def any_long(self, txn: lmdb.Transaction[bytes]) -> bool:
        """Whether any partition has an entry with data (a query skips ``long``
        when none has: the usual case)."""
        return bool(txn.stat(self.long)["entries"])

    def with_prefix(self, txn: lmdb.Transaction[bytes], partitions: Iterable[int],
                    prefix: bytes) -> Iterator[Item]:
        """Every (entry key, data) starting with ``prefix`` (non-empty) in the
        partitions, in key order per partition (not across them): a lookup's and a
        unique check's read, one seek per partition."""
        cur = txn.cursor(db=self.plain)
        any_long = self.any_long(txn)
        for p in partitions:
            pk = partition_key(p)
            if cur.set_range_dup(pk, prefix):
                for k in cur.iternext_dup():
                    if not k.startswith(prefix):
                        break
                    yield k, b""
            if any_long:
                yield from self._long(txn, pk, prefix, None, prefix)

    def items(self, txn: lmdb.Transaction[bytes], p: int, start: bytes = b"", *,
              hi: bytes | None = None, prefix: bytes | None = None,
              after: bool = False, long: bool = True) -> Iterator[Item]:
        """The partition's (entry key, data) in key order, from ``start`` on (past it
        when ``after``), below ``hi`` and starting with ``prefix`` when given.
        ``long=False``: the caller knows no entry has data (:meth:`any_long`)."""
        pk = partition_key(p)
        plain = self._plain(txn, pk, start, hi, prefix)
        if not long:
            return plain if not after else (it for it in plain if it[0] != start)
        long_items = self._long(txn, pk, start, hi, prefix)
        first = next(long_items, None)
        if first is None:                    # the usual case: no entry with data
            merged: Iterable[Item] = plain
        else:
            merged = heapq.merge(plain, _chain(first, long_items))
        if not after:
            return iter(merged)
        return (it for it in merged if it[0] != start)

    def _plain(self, txn: lmdb.Transaction[bytes], pk: bytes, start: bytes, hi: bytes | None,
               prefix: bytes | None) -> Iterator[Item]:
        cur = txn.cursor(db=self.plain)
        # (LMDB refuses an empty value to seek to: the first one is set_key's)
        if not (cur.set_range_dup(pk, start) if start else cur.set_key(pk)):
            return
        for k in cur.iternext_dup():
            if (hi is not None and k >= hi) or (prefix is not None and not k.startswith(prefix)):
                return
            yield k, b""

    def _long(self, txn: lmdb.Transaction[bytes], pk: bytes, start: bytes, hi: bytes | None,
              prefix: bytes | None) -> Iterator[Item]:
        cur = txn.cursor(db=self.long)
        if not cur.set_range(pk + start):
            return
        n = PREFIX_LEN
        for k, d in cur:
            if k[:n] != pk:
                return
            e = k[n:]
            if (hi is not None and e >= hi) or (prefix is not None and not e.startswith(prefix)):
                return
            yield e, d


def _chain(first: Item, rest: Iterator[Item]) -> Iterator[Item]:
    yield first
    yield from rest
