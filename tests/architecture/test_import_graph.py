"""
No import cycles between the modules of realm_hf, read from the source with `ast` (nothing is imported; the modules
and their imports are `source_imports`': every import counts, inside functions and under `TYPE_CHECKING` too, since a
function-level import does not break a cycle, it only delays it).

The graph:

- Nodes are the modules under src/realm_hf, the console script src/realm_hf_cli.py and its parser
  src/realm_hf_cli_parser.py, which the package's CLI imports its parser, exit statuses and Hub id rule from.
- Every import is an edge. Python also runs every parent package of an imported module first; those implicit imports
  are not edges.
- Edges from a package `__init__` to modules inside that package are dropped: a package re-exporting its submodules
  is the normal layout (and the parent runs first whatever the child imports).

Three rules fail the test:

1. A cycle: a strongly connected component of two or more modules.
2. A module-level import, by a module, of its own ancestor package (`from . import name` in `realm_hf/x.py`) when
   that package's `__init__` imports the module (directly or through others). The dropped `__init__` edges would
   hide that cycle, and it is a real one: while the package's `__init__` imports the submodule, the package is
   half-initialised. (A module the package never imports, such as the `evaluate` metric script under
   `metrics/realm_qa/`, may import it.)
3. A module that cannot be the first one imported: replayed in Python's import order (parent packages first, the
   package re-exports included), one of its imports takes a name from a module that is still half-run ("cannot import
   name ... from partially initialized module"). The graph's rules cannot see every such case, since they drop the
   edges above; see `_ImportOrder`.

The layers these modules form, and the packages' own graph, are checked in `test_layers.py`.
"""

import ast
import functools

import pytest

from tests.architecture.source_imports import (
    find_cycles,
    is_package,
    package_modules,
    parse,
    read_imports,
    write_package,
)


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    """The edges (rule 1) and the module-level imports of an ancestor package (rule 2)."""
    modules = package_modules()
    edges: dict[str, set[str]] = {module: set() for module in modules}
    full: dict[str, set[str]] = {module: set() for module in modules}  # with the package re-exports
    ancestor_imports = []
    for module in modules:
        for target, module_level, _line in read_imports(module, modules):
            if target == module:
                continue
            full[module].add(target)
            if is_package(module, modules) and target.startswith(module + "."):
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


def test_the_graph_sees_relative_and_function_level_imports():
    edges, _ = _graph()
    assert "realm_hf.cli.common" in edges["realm_hf_cli"]  # the console script is in the graph
    assert "realm_hf.models.configuration_realm" in edges["realm_hf.models.modeling_openqa"]  # module level, relative
    assert "realm_hf.hub.repositories" in edges["realm_hf.models.retriever_owner"]  # function level
    assert "realm_hf.text.tokenizer_calls" in edges["realm_hf.training.ict"]  # two dots
    assert "realm_hf.metrics" in edges["realm_hf.metrics.realm_qa.realm_qa"]  # absolute
    assert "realm_hf.models.modeling_openqa" not in edges["realm_hf"]  # the package re-exporting its submodules


def test_no_import_cycles():
    edges, _ = _graph()
    cycles = find_cycles(edges)
    assert not cycles, "import cycles between modules of realm_hf:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_module_level_import_of_an_ancestor_package():
    _, ancestor_imports = _graph()
    assert not ancestor_imports, "\n".join(ancestor_imports)


@pytest.mark.parametrize("module", ["realm_hf.cli", "realm_hf.training.recipes"])
def test_owned_modules_are_in_no_cycle(module):
    edges, _ = _graph()
    members = {m for cycle in find_cycles(edges) for m in cycle}
    assert not {m for m in members if m == module or m.startswith(module + ".")}


# --- Import order: each module imported first, in a fresh interpreter -------------------------------------------------
#
# The graph above has no edge for a parent package run before its submodule, nor for a package `__init__` re-exporting
# its submodules, so it cannot see this cycle: `import realm_hf.a.x` runs `realm_hf.a`'s `__init__` first, which
# imports `realm_hf.b.y`, which runs `from realm_hf.a.x import name` while `realm_hf.a.x` has bound nothing yet
# ("cannot import name ... from partially initialized module"). Which modules are half-run depends on which one is
# imported first, so the simulation below replays Python's import order from the source (`ast`, nothing imported)
# once per module, taken as the first import of a fresh interpreter.
#
# What it follows: the module-level statements, in order (into `if`/`try`/`with` bodies and class bodies, not into
# functions, `if TYPE_CHECKING:` or `if __name__ == "__main__":`); a module's parent packages run before it, and the
# parent gets the submodule as an attribute once it has run; `from P import name` imports the submodule `P.name` when
# there is one and `P` has not bound `name`; a module being run has bound the names of its statements run so far.
# What it does not: imports inside functions called at import time, and names a module-level `__getattr__` resolves
# (a module defining one is taken to have every name). Modules outside the package are not followed.


class _PartialImport(Exception):
    pass


@functools.cache  # per node of the parsed (cached) trees: each module runs once per simulation
def _bound_names(node: ast.stmt) -> frozenset[str]:
    """The names a top-level statement binds in its module (not those inside function or class bodies)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return frozenset({node.name})
    names, todo = set(), [node]
    while todo:
        current = todo.pop()
        if isinstance(current, ast.Name) and isinstance(current.ctx, ast.Store):
            names.add(current.id)
        elif isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(current.name)
            continue
        elif isinstance(current, ast.Lambda):
            continue
        todo.extend(ast.iter_child_nodes(current))
    return frozenset(names)


def _runs_at_import(test: ast.expr) -> bool:
    text = ast.unparse(test)
    return "TYPE_CHECKING" not in text and "__main__" not in text


class _ImportOrder:
    """Python's import machinery for the package's modules, replayed from their source."""

    def __init__(self, modules: dict[str, str]):
        self.modules = modules
        self.bound: dict[str, set[str]] = {}  # sys.modules: module -> names bound so far
        self.running: list[str] = []  # modules being run, outermost first

    def import_module(self, module: str, why: str = "") -> None:
        if module in self.bound:
            return
        parent = module.rpartition(".")[0]
        if parent in self.modules:
            self.import_module(parent, f" (the package of {module})")
            if module in self.bound:  # the parent's `__init__` imported it
                return
        self.bound[module] = set()
        self.running.append(module + why)
        self._run(module, parse(self.modules[module]).body, self.bound[module])
        self.running.pop()
        if parent in self.modules:
            self.bound[parent].add(module.rpartition(".")[2])

    def _run(self, module: str, body: list[ast.stmt], names: set[str]) -> None:
        """Run `body`, a part of `module`, binding its names in `names` (the module's, or a class body's)."""
        for node in body:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    for i in range(1, len(parts) + 1):
                        if ".".join(parts[:i]) in self.modules:
                            self.import_module(".".join(parts[:i]))
                names |= {a.asname or a.name.partition(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                self._from_import(module, node, names)
            elif isinstance(node, ast.If):
                if _runs_at_import(node.test):
                    self._run(module, node.body, names)
                    self._run(module, node.orelse, names)
            elif isinstance(node, ast.Try):
                self._run(module, node.body + node.orelse + node.finalbody, names)
                names |= {n for h in node.handlers for s in h.body for n in _bound_names(s)}
            elif isinstance(node, (ast.With, ast.For, ast.While)):
                self._run(module, node.body, names)
                names |= _bound_names(node)
            elif isinstance(node, ast.ClassDef):
                self._run(module, node.body, set())  # a class body runs at import, in its own namespace
                names.add(node.name)
            else:
                names |= _bound_names(node)

    def _from_import(self, module: str, node: ast.ImportFrom, names: set[str]) -> None:
        if node.level:
            base = module if self.modules[module].endswith("__init__.py") else module.rpartition(".")[0]
            anchor = base.split(".")
            anchor = anchor[: len(anchor) - (node.level - 1)]
            source = ".".join(anchor + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        if source not in self.modules:  # outside the package
            names |= {a.asname or a.name for a in node.names if a.name != "*"}
            return
        self.import_module(source)
        for alias in node.names:
            if alias.name == "*":
                names |= {n for n in self.bound[source] if not n.startswith("_")}
                continue
            submodule = f"{source}.{alias.name}"
            if alias.name not in self.bound[source] and submodule in self.modules:
                self.import_module(submodule)
            found = alias.name in self.bound[source] or submodule in self.bound or "__getattr__" in self.bound[source]
            if not found:
                state = "partially initialized" if any(m.split()[0] == source for m in self.running) else "fully run"
                raise _PartialImport(
                    f"{module} runs `from {source} import {alias.name}` while {source} is {state} and has not bound "
                    f"{alias.name!r} (modules being run: {' -> '.join(self.running)})"
                )
            names.add(alias.asname or alias.name)


def _first_import_failures(modules: dict[str, str], firsts=None) -> dict[str, str]:
    """For each module imported first in a fresh interpreter, the import it fails on (modules that import cleanly are
    absent)."""
    failures = {}
    for first in sorted(firsts if firsts is not None else modules):
        try:
            _ImportOrder(modules).import_module(first)
        except _PartialImport as err:
            failures[first] = str(err)
    return failures


def test_import_order_finds_a_name_taken_from_a_half_run_module(tmp_path):
    # The shape of the real case: `pkg.a.x` imported first runs `pkg.b`'s `__init__` (through `pkg.b.y`'s parent),
    # which takes `X` from `pkg.a.x` before `pkg.a.x` has defined it.
    modules = write_package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a/__init__.py": "",
            "pkg/a/x.py": "from ..b.y import Y\n\nclass X(Y):\n    pass\n",
            "pkg/b/__init__.py": "from ..a.x import X\nfrom .y import Y\n",
            "pkg/b/y.py": "class Y:\n    pass\n",
        },
    )
    failures = _first_import_failures(modules)
    assert set(failures) == {"pkg.a.x"}  # imported after pkg.b has run, it finds Y; pkg.b first finds X too
    assert "from pkg.a.x import X while pkg.a.x is partially initialized" in failures["pkg.a.x"].replace("`", "")


def test_import_order_allows_what_python_allows(tmp_path):
    modules = write_package(
        tmp_path,
        {
            "pkg/__init__.py": "from . import a\nfrom .a import sub\n",
            # a half-run package gives its submodules (`from . import sub` imports it), and a name bound before
            "pkg/a/__init__.py": "EARLY = 1\nfrom . import sub\nfrom .sub import helper\n",
            "pkg/a/sub.py": "from . import EARLY\nfrom .. import a\n\ndef helper():\n    from ..late import LATE\n",
            # imports that never run at import time
            "pkg/late.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a.sub import nothing\n\n"
                "def f():\n    from .a import nothing\n\nLATE = 1\n"
            ),
        },
    )
    assert _first_import_failures(modules) == {}


def test_every_module_imports_first_in_a_fresh_interpreter():
    failures = _first_import_failures(package_modules())
    assert not failures, "\n".join(f"import {first}: {why}" for first, why in failures.items())
