"""wal/ modules import each other without a circle and without private names."""
from __future__ import annotations

import os

from tests.layering import module_cycles, private_imports

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                   "wal")


def test_wal_imports_form_a_dag() -> None:
    assert module_cycles(PKG) == []


def test_no_module_imports_another_ones_private_name() -> None:
    assert private_imports(PKG) == []
