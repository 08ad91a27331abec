"""Each package's modules import each other without a circle and without taking a
private name from one another (tests/layering.py reads the source; docs/architecture.md, "Packages and imports").
checkpoint/ has its own, stricter test (tests/checkpoint/test_layering.py)."""
from __future__ import annotations

import os

import pytest

from tests.layering import module_cycles, private_imports

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("package", ["faults", "wal", "transfer", "indexes", "node", "cluster_sim", "validation"])
def test_imports_form_a_dag(package: str) -> None:
    assert module_cycles(os.path.join(ROOT, package)) == []


@pytest.mark.parametrize("package", ["faults", "wal", "transfer", "indexes", "node", "cluster_sim", "validation"])
def test_no_module_imports_another_ones_private_name(package: str) -> None:
    assert private_imports(os.path.join(ROOT, package)) == []
