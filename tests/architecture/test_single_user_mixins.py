"""
A mixin is a capability several classes share (transformers' `PushToHubMixin`), not half of one class moved to another
file: every class named `*Mixin`, and every realm-hf class used as a base, must have at least two subclasses in the
package, unless `SINGLE_USER_BASES` names it with the reason. Read from the source with `ast` (nothing is imported).
"""

import ast
import os
import sys
from collections import defaultdict

from tests.architecture import source_imports

SRC = os.path.join(source_imports.SRC, source_imports.PACKAGE)

# Base classes with one subclass on purpose, and why.
SINGLE_USER_BASES: dict[str, str] = {
    "RealmTokenizer": "RealmTokenizerFast is an alias of it under the legacy fast-tokenizer name (transformers 5 has "
    "one tokenizer class), not a second user",
}


def _base_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):  # Generic[T]-style bases
        return _base_name(node.value)
    return None


def _classes() -> tuple[dict[str, str], dict[str, set[str]]]:
    """Classes defined in the package (name -> file) and, for each base class name, the classes built on it."""
    defined, users = {}, defaultdict(set)
    for folder, _, files in os.walk(SRC):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    defined[node.name] = os.path.relpath(path, SRC)
                    for base in node.bases:
                        base_name = _base_name(base)
                        if base_name is not None:
                            users[base_name].add(node.name)
    return defined, users


def single_user_bases() -> dict[str, set[str]]:
    defined, users = _classes()
    found = {}
    for name in defined:
        subclasses = users.get(name, set())
        is_mixin = name.endswith("Mixin")
        if (is_mixin and len(subclasses) < 2) or (not is_mixin and len(subclasses) == 1):
            found[name] = subclasses
    return found


def test_every_mixin_and_base_class_has_several_users():
    found = {name: users for name, users in single_user_bases().items() if name not in SINGLE_USER_BASES}
    assert not found, (
        "base classes with a single user (one class split over files, or a mixin nothing else uses): "
        + "; ".join(f"{name} (used by {sorted(users) or 'nothing'})" for name, users in sorted(found.items()))
        + ". Merge it into its class, or list it in SINGLE_USER_BASES with the reason."
    )


def test_listed_exceptions_still_exist_and_still_have_one_user():
    found = single_user_bases()
    stale = [name for name in SINGLE_USER_BASES if name not in found]
    assert not stale, f"SINGLE_USER_BASES lists classes that no longer have a single user: {stale}"


def test_the_check_sees_a_single_user_mixin(tmp_path, monkeypatch):
    (tmp_path / "split.py").write_text("class HalfMixin:\n    pass\n\n\nclass Whole(HalfMixin):\n    pass\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", str(tmp_path))
    assert single_user_bases() == {"HalfMixin": {"Whole"}}
