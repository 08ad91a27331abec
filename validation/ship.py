"""A zip of the page decoder and the validation data source, for Spark executors.

Executors of a real cluster do not have Ferry installed. ``build_zip`` packs what a
Python worker imports to decode partition files: ``checkpoint/pagefile.py`` with the
Ferry modules it imports (found by reading its ``import`` statements, transitively),
and the modules of this package the data source needs. Package ``__init__`` files
are replaced by empty ones, so importing ``checkpoint.pagefile`` on an executor does
not pull in the rest of ``checkpoint`` (its store, WAL, file-I/O seam ...).

    python -m validation.ship ferry_decoder.zip
    spark-submit --py-files ferry_decoder.zip validation/job.py ...
"""
from __future__ import annotations

import ast
import importlib.util
import os
import sys
import zipfile

# Roots: the modules a worker imports by name. Everything they import from Ferry's
# own packages follows.
ROOTS = ("checkpoint.pagefile", "validation.source")
# Live mode (validation.livesource) also needs the transfer agents' demander, the
# node's RPC client, and the cluster's key -> partition function (--expected rows
# without a partition); shipped as a second zip so the folder-mode zip stays small.
LIVE_ROOTS = ROOTS + ("validation.livesource", "node.assignment")
FERRY_PACKAGES = ("faults", "wal", "checkpoint", "transfer", "indexes", "node",
                  "cluster_sim", "validation", "ferry")


def _module_file(name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise ModuleNotFoundError(f"cannot find the source of {name}; is Ferry installed?")
    return spec.origin


def _is_module(name: str) -> bool:
    try:
        _module_file(name)
        return True
    except (ModuleNotFoundError, ImportError):
        return False


def _imports(name: str, path: str) -> set[str]:
    """Ferry modules the module ``name`` imports (absolute and relative). ``from pkg
    import mod`` needs only ``pkg.mod``; ``from pkg import func`` needs ``pkg``'s own
    ``__init__``."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    is_pkg = path.endswith("__init__.py")
    package = name if is_pkg else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(p for p in parts + [base] if p)
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.add(sub if _is_module(sub) else base)
    return {m for m in found if m.split(".")[0] in FERRY_PACKAGES and m != name}


def modules(roots: tuple[str, ...] = ROOTS) -> dict[str, str]:
    """Module name -> source file for ``roots`` and what they import, transitively."""
    todo, done = list(roots), {}
    while todo:
        name = todo.pop()
        if name in done:
            continue
        done[name] = _module_file(name)
        todo.extend(_imports(name, done[name]) - done.keys())
    return done


def build_zip(out: str, roots: tuple[str, ...] = ROOTS) -> list[str]:
    """Write the zip to ``out``; return the archive names written."""
    mods = modules(roots)
    names: dict[str, bytes] = {}
    for name, path in mods.items():
        parts = name.split(".")
        for i in range(1, len(parts)):
            names.setdefault("/".join(parts[:i]) + "/__init__.py", b"")
        arc = "/".join(parts) + ("/__init__.py" if path.endswith("__init__.py") else ".py")
        with open(path, "rb") as f:
            names[arc] = f.read()  # a real package __init__ replaces its stub
    tmp = out + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for arc in sorted(names):
            z.writestr(arc, names[arc])
    os.replace(tmp, out)
    return sorted(names)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m validation.ship OUT.zip")
    for arc in build_zip(sys.argv[1]):
        print(arc)
