"""The README's quickstart runs as written (on the tiny legacy fixture instead of a real model directory)."""

import os
import re
import textwrap

import pytest

from tests.support.paths import LEGACY_OPENQA, REPO

README = os.path.join(REPO, "README.md")


def python_blocks(text):
    # Blocks inside list items are indented as a whole.
    return [textwrap.dedent(block) for block in re.findall(r"```python\n(.*?)```", text, flags=re.S)]


def test_quickstart_runs(tmp_path, monkeypatch):
    with open(README) as f:
        blocks = python_blocks(f.read())
    quickstart = next(block for block in blocks if "RealmRetriever.from_documents" in block)
    assert '"path/to/realm-model"' in quickstart
    code = quickstart.replace('"path/to/realm-model"', repr(os.path.abspath(LEGACY_OPENQA)))
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(code, "README.md quickstart", "exec"), namespace)
    # It saved a complete model directory and the pipeline answered from it with provenance.
    assert (tmp_path / "my-realm" / "retriever").is_dir()
    qa = namespace["qa"]
    answers = qa("who developed unix?", top_k=3)
    assert 1 <= len(answers) <= 3
    assert all(answer["block"]["title"] in ("Compiler", "Unix") for answer in answers)
    context_answer = qa(question="who developed unix?", context="Unix was written by Ken Thompson and Dennis Ritchie.")
    assert context_answer["answer"] in "Unix was written by Ken Thompson and Dennis Ritchie."


@pytest.mark.parametrize("doc", ["docs/training.md", "docs/pipeline.md", "docs/cli.md"])
def test_docs_python_blocks_compile(doc):
    with open(os.path.join(REPO, doc)) as f:
        for i, block in enumerate(python_blocks(f.read())):
            compile(block, f"{doc} block {i}", "exec")
