"""The package structure: no import cycle between tierec's packages or modules, no private imports.

Imports are read from the source (``ast``), lazy ones inside functions
included (a cycle hidden in a function is still a cycle); imports under
``if TYPE_CHECKING:`` are not counted (they never run). A package is a
directory under tierec/ (``tierec.store``); a top-level module
(``tierec.config``) is its own node.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tierec

ROOT = Path(tierec.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                skip.update(id(n) for n in ast.walk(sub))
    return skip


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """(imported module, names taken from it) of every run-time import of one module."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_nodes(tree)
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.startswith("tierec")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg.split(".")[: len(pkg.split(".")) - node.level + 1] + ([base] if base else []))
            if not base.startswith("tierec"):
                continue
            plain = []
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in modules:  # `from tierec.store import hotness`: the submodule itself
                    out.append((sub, []))
                else:
                    plain.append(a.name)
            if plain:
                out.append((base, plain))
    return out


def _node(module: str) -> str:  # tierec.store.group -> tierec.store; tierec.config -> tierec.config
    parts = module.split(".")
    return ".".join(parts[:2])


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]], list[str]]:
    modules = _modules()
    mod_edges: dict[str, set[str]] = {}
    pkg_edges: dict[str, set[str]] = {}
    private = []
    for name, path in modules.items():
        for target, names in _imports(name, path, modules):
            if target not in modules:
                continue
            if target != name and not (modules[target].name == "__init__.py" and name.startswith(target + ".")):
                mod_edges.setdefault(name, set()).add(target)
            a, b = _node(name), _node(target)
            if a != b and a != "tierec" and b != "tierec":
                pkg_edges.setdefault(a, set()).add(b)
            if target != name:
                private += [f"{name} imports {target}.{n}" for n in names if n.startswith("_") and not n.startswith("__")]
    return mod_edges, pkg_edges, private


# Known, not fixed yet (each names why); the tests fail on anything else, and on a known entry that is gone.
KNOWN_MODULE_CYCLES: list[list[str]] = []


def test_no_import_cycle_between_packages() -> None:
    # train sits above distributed: the loop runs on a Job and parallelizes its components; starting
    # `tierec train` on several processes (train/launch.py) and checkpoints of any world size are train's.
    _, pkg_edges, _ = _graph()
    assert _cycles(pkg_edges) == []


def test_no_import_cycle_between_modules() -> None:
    mod_edges, _, _ = _graph()
    # a package's __init__ re-exports its modules; those importing siblings through it are not a cycle
    edges = {a: {b for b in bs if not _is_init(b)} for a, bs in mod_edges.items() if not _is_init(a)}
    assert _cycles(edges) == KNOWN_MODULE_CYCLES


def test_no_module_imports_another_modules_private_names() -> None:
    _, _, private = _graph()
    assert private == []


def test_the_checks_see_cycles_and_private_imports() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import tierec.x\n")
    assert len(_type_checking_nodes(tree)) > 0


def _is_init(name: str) -> bool:
    return name.count(".") < 2 or (ROOT.parent / name.replace(".", "/") / "__init__.py").exists()
