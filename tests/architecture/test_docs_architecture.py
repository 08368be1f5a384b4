"""docs/architecture.md is the map a new contributor reads first: it must name every module of the package."""

import os

from tests.architecture.source_imports import ROOT

PACKAGE = os.path.join(ROOT, "src", "realm_hf")


def package_modules() -> list[str]:
    modules = []
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.relpath(os.path.join(folder, name), PACKAGE).replace(os.sep, "/")
                modules.append(path)
    return sorted(modules)


def test_architecture_names_every_module():
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
        text = f.read()
    missing = [m for m in package_modules() if f"`{m}`" not in text and not m.endswith("__init__.py")]
    assert not missing, f"docs/architecture.md does not describe: {missing}"
    # And names nothing that no longer exists.
    named = {word.strip("`") for word in text.split() if word.startswith("`") and word.rstrip("`,.:;").endswith(".py")}
    named = {name.rstrip("`,.:;") for name in named}
    stale = [name for name in named if "/" in name or name.count(".") == 1]
    stale = [name for name in stale if not os.path.exists(os.path.join(PACKAGE, name))]
    stale = [name for name in stale if not os.path.exists(os.path.join(ROOT, name))]
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"
