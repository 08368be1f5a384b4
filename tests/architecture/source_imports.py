"""
The package's modules and their imports, read from the source with `ast` (nothing is imported): what the
architecture tests check.

- The modules are the `.py` files under src/realm_hf (`pkg/__init__.py` is the module `pkg`), the console script
  src/realm_hf_cli.py (the module `realm_hf_cli`) and its parser src/realm_hf_cli_parser.py.
- Every `import` and `from ... import` statement is an import, at module level and inside functions and classes alike,
  and under `if TYPE_CHECKING:` too; relative imports are resolved against the importing module. `from P import name`
  imports the module `P.name` when that is a module, else `P`.
"""

from __future__ import annotations

import ast
import functools
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "src")
PACKAGE = "realm_hf"
# Modules outside the package that belong to its graph.
EXTRA_MODULES = ("realm_hf_cli", "realm_hf_cli_parser")


def package_modules(src: str = SRC, package: str = PACKAGE, extra=EXTRA_MODULES) -> dict[str, str]:
    """Module name -> file path, for every .py file under `src/package`, and the modules named in `extra`."""
    modules = {name: os.path.join(src, f"{name}.py") for name in extra}
    for directory, _dirs, files in os.walk(os.path.join(src, package)):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            parts = os.path.relpath(path, src)[: -len(".py")].split(os.sep)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def is_package(module: str, modules: dict[str, str]) -> bool:
    return modules[module].endswith("__init__.py")


@functools.cache
def parse(path: str) -> ast.Module:
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), path)


def imported_from(module: str, node: ast.ImportFrom, modules: dict[str, str]) -> str:
    """The absolute name of the module a `from ... import` statement of `module` imports from."""
    if not node.level:
        return node.module or ""
    base = module if is_package(module, modules) else module.rpartition(".")[0]
    anchor = base.split(".")
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def read_imports(module: str, modules: dict[str, str]) -> list[tuple[str, bool, int]]:
    """`(imported module, at module level, line)` for each import of `module` that lands on one of `modules`."""
    tree = parse(modules[module])
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = imported_from(module, node, modules)
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                targets.append(submodule if submodule in modules else source)
        for target in targets:
            # `import realm_hf.a.b` names a module; keep the longest prefix that is one.
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target:
                found.append((target, id(node) in top_level, node.lineno))
    return found


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of two or more nodes (Tarjan), each sorted."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(edges[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return components


def write_package(root, files: dict[str, str]) -> dict[str, str]:
    """Write `files` (relative path -> source) under `root` (a `pathlib.Path`); returns module name -> path."""
    modules = {}
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        parts = relative[: -len(".py")].split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = str(path)
    return modules
