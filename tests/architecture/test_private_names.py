"""
An underscore means "only this module": no module of realm-hf takes another module's private name, neither through
`from module import _name` nor as `module._name`. What several modules share is public in its module (named and
documented) or lives where it is used. Read from the source with `ast` (nothing is imported); dunder names
(`__version__`, `__all__`) are not private.
"""

import ast

from tests.architecture.source_imports import imported_from, package_modules, parse, write_package


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_names(module: str, tree: ast.Module, modules: dict[str, str]) -> dict[str, str]:
    """The names that stand for a module of the package in `module` (`import a.b as c`, `from a import b`)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in modules:
                    names[alias.asname] = alias.name
                elif not alias.asname and alias.name.split(".")[0] in modules:
                    names[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            source = imported_from(module, node, modules)
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    names[alias.asname or alias.name] = f"{source}.{alias.name}"
    return names


def _dotted(node: ast.expr) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def private_uses(modules: dict[str, str]) -> list[str]:
    """`module:line` and what it takes, for every private name a module takes from another module of `modules`."""
    found = []
    for module, path in sorted(modules.items()):
        tree = parse(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = imported_from(module, node, modules)
                if source not in modules:
                    continue
                for alias in node.names:
                    if _is_private(alias.name) and f"{source}.{alias.name}" not in modules:
                        found.append(f"{module}:{node.lineno} takes {source}.{alias.name}")
        names = _module_names(module, tree, modules)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not _is_private(node.attr):
                continue
            dotted = _dotted(node.value)
            if not dotted or dotted[0] not in names:
                continue
            # `realm_hf.a.b._x`: the longest prefix of the chain that is a module is where `_x` lives.
            chain = names[dotted[0]].split(".") + dotted[1:]
            owner = next(
                (".".join(chain[:i]) for i in range(len(chain), 0, -1) if ".".join(chain[:i]) in modules), None
            )
            if owner is not None and owner == ".".join(chain) and owner != module:
                found.append(f"{module}:{node.lineno} takes {owner}.{node.attr}")
    return found


def test_no_module_takes_another_modules_private_names():
    found = private_uses(package_modules())
    assert not found, (
        "private names used across modules: make the name public in its module (named, with a docstring) or move it "
        "to where it is used:\n" + "\n".join(found)
    )


def test_the_check_sees_private_names_taken(tmp_path):
    modules = write_package(
        tmp_path,
        {
            "pkg/__init__.py": "__version__ = '1'\n",
            "pkg/a.py": "_HINT = 'x'\n\n\ndef _helper():\n    return _HINT\n\n\ndef public():\n    return _helper()\n",
            "pkg/b.py": "from .a import _helper\n",  # a private function
            "pkg/c.py": "from . import a\n\n\ndef f():\n    return a._HINT\n",  # module attribute
            "pkg/d.py": "import pkg.a\n\nX = pkg.a._HINT\n",  # through the dotted module path
            "pkg/e.py": "import pkg.a as alias\n\nY = alias._helper\n",
            "pkg/ok.py": (
                "from . import __version__\nfrom .a import public\n\n\nclass K:\n    _own = 1\n\n"
                "    def m(self):\n        return self._own, public()\n"
            ),
        },
    )
    assert private_uses(modules) == [
        "pkg.b:1 takes pkg.a._helper",
        "pkg.c:5 takes pkg.a._HINT",
        "pkg.d:3 takes pkg.a._HINT",
        "pkg.e:3 takes pkg.a._helper",
    ]
