"""checkpoint/'s modules import each other as a DAG, with no back door.

The store hands its shared state (checkpoint/state.py) to the checkpointer, recovery and
the undo log explicitly; they never import the store, not even for type hints, and no
module takes a private name from another. The decoder's modules stay importable without
the store or the WAL (Spark executors import them alone).
"""
from __future__ import annotations

import os
import subprocess
import sys

from tests.layering import import_graph, module_cycles, private_imports

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = os.path.join(ROOT, "checkpoint")


def test_checkpoint_imports_form_a_dag() -> None:
    assert module_cycles(PKG) == []


def test_no_module_imports_a_private_name_of_another() -> None:
    assert private_imports(PKG) == []


def test_no_module_imports_the_store() -> None:
    graph = import_graph(PKG)
    users = sorted(m for m, targets in graph.items() if "store" in targets)
    assert users == [], users


def test_no_private_store_state_is_read_outside_the_store() -> None:
    for name in sorted(os.listdir(PKG)):
        if not name.endswith(".py") or name == "store.py":
            continue
        with open(os.path.join(PKG, name), encoding="utf-8") as f:
            text = f.read()
        assert "store._" not in text, f"{name} reads a private member of the store"


def test_decoder_modules_import_without_store_or_wal() -> None:
    code = ("import sys\n"
            "import checkpoint.pagefile, checkpoint.layout\n"
            "bad = [m for m in sys.modules if m.startswith(('wal', 'checkpoint.store', "
            "'checkpoint.checkpointer', 'checkpoint.recovery', 'checkpoint.state'))]\n"
            "assert not bad, bad\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
