"""Loading the optional C accelerators of the checkpoint package, and the switch of
the page decoder's one.

``FERRY_PAGE_ACCEL`` (0/off/no/false, any case) turns every checkpoint C path off;
each accelerator has an ABI version and a module built from another one is not used.
The accelerators are imported by name through importlib so that the shipped decoder
(validation/ship.py follows ``import`` statements) does not list them as modules to
pack.

``page`` is ``checkpoint._pageaccel`` (the decoder's bulk path, the checks and the key
scan) or None. It does the common case of a whole read chunk in one call and stops at
anything unusual (a page failing a check, a chain it cannot follow); the Python code
then handles that page as it always has, so items, order, errors and the pages marked
checked are the same with and without it. Its users read ``accel.page`` at each call:
tests and benches swap it here, in one place.
"""
from __future__ import annotations

import os
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Protocol, cast

if TYPE_CHECKING:           # the decoder runs on Spark executors: stdlib only at run time
    from array import array

    from typing_extensions import Buffer

OFF_WORDS = ("0", "off", "no", "false")     # values of an accelerator switch that mean off
ACCEL_ENV = "FERRY_PAGE_ACCEL"
PAGE_ABI = 3                 # 2: scan_keys (the open scan's hashes); 3: decode_live


def load_accel(module: str, abi: int, env: str = ACCEL_ENV) -> ModuleType | None:
    """An optional C accelerator ``module`` when it is built, of ABI version ``abi`` and
    not turned off by ``env``; else None (the pure-Python path). The one loader of the
    checkpoint accelerators."""
    if os.environ.get(env, "1").strip().lower() in OFF_WORDS:
        return None
    try:
        import importlib
        mod = importlib.import_module(module)
    except ImportError:
        return None
    return mod if getattr(mod, "ABI_VERSION", None) == abi else None


# The page decoder's C entry points as its Python callers use them (all of the module:
# checkpoint/_pageaccel.pyi). A chain page's source: page index -> (first page, bytes).
Fetch = Callable[[int], "tuple[int, bytes]"]
# scan_keys(chunk, first, j, page_size, need, space, quarter, roomy, free_pages)
#   -> (hashes, locations, j): the open scan's columns (built only with xxhash.h)
ScanKeys = Callable[["Buffer", int, int, int, int, "array[int]", int, "set[int]", "list[int]"],
                    "tuple[bytes, bytes, int]"]


class PageAccel(Protocol):
    """``checkpoint._pageaccel``, of ABI version :data:`PAGE_ABI`."""

    @property
    def HW_CRC(self) -> int: ...

    def check_pages(self, buf: Buffer, first: int, page_size: int, j: int, /) -> int: ...

    # items: Entry tuples, or (key, value) pairs when ``pairs`` (decode.py's lists)
    def decode(self, chunk: Buffer, first: int, j: int, ps: int, checked: bytearray,
               tombstones: bool, pairs: bool, page_count: int, fetch: Fetch, entry: type, /
               ) -> tuple[list[Any], int, BaseException | None]: ...

    # the live pairs as column records into ``chunk`` and a spill (decode.LiveColumns)
    def decode_live(self, chunk: Buffer, first: int, j: int, ps: int, checked: bytearray,
                    page_count: int, fetch: Fetch, /
                    ) -> tuple[bytes, bytes, int, BaseException | None]: ...

    def chain_value(self, page: int, length: int, ps: int, page_count: int, checked: bytearray,
                    fetch: Fetch, /) -> bytes | None: ...

    def page_keys(self, chunk: Buffer, first: int, j: int, ps: int, /
                  ) -> tuple[list[tuple[int, int, int, list[tuple[int, bytes]]]], int]: ...


def load_page_accel() -> PageAccel | None:
    """``checkpoint._pageaccel`` or None, as at import (the environment read now)."""
    mod = load_accel("checkpoint._pageaccel", PAGE_ABI, ACCEL_ENV)
    # the ABI version checked by load_accel is what vouches for these entry points
    return cast(PageAccel, mod) if mod is not None else None


page: PageAccel | None = load_page_accel()


def accelerator() -> str | None:
    """What decodes the bulk path: ``"c+sse4.2"``/``"c"`` or None (pure Python)."""
    if page is None:
        return None
    return "c+sse4.2" if page.HW_CRC else "c"


def key_scan_accel() -> ScanKeys | None:
    """The C entry point of the open scan (``_pageaccel.scan_keys``), or None: no C
    decoder, or one built without xxhash.h."""
    scan: ScanKeys | None = getattr(page, "scan_keys", None)
    return scan
