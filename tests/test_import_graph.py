"""
No import cycles between the modules of realm_hf, read from the source with `ast` (nothing is imported).

The graph:

- Nodes are the modules under src/realm_hf (`pkg/__init__.py` is the module `pkg`), the console script
  src/realm_hf_cli.py (the module `realm_hf_cli`) and its parser src/realm_hf_cli_parser.py, which the package's CLI
  imports its parser, exit statuses and Hub id rule from.
- Every `import` and `from ... import` statement is an edge, at module level and inside functions and classes alike
  (a function-level import does not break a cycle, it only delays it); relative imports are resolved against the
  importing module. `from P import name` is an edge to the module `P.name` when that is a module, else to `P`.
  Imports under `if TYPE_CHECKING:` count too: they never run, but two modules that name each other's types are one
  concept split over two files all the same.
- Python also runs every parent package of an imported module first; those implicit imports are not edges.
- Edges from a package `__init__` to modules inside that package are dropped: a package re-exporting its submodules
  is the normal layout (and the parent runs first whatever the child imports).

Two rules fail the test:

1. A cycle: a strongly connected component of two or more modules.
2. A module-level import, by a module, of its own ancestor package (`from . import name` in `realm_hf/x.py`) when
   that package's `__init__` imports the module (directly or through others). The dropped `__init__` edges would
   hide that cycle, and it is a real one: while the package's `__init__` imports the submodule, the package is
   half-initialised. (A module the package never imports, such as the `evaluate` metric script under
   `metrics/realm_qa/`, may import it.)

`KNOWN_CYCLE_EDGES` lists the edges of the cycles that exist today in modules other engineers are changing; the test
stays green with them and fails on any cycle not made only of listed edges, and on a listed edge that is gone (so the
list shrinks as they are removed).
"""

import ast
import os

import pytest

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
PACKAGE = "realm_hf"

# Cycles being removed by the other parts of the "One core, no seams" issue; each edge closes one.
KNOWN_CYCLE_EDGES: set[tuple[str, str]] = set()


# Modules outside the package that belong to its graph.
EXTRA_MODULES = {name: os.path.join(SRC, f"{name}.py") for name in ("realm_hf_cli", "realm_hf_cli_parser")}


def _modules() -> dict[str, str]:
    """Module name -> file path, for every .py file under src/realm_hf, and the console script."""
    modules = dict(EXTRA_MODULES)
    for directory, _dirs, files in os.walk(os.path.join(SRC, PACKAGE)):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            parts = os.path.relpath(path, SRC)[: -len(".py")].split(os.sep)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _is_package(module: str, modules: dict[str, str]) -> bool:
    return modules[module].endswith("__init__.py")


def _imports(module: str, modules: dict[str, str]) -> list[tuple[str, bool]]:
    """`(imported module, at module level)` for each import of `module` that lands inside the package."""
    with open(modules[module], encoding="utf-8") as f:
        tree = ast.parse(f.read(), modules[module])
    top_level = {id(node) for node in tree.body}
    base = module if _is_package(module, modules) else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                source = ".".join(anchor + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                targets.append(submodule if submodule in modules else source)
        for target in targets:
            # `import realm_hf.a.b` names a module; keep the longest prefix that is one.
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target:
                found.append((target, id(node) in top_level))
    return found


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    """The edges (rule 1) and the module-level imports of an ancestor package (rule 2)."""
    modules = _modules()
    edges: dict[str, set[str]] = {module: set() for module in modules}
    full: dict[str, set[str]] = {module: set() for module in modules}  # with the package re-exports
    ancestor_imports = []
    for module in modules:
        for target, module_level in _imports(module, modules):
            if target == module:
                continue
            full[module].add(target)
            if _is_package(module, modules) and target.startswith(module + "."):
                continue  # a package importing its own submodules
            if module.startswith(target + ".") and module_level:
                ancestor_imports.append((module, target))
            edges[module].add(target)
    hazards = [
        f"{module} imports its package {package} at module level, and the package imports it"
        for module, package in ancestor_imports
        if module in _reachable(full, package)
    ]
    return edges, hazards


def _reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for succ in edges[todo.pop()]:
            if succ not in seen:
                seen.add(succ)
                todo.append(succ)
    return seen


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of two or more modules (Tarjan)."""
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


def test_the_graph_sees_relative_and_function_level_imports():
    edges, _ = _graph()
    assert "realm_hf.cli.common" in edges["realm_hf_cli"]  # the console script is in the graph
    assert "realm_hf.models.configuration_realm" in edges["realm_hf.models.modeling_openqa"]  # module level, relative
    assert "realm_hf.hub.repositories" in edges["realm_hf.models.retriever_owner"]  # function level
    assert "realm_hf.models.tokenization_realm" in edges["realm_hf.training.ict"]  # two dots
    assert "realm_hf.metrics" in edges["realm_hf.metrics.realm_qa.realm_qa"]  # absolute
    assert "realm_hf.models.modeling_openqa" not in edges["realm_hf"]  # the package re-exporting its submodules


def test_no_new_import_cycles():
    edges, _ = _graph()
    for source, target in KNOWN_CYCLE_EDGES:
        assert target in edges[source], f"{source} -> {target} is gone: remove it from KNOWN_CYCLE_EDGES"
    allowed = {source: targets - {t for s, t in KNOWN_CYCLE_EDGES if s == source} for source, targets in edges.items()}
    cycles = _cycles(allowed)
    assert not cycles, "import cycles between modules of realm_hf:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_known_cycles_are_exactly_the_allow_list():
    """The listed edges close the cycles that exist today, and nothing else: a new cycle through them fails too."""
    edges, _ = _graph()
    cycles = _cycles(edges)
    assert sorted(cycles) == [], cycles


def test_no_module_level_import_of_an_ancestor_package():
    _, ancestor_imports = _graph()
    assert not ancestor_imports, "\n".join(ancestor_imports)


@pytest.mark.parametrize("module", ["realm_hf.cli", "realm_hf.training.recipes"])
def test_owned_modules_are_in_no_cycle(module):
    edges, _ = _graph()
    members = {m for cycle in _cycles(edges) for m in cycle}
    assert not {m for m in members if m == module or m.startswith(module + ".")}
