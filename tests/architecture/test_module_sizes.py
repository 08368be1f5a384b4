"""
Modules split where their concepts split: no module of the package over `MAX_MODULE_LINES` lines (data/, which holds
question sets and dictionary parsing, aside), and `RealmRetriever` one concept, a coordinator over its store of at most
`MAX_RETRIEVER_LINES` lines and `MAX_RETRIEVER_NAMES` public methods and properties. Read from the source with `ast`
(nothing is imported).
"""

import ast
import os

from tests.architecture import source_imports

SRC = os.path.join(source_imports.SRC, source_imports.PACKAGE)

MAX_MODULE_LINES = 600
# Folders whose modules are data more than code.
EXEMPT_FOLDERS = ("data",)
MAX_RETRIEVER_LINES = 400
MAX_RETRIEVER_NAMES = 20


def long_modules(root: str = SRC, limit: int = MAX_MODULE_LINES) -> dict[str, int]:
    """`{path relative to root: lines}` of the modules over `limit` lines, outside `EXEMPT_FOLDERS`."""
    found = {}
    for folder, _, files in os.walk(root):
        relative = os.path.relpath(folder, root).replace(os.sep, "/")
        if relative.split("/")[0] in EXEMPT_FOLDERS:
            continue
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    lines = sum(1 for _ in f)
                if lines > limit:
                    found[os.path.relpath(path, root).replace(os.sep, "/")] = lines
    return found


def class_surface(path: str, name: str) -> tuple[int, list[str]]:
    """The line count of class `name` in `path` and its public methods and properties (dunders aside)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    (cls,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name]
    public = [
        node.name
        for node in cls.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_")
    ]
    return cls.end_lineno - cls.lineno + 1, public


def test_no_module_is_over_the_line_limit():
    found = long_modules()
    assert not found, (
        f"modules over {MAX_MODULE_LINES} lines: {found}. Split each where its concepts split (not into a single-use "
        "mixin or functions that take the object from another file)."
    )


def test_the_retriever_is_one_concept():
    lines, public = class_surface(os.path.join(SRC, "retrieval", "retriever.py"), "RealmRetriever")
    assert lines <= MAX_RETRIEVER_LINES, f"RealmRetriever has {lines} lines (at most {MAX_RETRIEVER_LINES})"
    assert len(public) <= MAX_RETRIEVER_NAMES, (
        f"RealmRetriever has {len(public)} public methods and properties (at most {MAX_RETRIEVER_NAMES}): {public}"
    )


def test_the_checks_see_a_long_module_and_a_wide_class(tmp_path):
    (tmp_path / "big.py").write_text("x = 1\n" * 5)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "questions.py").write_text("x = 1\n" * 5)
    assert long_modules(str(tmp_path), limit=4) == {"big.py": 5}
    methods = "".join(f"    def m{i}(self):\n        pass\n" for i in range(3))
    (tmp_path / "wide.py").write_text(f"class Wide:\n    @property\n    def p(self):\n        pass\n{methods}")
    assert class_surface(str(tmp_path / "wide.py"), "Wide") == (10, ["p", "m0", "m1", "m2"])
