"""
Saved directories name realm-hf module paths in files that outlive any release: the `realm_pipeline.py` and
`realm_hf_auto.py` written next to a saved model. Those paths must keep importing whatever the package layout becomes.
"""

import ast
import importlib
import importlib.util

import pytest

import realm_hf
from realm_hf.io.auto_map import write_auto_module
from realm_hf.pipelines import write_pipeline_module

# What the files written so far import (a saved directory keeps its copy: these strings are the contract).
SAVED_IMPORTS = [
    ("realm_hf.pipeline_realm", "RealmQuestionAnsweringPipeline"),
    *(
        ("realm_hf", name)
        for name in (
            "RealmConfig",
            "RealmEmbedder",
            "RealmForOpenQA",
            "RealmForPreTraining",
            "RealmKnowledgeAugEncoder",
            "RealmReader",
            "RealmScorer",
            "RealmTokenizer",
            "RealmTokenizerFast",
        )
    ),
]


@pytest.mark.parametrize(("module", "name"), SAVED_IMPORTS)
def test_module_paths_named_by_saved_directories_still_import(module, name):
    assert getattr(importlib.import_module(module), name) is getattr(realm_hf, name)


@pytest.mark.parametrize("write", [write_pipeline_module, write_auto_module])
def test_written_modules_import_only_kept_paths(write, tmp_path):
    path = write(tmp_path)
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    imported = {
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("realm_hf")
        for alias in node.names
    }
    assert imported and imported <= set(SAVED_IMPORTS), imported - set(SAVED_IMPORTS)
    spec = importlib.util.spec_from_file_location(f"saved_{tmp_path.name}", path)
    saved = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(saved)
    for _module, name in imported:
        assert getattr(saved, name) is getattr(realm_hf, name)
