"""Report the package's structure problems: import loops between modules,
private names imported across modules, imports across a layer the other
way (:data:`LAYERS`; the modules :data:`ABOVE` a rule's package, which
drive the strategies, are exempt from it), and functions longer than a
limit.

    python scripts/structure.py            # a summary per kind
    python scripts/structure.py --list     # every finding
    python scripts/structure.py --json     # machine-readable

An import inside a function counts as an edge too: it only defers the loop.
``tests/test_structure.py`` uses :func:`findings` to keep the counts from
growing.
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("placer", "gnn", "evolution")
LONG_FUNCTION_LINES = 120
#: package -> the packages it must not import: the core (``placer``) lies
#: below the strategies of ``evolution`` and ``gnn`` (it finds them by name,
#: through the registry), the cost models below the plan space and the
#: searches, the plan space below the searches that move through it, and
#: the policy runs evolution only through the strategy registry
LAYERS = {
    "placer": ("evolution", "gnn"),
    "placer.cost": ("placer.space", "placer.search", "placer.runtime", "placer.bench"),
    "placer.space": ("evolution", "gnn", "placer.search"),
    "gnn": ("evolution",),
}
#: package of a rule -> its modules that stand above it: the command line
#: (``placer train``), the benchmarks and the kernel warm-up (the policy's
#: decoder) drive the strategies themselves
ABOVE = {
    "placer": ("placer.cli", "placer.bench", "placer.warmup"),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = path
    return found


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` is or lies in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, tree: ast.AST, modules: dict[str, Path], is_package: bool):
    """Yield (imported module, imported name or None, line)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                owner = _owner(alias.name, modules)
                if owner:
                    yield owner, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node, is_package)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub in modules:
                    yield sub, None, node.lineno
                else:
                    owner = _owner(source, modules)
                    if owner:
                        yield owner, alias.name, node.lineno


def _long_functions(tree: ast.AST, limit: int):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                yield node.name, node.lineno, length


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def findings(limit: int = LONG_FUNCTION_LINES) -> dict:
    """Import cycles, cross-module private imports, imports against the
    :data:`LAYERS` and long functions of the package, as plain lists
    (sorted, so two runs compare equal)."""
    modules = _sources()
    graph = nx.DiGraph()
    private, long_functions, layers = [], [], []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        graph.add_node(module)
        for target, name, line in _imports(module, tree, modules, path.name == "__init__.py"):
            if target != module:
                graph.add_edge(module, target)
            if (name and name.startswith("_") and not name.startswith("__")
                    and target != module):
                private.append(f"{module}:{line} imports {target}.{name}")
            for package, banned in LAYERS.items():
                if not _inside(module, package) or any(
                        _inside(module, m) for m in ABOVE.get(package, ())):
                    continue
                for other in banned:
                    if _inside(target, other):
                        layers.append(f"{module}:{line} imports {target} "
                                      f"({package} must not import {other})")
        for name, line, length in _long_functions(tree, limit):
            long_functions.append(f"{module}.{name}:{line} {length} lines")
    # a package's __init__ importing its own submodules is not a loop
    for module in list(graph):
        for target in list(graph.successors(module)):
            if target.startswith(module + ".") and module in PACKAGES + tuple(
                    m for m, p in modules.items() if p.name == "__init__.py"):
                graph.remove_edge(module, target)
    cycles = sorted(" <-> ".join(sorted(c)) for c in nx.strongly_connected_components(graph)
                    if len(c) > 1)
    return {"import_cycles": cycles, "private_imports": sorted(private),
            "layer_violations": sorted(set(layers)), "long_functions": sorted(long_functions)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every finding")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--limit", type=int, default=LONG_FUNCTION_LINES,
                        help="function length limit in lines (default %(default)s)")
    args = parser.parse_args(argv)
    result = findings(args.limit)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    for kind, items in result.items():
        print(f"{kind}: {len(items)}")
        if args.list:
            for item in items:
                print(f"  {item}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
