"""The scripts of bench/ (and examples/) loaded as modules, and the tiny BERT the benches take as `--bert`."""

import importlib.util
import os
import sys

from tests.support.paths import REPO
from tests.support.tiny_bert import save_tiny_bert


def load_script(name, folder="bench"):
    path = os.path.join(REPO, folder, f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"{folder}_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def tiny_bert(tmp_path, max_positions: int = 160, seed: int | None = None):
    """A tiny random BERT checkpoint with the test vocabulary (the benches' --bert); `seed` fixes its weights."""
    return save_tiny_bert(tmp_path / "bert", max_positions=max_positions, seed=seed)
