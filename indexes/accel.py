"""The optional C fast path of :meth:`indexes.indexer.Indexer.feed_many`
(``indexes/_ixaccel.c``) and its switch.

The accelerator scans each JSON document once without building Python objects,
finds the definitions' top-level fields and encodes the common values (plain strings,
ints of up to 18 digits, floats, booleans, null) to entry keys itself. Every other
value -- invalid or unusual JSON, escapes in top-level keys or wanted strings, a
missing or badly typed field, a long string, a key past LMDB's limit -- goes whole to
the Python path, so entries and bad-value reports are the same with and without it
(tests/indexes/test_ixaccel.py checks that on random documents).

``FERRY_INDEX_ACCEL=0`` (or off/no/false, any case) turns it off; a module built from
another version (``ABI_VERSION``) is ignored. Without it everything works as before.
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType

ACCEL_ENV = "FERRY_INDEX_ACCEL"
_ABI = 2                     # 2: feed_columns (the decoder's LiveColumns)
_OFF = ("0", "off", "no", "false")
# Type codes of the C side, in definitions.TYPES order.
WANT = {None: 0, "int": 1, "number": 2, "str": 3, "bool": 4, "bytes": 5}


def load() -> ModuleType | None:
    """The C module when built, of this version and not turned off; else None.
    Imported by name so that a shipped copy of the package does not list it."""
    if os.environ.get(ACCEL_ENV, "1").strip().lower() in _OFF:
        return None
    try:
        mod = importlib.import_module("indexes._ixaccel")
    except ImportError:
        return None
    return mod if getattr(mod, "ABI_VERSION", None) == _ABI else None


# Read by Indexer.feed_many at each call: tests swap it.
module = load()


def name() -> str | None:
    """What runs the rebuild's per-value work: ``"c"`` or None (pure Python)."""
    return "c" if module is not None else None
