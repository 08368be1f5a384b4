"""
The packages of realm-hf lean one way: `LAYERS` lists them lowest first, and a module may import only its own unit (the
package or top-level module it belongs to) and the units of lower layers, never a higher layer nor another unit of its
own layer. Every import counts (`source_imports`: at module level, inside functions, under `TYPE_CHECKING`; the console
script and its parser are the `cli` unit): an import moved into a function to dodge a cycle is still the cycle.

Python runs every parent package of an imported module first, so `from realm_hf.io.atomic import atomic_write` runs
`realm_hf/__init__.py`, which imports the models; those implicit imports are not edges (the root registers, it is not
a dependency). The same table is in docs/architecture.md ("Layers"), and this test holds the two equal.
"""

import os
import re

import pytest

from tests.architecture.source_imports import ROOT, find_cycles, package_modules, read_imports, write_package

# Lowest first. Each layer is a tuple of units: a top-level module (`constants`) or a package (`retrieval`); the root
# package `realm_hf` is its `__init__` (the registration).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("constants", "logging_utils", "version"),
    ("io", "metrics", "precision", "progress"),
    ("text",),
    ("hub",),
    ("retrieval",),
    ("models",),
    ("data", "pipelines", "training"),
    ("serving",),
    ("cli",),
    ("realm_hf", "pipeline_realm"),
)


def unit_of(module: str) -> str:
    """The unit a module belongs to: its package or top-level module under `realm_hf` (the console script: `cli`)."""
    if module in ("realm_hf_cli", "realm_hf_cli_parser"):
        return "cli"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def unit_imports(modules: dict[str, str]) -> dict[tuple[str, str], list[str]]:
    """`(importing unit, imported unit)` -> the imports (`module:line -> module`) that make that edge."""
    found: dict[tuple[str, str], list[str]] = {}
    for module in modules:
        for target, _module_level, line in read_imports(module, modules):
            source_unit, target_unit = unit_of(module), unit_of(target)
            if source_unit != target_unit:
                found.setdefault((source_unit, target_unit), []).append(f"{module}:{line} -> {target}")
    return found


def layer_violations(modules: dict[str, str], layers=LAYERS) -> list[str]:
    """Every import against the order of `layers`, and every unit of `modules` that no layer places."""
    rank = {unit: i for i, layer in enumerate(layers) for unit in layer}
    units = {unit_of(module) for module in modules}
    problems = [
        f"{unit} is in no layer: add it to LAYERS and to docs/architecture.md" for unit in sorted(units - set(rank))
    ]
    for (source, target), where in sorted(unit_imports(modules).items()):
        if source not in rank or target not in rank:
            continue
        if rank[target] > rank[source]:
            why = f"{source} (layer {rank[source] + 1}) imports {target}, a higher layer (layer {rank[target] + 1})"
        elif rank[target] == rank[source]:
            why = f"{source} imports {target}, another unit of its own layer (layer {rank[source] + 1})"
        else:
            continue
        problems.append(f"{why}: {'; '.join(where)}")
    return problems


def unit_cycles(modules: dict[str, str]) -> list[list[str]]:
    edges: dict[str, set[str]] = {unit_of(module): set() for module in modules}
    for source, target in unit_imports(modules):
        edges[source].add(target)
    return find_cycles(edges)


def documented_layers() -> tuple[tuple[str, ...], ...]:
    """The layer table of docs/architecture.md: rows `| n | `unit`, `unit` | ... |` under its "## Layers" heading."""
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| *(\d+) *\| *([^|]+)\|", section, flags=re.MULTILINE)
    assert [int(number) for number, _ in rows] == list(range(1, len(rows) + 1)), rows
    return tuple(tuple(re.findall(r"`([\w.]+?)(?:/|\.py)?`", units)) for _, units in rows)


def test_every_import_follows_the_layers():
    problems = layer_violations(package_modules())
    assert not problems, "imports against the layers (tests/architecture/test_layers.py):\n" + "\n".join(problems)


def test_no_package_level_cycle():
    cycles = unit_cycles(package_modules())
    assert not cycles, "packages that import each other:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_every_layer_unit_exists():
    units = {unit_of(module) for module in package_modules()}
    assert not [unit for layer in LAYERS for unit in layer if unit not in units]


def test_docs_architecture_shows_the_same_layers():
    assert documented_layers() == LAYERS


LOW, HIGH = (("low",), ("high", "peer"))


@pytest.mark.parametrize(
    ("source", "planted"),
    [
        ("low/a.py", "from ..high import b\n"),  # upwards, at module level
        ("low/a.py", "def f():\n    from ..high.b import g\n"),  # upwards, inside a function
        ("low/a.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.high.b\n"),
        ("high/b.py", "from ..peer import c\n"),  # sideways, within a layer
    ],
)
def test_the_check_sees_an_import_against_the_layers(tmp_path, source, planted):
    files = {
        "pkg/__init__.py": "from .high import b\n",  # the root importing everything is no edge of its own
        "pkg/low/__init__.py": "",
        "pkg/low/a.py": "X = 1\n",
        "pkg/high/__init__.py": "",
        "pkg/high/b.py": "from ..low.a import X\n",
        "pkg/peer/__init__.py": "",
        "pkg/peer/c.py": "",
    }
    layers = (LOW, HIGH, ("pkg",))
    modules = write_package(tmp_path / "clean", files)
    assert layer_violations(modules, layers) == [] and unit_cycles(modules) == []
    modules = write_package(tmp_path / "planted", files | {f"pkg/{source}": files[f"pkg/{source}"] + planted})
    problems = layer_violations(modules, layers)
    assert len(problems) == 1 and source.split("/")[0] in problems[0], problems
    if "peer" not in planted:
        assert unit_cycles(modules) == [["high", "low"]]


def test_the_check_sees_a_unit_in_no_layer(tmp_path):
    modules = write_package(tmp_path, {"pkg/__init__.py": "", "pkg/low/__init__.py": "", "pkg/stray.py": ""})
    assert layer_violations(modules, (LOW, ("pkg",))) == [
        "stray is in no layer: add it to LAYERS and to docs/architecture.md"
    ]
