"""From (primary key, stored value) to index entries: the write path (``entries``) and
the rebuild's hot path (``feed`` per value, ``feed_many`` per batch of values)."""
from __future__ import annotations

from typing import Callable, Iterable, Protocol, runtime_checkable

from . import accel, keycodec
from .definitions import (MISSING, Bad, Entry, IndexDefinition, document_decoder,
                          fast_json_loads, field_value, type_ok)
from .errors import BadDocument, BadValueError

# The per-index encoding cache holds these types (bool/None are cheap; bytes are rare),
# up to _CACHE_MAX values per index.
_CACHED = (int, float, str)
_CACHE_MAX = 1 << 16

@runtime_checkable
class Columns(Protocol):
    """Pairs in buffers (``checkpoint.decode.LiveColumns``, by shape: this package does
    not import the decoder at load): records of four int64 in ``cols`` (key offset in
    ``data``, key length, value offset, < 0: ``~offset`` in ``spill``, value length)."""
    data: bytes
    spill: bytes
    cols: bytes

    def pairs(self) -> list[tuple[bytes, bytes]]: ...


# one index's spec in Indexer._fast (described there)
_Spec = tuple[str | None, tuple[str, ...], dict[object, tuple[type, bytes, int]],
              IndexDefinition, int, str | None]


class Indexer:
    """Turns (primary key, stored value) into index entries for a set of definitions."""

    def __init__(self, definitions: list[IndexDefinition], ids: dict[str, int],
                 codec: str, max_key: int) -> None:
        self.definitions = definitions
        self.codec = codec
        self.max_key = max_key
        self._decode = document_decoder(codec)
        self._compiled = [(d, ids[d.name], d.path, d.type) for d in definitions]
        # feed's per-index specs: (top-level field name or None, path, encoding cache
        # {value: (type, prefix + encoded value, max primary key length)}, definition,
        # id, type); the cache is shared by feed and feed_many.
        self._fast: list[_Spec] = [(path[0] if len(path) == 1 else None, path, {}, d, iid, want)
                                   for d, iid, path, want in self._compiled]
        self._top_level = all(len(path) == 1 for _d, _i, path, _w in self._compiled)
        # See definitions.fast_json_loads: a document orjson parses needs no json pass.
        self._fast_loads = fast_json_loads if codec == "json" else None
        # The C path's specs (field as UTF-8, index id, type code), or None when it
        # cannot take these definitions (msgpack, nested paths, unencodable names).
        self._c_specs = self._accel_specs() if codec == "json" and self._top_level else None

    def _accel_specs(self) -> tuple | None:
        if len(self._compiled) > 64:  # the C side's limit (MAX_SPECS)
            return None
        try:
            return tuple((path[0].encode("utf-8"), keycodec.index_prefix(iid), accel.WANT[want])
                         for _d, iid, path, want in self._compiled) or None
        except UnicodeEncodeError:    # a lone surrogate in a name: Python's
            return None

    @property
    def accelerated(self) -> bool:
        """True when feed_many runs the C path (indexes/accel.py) for these definitions."""
        return self._c_specs is not None and accel.module is not None

    def entries(self, pk: bytes, raw: bytes | None) -> tuple[list[Entry], list[Bad]]:
        """Entries of one value; bad indexes listed by reason (the caller applies the
        policy). ``raw=None`` (no value) has no entries and nothing bad."""
        if raw is None or not self._compiled:
            return [], []
        mod, specs = accel.module, self._c_specs
        if mod is not None and specs is not None:
            # The C scanner's common case (see feed_many); None: this value is Python's.
            got = mod.entries(pk, raw, specs, self.max_key)
            if got is not None:
                return [Entry(d, key, b"", head, v)
                        for (d, *_), (key, head, v) in zip(self._compiled, got)], []
        try:
            doc = self._decode(raw)
        except BadDocument as e:
            return [], [Bad(d, str(e)) for d, *_ in self._compiled]
        out: list[Entry] = []
        bad: list[Bad] = []
        for d, iid, path, want in self._compiled:
            v = field_value(doc, path)
            if v is MISSING:
                bad.append(Bad(d, f"field {'.'.join(path)!r} is missing"))
                continue
            if not type_ok(want, v):
                bad.append(Bad(d, f"field {'.'.join(path)!r} is a {type(v).__name__}, "
                                  f"expected {want}"))
                continue
            try:
                enc = keycodec.encode_value(v)
            except keycodec.UnencodableValue as e:
                bad.append(Bad(d, f"field {'.'.join(path)!r}: {e}"))
                continue
            key, data = keycodec.entry(iid, enc, v, pk, self.max_key)
            out.append(Entry(d, key, data, 2 + len(enc), v))
        return out, bad

    def refuse(self, pk: bytes, bad: list[Bad]) -> None:
        """Raise for the first bad value whose index refuses bad values."""
        for b in bad:
            if b.index.on_bad == "refuse":
                raise BadValueError(b.index.name, pk, b.reason)

    def feed(self, pk: bytes, raw: bytes, add: Callable[[bytes], None],
             add_with_data: Callable[[bytes, bytes], None]) -> list[Bad] | None:
        """The same entries as :meth:`entries` (a test checks it), handed to
        ``add(key)`` / ``add_with_data(key, data)`` without building Entry tuples.
        Returns the bad indexes, or None when there were none."""
        try:
            doc = self._decode(raw)
        except BadDocument as e:
            return [Bad(d, str(e)) for d, *_ in self._compiled]
        bad: list[Bad] | None = None
        for spec in self._fast:
            field, path, cache = spec[0], spec[1], spec[2]
            if field is not None and type(doc) is dict:
                v = doc.get(field, MISSING)
            else:
                v = field_value(doc, path)
            try:
                got = cache.get(v)
            except TypeError:         # a list or an object: unhashable, and bad
                got = None
            if got is not None and got[0] is type(v) and len(pk) <= got[2]:
                add(got[1] + pk)
                continue
            b = self._one(spec, pk, v, add, add_with_data)
            if b is not None:
                if bad is None:
                    bad = []
                bad.append(b)
        return bad

    def _one(self, spec: tuple, pk: bytes, v: object, add: Callable[[bytes], None],
             add_with_data: Callable[[bytes, bytes], None]) -> Bad | None:
        """One index's entry of field value ``v``, the uncached way; fills the cache."""
        _field, path, cache, d, iid, want = spec
        t = type(v)
        if v is MISSING:
            return Bad(d, f"field {'.'.join(path)!r} is missing")
        if want is not None and not type_ok(want, v):
            return Bad(d, f"field {'.'.join(path)!r} is a {t.__name__}, expected {want}")
        try:
            enc = keycodec.encode_value(v)
        except keycodec.UnencodableValue as e:
            return Bad(d, f"field {'.'.join(path)!r}: {e}")
        key, data = keycodec.entry(iid, enc, v, pk, self.max_key)
        if data:
            add_with_data(key, data)
            return None
        add(key)
        if t in _CACHED:
            # Encodings of recent values are reused: indexed fields repeat values
            # (ages, cities) and encoding is most of the per-entry work. Keyed by the
            # value alone (1, 1.0 and True are one dict key), so a hit must also match
            # the type; the entry holds how long a primary key may be for a plain key.
            if len(cache) >= _CACHE_MAX:
                cache.clear()
            head = keycodec.index_prefix(iid) + enc
            cache[v] = (t, head, self.max_key - len(head))
        return None

    def feed_many(self, items: Iterable[tuple[bytes, bytes]] | Columns, add: Callable[[bytes], None],
                  add_with_data: Callable[[bytes, bytes], None],
                  on_bad: Callable[[bytes, list[Bad]], None]) -> int:
        """:meth:`feed` for a batch of (primary key, value): the same entries, bad
        values reported to ``on_bad(pk, bads)``; returns the number of values. One
        call per batch keeps the interpreter in one loop: with orjson and top-level
        fields the common case is a parse, a dict get, a cache hit and a concat; with
        the C accelerator it is a scan of the raw bytes and one key built in C, and
        every value it does not take comes back here whole (``fallback``). ``items``
        may also be the decoder's :class:`~checkpoint.decode.LiveColumns` (keys and
        values in buffers, no object per pair): the C path reads them in place and
        builds a (pk, value) pair only for a value it hands back."""
        mod, specs = accel.module, self._c_specs
        cols = items if isinstance(items, Columns) else None
        if mod is not None and specs is not None:
            feed = self.feed

            def fallback(item: tuple[bytes, bytes]) -> None:
                pk, raw = item
                bad = feed(pk, raw, add, add_with_data)
                if bad:
                    on_bad(pk, bad)
            if cols is not None:
                return mod.feed_columns(cols.data, cols.spill, cols.cols, specs, self.max_key,
                                        add, fallback)
            return mod.feed_many(items, specs, self.max_key, add, fallback)
        pairs = items.pairs() if isinstance(items, Columns) else items
        loads = self._fast_loads
        if loads is None or not self._top_level:
            n = 0
            for pk, raw in pairs:
                bad = self.feed(pk, raw, add, add_with_data)
                if bad:
                    on_bad(pk, bad)
                n += 1
            return n
        feed, one, fast = self.feed, self._one, self._fast
        missing = MISSING
        n = 0
        for pk, raw in pairs:
            n += 1
            try:
                doc = loads(raw)
            except ValueError:        # orjson refuses it: the reference path decides
                doc = None
            if type(doc) is not dict:
                bad = feed(pk, raw, add, add_with_data)
                if bad:
                    on_bad(pk, bad)
                continue
            bad = None
            for spec in fast:
                v = doc.get(spec[0], missing)
                try:
                    got = spec[2].get(v)
                except TypeError:     # a list or an object: unhashable, and bad
                    got = None
                if got is not None and got[0] is type(v) and len(pk) <= got[2]:
                    add(got[1] + pk)
                    continue
                b = one(spec, pk, v, add, add_with_data)
                if b is not None:
                    if bad is None:
                        bad = []
                    bad.append(b)
            if bad:
                on_bad(pk, bad)
        return n
