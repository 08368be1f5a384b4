"""
`BlockIndex` (retrieval/index.py) owns the `faiss.Index`: it adds, removes, searches, saves and loads, and the rest of
the package goes through it (the FAISS helpers it is built on live beside it, in retrieval/faiss_build.py and
retrieval/faiss_ops.py). Read from the source with `ast` (nothing is imported): a module that imports faiss or
names `faiss` must be listed in `FAISS_USERS` with the reason.

The legacy conversion (`retrieval/conversion.py`, `realm-hf convert`) writes its FAISS index through
`BlockIndex.write_streamed`. Two other modules of retrieval/ name faiss; the list is what is true, and it only shrinks.
"""

import ast
import os
import sys

from tests.architecture import source_imports

SRC = os.path.join(source_imports.SRC, source_imports.PACKAGE)

FAISS_USERS: dict[str, str] = {
    "retrieval/index.py": "BlockIndex: the owner",
    "retrieval/faiss_build.py": "the helpers BlockIndex builds its indexes with (factory strings, training, adding)",
    "retrieval/faiss_ops.py": "the helpers BlockIndex handles its index with (search parameters, GPU, files, labels)",
    "retrieval/retriever.py": "`faiss.Index` in type annotations and the docstring of an argument that takes a raw index",
    "retrieval/manifest.py": "records `faiss.__version__` in the manifest",
}


def _names_faiss(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(alias.name.split(".")[0] == "faiss" for alias in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "faiss" and not node.level:
            return True
        if isinstance(node, ast.Name) and node.id == "faiss":
            return True
    return False


def faiss_users() -> set[str]:
    found = set()
    for folder, _, files in os.walk(SRC):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    if _names_faiss(ast.parse(f.read(), path)):
                        found.add(os.path.relpath(path, SRC).replace(os.sep, "/"))
    return found


def test_only_listed_modules_touch_faiss():
    unlisted = sorted(faiss_users() - set(FAISS_USERS))
    assert not unlisted, (
        f"{unlisted} use faiss directly: go through BlockIndex (retrieval/index.py), adding to its API what is "
        "missing, or list the module in FAISS_USERS with the reason."
    )


def test_the_conversion_goes_through_block_index():
    assert "retrieval/conversion.py" not in faiss_users()


def test_the_check_sees_faiss(tmp_path, monkeypatch):
    (tmp_path / "a.py").write_text("import faiss\n")
    (tmp_path / "b.py").write_text("def f(index):\n    return faiss.write_index(index, 'x')\n")
    (tmp_path / "c.py").write_text("from faiss import IndexFlatIP\n")
    (tmp_path / "d.py").write_text("from .index import BlockIndex  # not faiss\nx = 'faiss.write_index'\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", str(tmp_path))
    assert faiss_users() == {"a.py", "b.py", "c.py"}
