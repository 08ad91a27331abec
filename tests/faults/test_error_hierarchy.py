"""One error hierarchy: every error a package defines lives in its
``errors.py`` and subclasses faults' ``FerryError`` through the package's base error
(``WalError``, ``TransferError``, ``IndexStoreError`` ...).

Every module of the package is imported and each exception class it defines is
checked; a CLI's usage errors (click's ``ClickException``) are click's, not Ferry's.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import click
import pytest

from faults import FerryError

# package -> its base error (faults' base is FerryError itself)
BASES = {
    "faults": "faults.errors.FerryError",
    "wal": "wal.errors.WalError",
    "transfer": "transfer.errors.TransferError",
    "indexes": "indexes.errors.IndexStoreError",
}


def _resolve(dotted: str) -> type:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def defined_errors(package: str) -> list[type[BaseException]]:
    """The exception classes the package's modules define (not those they import)."""
    pkg = importlib.import_module(package)
    out: list[type[BaseException]] = []
    for info in pkgutil.walk_packages(pkg.__path__, package + "."):
        if info.name.rpartition(".")[2].startswith("_") and not info.ispkg:
            continue                                    # C accelerators
        mod = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(mod, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == info.name \
                    and not issubclass(obj, click.ClickException):
                out.append(obj)
    return out


@pytest.mark.parametrize("package", sorted(BASES))
def test_every_error_of_the_package_is_under_its_base(package: str) -> None:
    base = _resolve(BASES[package])
    assert issubclass(base, FerryError)
    errors = defined_errors(package)
    assert base in errors
    outside = [e.__qualname__ for e in errors if e.__module__ != f"{package}.errors"]
    assert outside == [], f"errors defined outside {package}/errors.py"
    stray = [e.__qualname__ for e in errors if not issubclass(e, base)]
    assert stray == [], f"errors of {package} not under {base.__name__}"
