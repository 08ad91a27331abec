"""The ``meta`` database: store settings, index ids, and per-partition ready markers.

Keys and values (values are UTF-8 JSON)::

    b"format"          2: the layout format of the environment (indexes/lmdbenv.py)
    b"codec"           "json" | "msgpack"
    b"indexes"         {"next_id": N, "defs": [{"id": i, "name": ..., "field": [...],
                        "unique": b, "on_bad": s, "type": t}, ...]}
    b"ready/<p>"       {"fingerprint": hex, "entries": n, "bad": n, "at": unix time}

An index keeps its id while its definition is unchanged; a changed definition gets a
new id, so entries written under the old one can never be mistaken for the new one.
The fingerprint hashes the layout format, the codec and the (id, definition) list: a
ready marker holds only for the definitions (and the layout) it was built with, so
changing them makes every partition not ready until rebuilt. (With the format in it, a
Ferry that predates the format's check, opened on a store of a later layout, finds no
partition ready instead of serving from databases that are not there.)
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import lmdb
import xxhash

from .definitions import IndexDefinition
from .errors import IndexDefinitionError

# 1: one LMDB database per partition; 2: every partition in one duplicate-sorted
# database keyed by partition (indexes/entrydb.py).
FORMAT = 2
K_FORMAT = b"format"
K_CODEC = b"codec"
K_INDEXES = b"indexes"
READY_PREFIX = b"ready/"


def ready_key(p: int) -> bytes:
    return READY_PREFIX + str(p).encode()


@dataclass(frozen=True)
class Schema:
    codec: str
    definitions: tuple[IndexDefinition, ...]
    ids: dict[str, int]
    next_id: int

    @property
    def fingerprint(self) -> str:
        body = json.dumps([FORMAT, self.codec,
                           [[self.ids[d.name], d.to_json()] for d in self.definitions]],
                          sort_keys=True).encode()
        return xxhash.xxh3_64_hexdigest(body)


def _get_json(txn: lmdb.Transaction[bytes], db: lmdb._Database, key: bytes) -> Any:
    raw = txn.get(key, db=db)
    return None if raw is None else json.loads(raw)


def layout_format(txn: lmdb.Transaction[bytes], db: lmdb._Database) -> int | None:
    """The stored layout format; None when there is none. A store written before the
    format was checked holds 1 (it always wrote its format with its definitions)."""
    fmt = _get_json(txn, db, K_FORMAT)
    if fmt is None and txn.get(K_INDEXES, db=db) is not None:
        return 1
    return fmt if isinstance(fmt, int) else 0


def is_empty(txn: lmdb.Transaction[bytes], db: lmdb._Database) -> bool:
    return not txn.cursor(db=db).first()


def put_format(txn: lmdb.Transaction[bytes], db: lmdb._Database) -> None:
    txn.put(K_FORMAT, json.dumps(FORMAT).encode(), db=db)


def settings(txn: lmdb.Transaction[bytes], db: lmdb._Database) -> dict[bytes, bytes]:
    """What outlives a change of layout: the codec and the definitions with their ids
    (not the ready markers: the entries they vouch for are gone)."""
    return {k: v for k in (K_CODEC, K_INDEXES) if (v := txn.get(k, db=db)) is not None}


def put_settings(txn: lmdb.Transaction[bytes], db: lmdb._Database, kept: dict[bytes, bytes]) -> None:
    for k, v in kept.items():
        txn.put(k, v, db=db)


def load_schema(txn: lmdb.Transaction[bytes], db: lmdb._Database) -> Schema | None:
    stored = _get_json(txn, db, K_INDEXES)
    if stored is None:
        return None
    defs = tuple(IndexDefinition.from_json(d) for d in stored["defs"])
    ids = {d["name"]: int(d["id"]) for d in stored["defs"]}
    codec = _get_json(txn, db, K_CODEC) or "json"
    return Schema(codec, defs, ids, int(stored["next_id"]))


def reconcile(stored: Schema | None, definitions: list[IndexDefinition] | None,
              codec: str | None) -> Schema:
    """The schema to use: stored definitions when none are given, else the given ones
    with stored ids kept for unchanged definitions and new ids for the rest."""
    if definitions is None:
        if stored is None:
            return Schema(codec or "json", (), {}, 1)
        return stored if codec in (None, stored.codec) else Schema(
            codec, stored.definitions, stored.ids, stored.next_id)
    old = {d.name: d for d in stored.definitions} if stored else {}
    next_id = stored.next_id if stored else 1
    ids: dict[str, int] = {}
    for d in definitions:
        if d.name in ids:
            raise IndexDefinitionError(f"index {d.name!r} is defined twice")
        if stored and old.get(d.name) == d:
            ids[d.name] = stored.ids[d.name]
        else:
            ids[d.name] = next_id
            next_id += 1
    if next_id > 0xFFFF:
        raise IndexDefinitionError("more than 65535 index definitions over the store's "
                                   "life; create a new index directory")
    return Schema(codec or (stored.codec if stored else "json"), tuple(definitions), ids, next_id)


def save_schema(txn: lmdb.Transaction[bytes], db: lmdb._Database, schema: Schema) -> None:
    put_format(txn, db)
    txn.put(K_CODEC, json.dumps(schema.codec).encode(), db=db)
    body = {"next_id": schema.next_id,
            "defs": [dict(d.to_json(), id=schema.ids[d.name]) for d in schema.definitions]}
    txn.put(K_INDEXES, json.dumps(body).encode(), db=db)


def put_ready(txn: lmdb.Transaction[bytes], db: lmdb._Database, p: int, fingerprint: str,
              entries: int, bad: int) -> dict[str, Any]:
    """Write partition p's ready marker; returns it as stored."""
    body = {"fingerprint": fingerprint, "entries": entries, "bad": bad, "at": time.time()}
    txn.put(ready_key(p), json.dumps(body).encode(), db=db)
    return body


def ready_markers(txn: lmdb.Transaction[bytes], db: lmdb._Database) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    cur = txn.cursor(db=db)
    if cur.set_range(READY_PREFIX):
        for k, v in cur:
            if not k.startswith(READY_PREFIX):
                break
            out[int(k[len(READY_PREFIX):])] = json.loads(v)
    return out
