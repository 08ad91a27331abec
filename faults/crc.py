"""CRC32C (Castagnoli) from the ``crc32c`` package's compiled module, without the cost
of importing that package.

``import crc32c`` runs the package's ``__init__``, which looks its own version up
through ``importlib.metadata``: a scan of the distributions on ``sys.path`` and an
import of the email parser, 140-320 ms measured on the development VM, and the
largest single part of a node's imports at start. This module loads the package's
compiled module (``crc32c._crc32c``, the same function) by itself, 1-10 ms, and
registers it under its own name, so a later ``import crc32c`` reuses it. If the
package is laid out otherwise, the plain import is the fallback.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Callable

_NAME = "crc32c._crc32c"


def _compiled() -> ModuleType | None:
    held = sys.modules.get(_NAME)
    if held is not None:
        return held
    spec = importlib.util.find_spec("crc32c")       # finds it; imports nothing
    for where in (spec.submodule_search_locations or []) if spec is not None else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(where, "_crc32c" + suffix)
            if os.path.isfile(path):
                loader = importlib.machinery.ExtensionFileLoader(_NAME, path)
                mspec = importlib.util.spec_from_file_location(_NAME, path, loader=loader)
                if mspec is None:
                    return None
                mod = importlib.util.module_from_spec(mspec)
                loader.exec_module(mod)
                sys.modules[_NAME] = mod
                return mod
    return None


def _load() -> Callable[..., int]:
    if "crc32c" not in sys.modules:
        try:
            mod = _compiled()
        except (ImportError, OSError):
            mod = None
        fn = getattr(mod, "crc32c", None)
        if callable(fn):
            return fn          # type: ignore[no-any-return]
    import crc32c as package
    return package.crc32c


#: ``crc32c(data, value=0)``: the CRC32C of ``data``, continued from ``value``.
crc32c: Callable[..., int] = _load()

__all__ = ["crc32c"]
