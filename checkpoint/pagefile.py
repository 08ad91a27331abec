"""The partition page file ``part-<p>.bin``: the public face of its format and decoder.

The code lives in one place each; this module names what other packages use:

* :mod:`.layout` - structs, enums, header and meta fields, seal, file names;
* :mod:`.check` - page checks (``check_page``, ``check_pages``, ``PageProblem``);
* :mod:`.chain` - overflow chain rules and walks;
* :mod:`.reader` - ``read_meta`` and chunked page reads;
* :mod:`.decode` - THE decoder (``iter_entries``, ``iter_*_batches``, ``iter_live_columns``,
  ``verify``);
* :mod:`.keyscan` - the keys-only scan of the key index;
* :mod:`.accel` - loading the C accelerators, and the decoder's switch (``accel.page``);
* :mod:`.errors` - ``CheckpointError``, ``CorruptPageError``.

Importable with only the standard library, ``crc32c``, ``faults.crc`` and ``faults.errors`` (Spark
executors import this module; validation/ship.py packs what it imports). The format is
written out in ``docs/formats.md`` ("Partition page files").
"""
from __future__ import annotations

from .accel import ACCEL_ENV, OFF_WORDS, accelerator, key_scan_accel, load_accel
from .chain import chain_limit, chain_link_problem, overflow_chain
from .check import PageProblem, check_data, check_page, check_pages
from .decode import (Entry, LiveColumns, iter_entries, iter_entry_batches, iter_live_batches,
                     iter_live_columns, iter_live_range, page_entries, verify)
from .errors import CheckpointError, CorruptPageError
from .keyscan import iter_page_keys, scan_key_hashes
from .layout import (ENTRY, F_OVERFLOW, F_TOMBSTONE, FORMAT_VERSION, HDR, HEADER, MAGIC,
                     MAX_PAGE_SIZE, MAX_VALUE, META, META_END, MIN_PAGE_SIZE, PTR, SLOT,
                     EntryFlag, Meta, PageType, encode_meta, entry_size, page_crc, seal,
                     seal_many, valid_page_size)
from .reader import PageReader, read_meta

__all__ = [
    "ACCEL_ENV", "CheckpointError", "CorruptPageError", "ENTRY", "Entry", "EntryFlag",
    "FORMAT_VERSION", "F_OVERFLOW", "F_TOMBSTONE", "HDR", "HEADER", "MAGIC", "MAX_PAGE_SIZE",
    "MAX_VALUE", "META", "META_END", "MIN_PAGE_SIZE", "Meta", "OFF_WORDS", "PTR", "PageProblem",
    "PageReader", "PageType", "SLOT", "accelerator", "chain_limit", "chain_link_problem",
    "LiveColumns", "check_data", "check_page", "check_pages", "encode_meta", "entry_size",
    "iter_entries", "iter_entry_batches", "iter_live_batches", "iter_live_columns",
    "iter_live_range", "iter_page_keys", "key_scan_accel",
    "load_accel", "overflow_chain", "page_crc", "page_entries", "read_meta", "scan_key_hashes",
    "seal", "seal_many", "valid_page_size", "verify",
]
