"""Import-graph checks for the packages' layering.

`module_cycles(package_dir)` reads every module of one package with `ast` (nothing is
imported) and returns the import circles among its modules. Every import counts: a
module-level one, one deferred into a function body, and one under `TYPE_CHECKING`,
because a deferred or type-only import that closes a circle is the same tangle, only
hidden from the interpreter. A test asserts the result is empty:

    from tests.layering import module_cycles
    assert module_cycles(ROOT / "indexes") == []

`private_imports(package_dir)` returns the package's imports of a private name
(`_x`) from another module, which is the back door a circle is usually held by.
"""
from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ImportSite:
    """One import statement of a module: where it is and what it names."""

    module: str      # importing module, dotted within the package ("rebuild", "sub.x")
    line: int
    target: str      # imported module, dotted within the package ("" is the __init__)
    names: tuple[str, ...]  # names taken from the target by `from ... import`


def _modules(package_dir: Path) -> dict[str, Path]:
    """Dotted module names (relative to the package) -> source path; "" is __init__."""
    out: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(package_dir):
        dirnames[:] = sorted(d for d in dirnames
                             if os.path.exists(os.path.join(dirpath, d, "__init__.py")))
        rel = Path(dirpath).relative_to(package_dir).parts
        for fn in sorted(filenames):
            if not fn.endswith(".py"):
                continue
            stem = fn[:-3]
            parts = rel if stem == "__init__" else (*rel, stem)
            out[".".join(parts)] = Path(dirpath) / fn
    return out


def _extensions(package_dir: Path) -> set[str]:
    """Dotted names of the package's C extensions (`_accel.c`, `_accel.*.so`): leaves."""
    out: set[str] = set()
    for dirpath, _dirs, filenames in os.walk(package_dir):
        rel = Path(dirpath).relative_to(package_dir).parts
        for fn in filenames:
            if fn.endswith((".c", ".so", ".pyd")):
                out.add(".".join((*rel, fn.split(".")[0])))
    return out


def _is_package(mod: str, modules: dict[str, Path]) -> bool:
    return modules[mod].name == "__init__.py"


def import_sites(package_dir: str | os.PathLike[str]) -> list[ImportSite]:
    """Every import of one package's module by another module of the same package."""
    pkg_dir = Path(package_dir).resolve()
    pkg = pkg_dir.name
    modules = _modules(pkg_dir)
    extensions = _extensions(pkg_dir)
    sites: list[ImportSite] = []
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        # The package a relative import of this module is resolved against.
        base = mod.split(".") if _is_package(mod, modules) else mod.split(".")[:-1]
        base = [p for p in base if p]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] == pkg:
                        sites.append(ImportSite(mod, node.lineno, ".".join(parts[1:]), ()))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                    target = [*anchor, *(node.module.split(".") if node.module else [])]
                elif node.module and node.module.split(".")[0] == pkg:
                    target = node.module.split(".")[1:]
                else:
                    continue
                tgt = ".".join(target)
                names = tuple(a.name for a in node.names)
                # `from . import keycodec` imports the submodule, not the __init__.
                subs = [n for n in names if ".".join([*target, n]) in modules]
                for n in subs:
                    sites.append(ImportSite(mod, node.lineno, ".".join([*target, n]), ()))
                # A compiled extension imports nothing of the package: not an edge.
                rest = tuple(n for n in names if n not in subs
                             and ".".join([*target, n]) not in extensions)
                if rest and tgt in modules:
                    sites.append(ImportSite(mod, node.lineno, tgt, rest))
    return sites


def import_graph(package_dir: str | os.PathLike[str]) -> dict[str, set[str]]:
    """module -> the package's modules it imports (self-imports dropped)."""
    pkg_dir = Path(package_dir).resolve()
    graph: dict[str, set[str]] = {m: set() for m in _modules(pkg_dir)}
    for s in import_sites(pkg_dir):
        if s.target != s.module:
            graph[s.module].add(s.target)
    return graph


def module_cycles(package_dir: str | os.PathLike[str]) -> list[list[str]]:
    """The import circles among one package's modules, each as a sorted module list.

    Returns the strongly connected components with more than one module (Tarjan), so
    an empty list means the modules' imports form a DAG. Names are relative to the
    package, "" being its `__init__`.
    """
    graph = import_graph(package_dir)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def private_imports(package_dir: str | os.PathLike[str]) -> list[ImportSite]:
    """Imports of a private name (`_x`, not dunder) from another module of the package."""
    return [s for s in import_sites(package_dir)
            if s.target != s.module
            and any(n.startswith("_") and not n.startswith("__") for n in s.names)]


# -- imports across packages ------------------------------------------------------------
PACKAGES = ("faults", "wal", "checkpoint", "transfer", "indexes", "node", "cluster_sim",
            "validation", "ferry")


@dataclass(frozen=True)
class Reach:
    """An import of another package's private module (not its public face)."""

    path: str        # the importing file, relative to the root
    line: int
    module: str      # the module reached, e.g. "node.assignment"
    names: tuple[str, ...]

    def __str__(self) -> str:
        what = f" ({', '.join(self.names)})" if self.names else ""
        return f"{self.path}:{self.line}: {self.module}{what}"


def public_modules(root: str | os.PathLike[str], package: str) -> set[str]:
    """The modules of ``package`` other packages may import: the package itself and the
    submodules its docstring names (``:mod:`pkg.x```, ``pkg.x``) or its ``__init__``
    imports by name (``from . import fileio``)."""
    init = Path(root) / package / "__init__.py"
    tree = ast.parse(init.read_text())
    out = {package}
    doc = ast.get_docstring(tree) or ""
    subs = {m[:-3] for m in os.listdir(Path(root) / package) if m.endswith(".py")}
    subs |= {d for d in os.listdir(Path(root) / package)
             if (Path(root) / package / d / "__init__.py").exists()}
    for s in subs:
        # "pkg.x" named as a word ("pkg.x.Name" too), not as part of a longer name
        if re.search(rf"(?<![\w.]){package}\.{s}(?!\w)", doc):
            out.add(f"{package}.{s}")
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module is None:
            out.update(f"{package}.{a.name}" for a in node.names if a.name in subs)
    return out


def private_reaches(root: str | os.PathLike[str], files: list[Path],
                    packages: tuple[str, ...] = PACKAGES) -> list[Reach]:
    """Imports in ``files`` of a module of another package that is not on its face."""
    root = Path(root).resolve()
    faces = {p: public_modules(root, p) for p in packages}
    out: list[Reach] = []
    for f in files:
        f = Path(f).resolve()
        rel = f.relative_to(root)
        own = rel.parts[0] if rel.parts[0] in packages else None
        tree = ast.parse(f.read_text(), filename=str(f))
        for node in ast.walk(tree):
            mods: list[tuple[str, tuple[str, ...]]] = []
            if isinstance(node, ast.Import):
                mods = [(a.name, ()) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = tuple(a.name for a in node.names)
                mods = [(node.module, names)]
                # `from pkg import submodule` reaches the submodule
                top = node.module.split(".")[0]
                if node.module == top and top in packages:
                    pkg_dir = root / top
                    mods += [(f"{top}.{n}", ()) for n in names
                             if (pkg_dir / f"{n}.py").exists()
                             or (pkg_dir / n / "__init__.py").exists()]
            for mod, names in mods:
                top = mod.split(".")[0]
                if top not in packages or top == own or "." not in mod:
                    continue
                # the module or a package above it on the other package's face
                parts = mod.split(".")
                if not any(".".join(parts[:i]) in faces[top] and i == len(parts)
                           for i in range(2, len(parts) + 1)):
                    out.append(Reach(str(rel), node.lineno, mod, names))
    return sorted(out, key=lambda r: (r.path, r.line))
